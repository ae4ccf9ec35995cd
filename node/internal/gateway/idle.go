package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
)

// The idle check stops this WireGuard gateway when it has been idle for idle.stop: no instance of the stack's node
// pools pending or running (EC2 DescribeInstances on the pools' tags, the one call the gateway role may make), and
// no packet forwarded through wg0 (the named counters of the gateway's nftables table). dynk8s-gateway-idle.timer
// runs it once a minute. The instance's shutdown behaviour is "stop", so `systemctl poweroff` stops it, and the
// first node that boots starts it again (wake-gateway). Every run logs its decision; a question without an answer
// keeps the gateway up.
//
// Why the forward counters and not WireGuard's own: `wg show wg0 transfer` and `latest-handshakes` keep moving on an
// idle tunnel, as both ends send a keepalive every 25 s (PersistentKeepalive) and re-handshake every two minutes while
// they do. Keepalives and handshakes are the gateway's own UDP packets, never forwarded, so a forward counter that did
// not move means that nothing crossed between the VPC and on-prem.
//
// The state lives in /run (tmpfs): a boot starts a fresh window, so a gateway a node just started stays up at least
// idle.stop.

// idleStateFile holds "<last active, Unix seconds> <packet total then, -1: unknown>".
const idleStateFile = "gateway-idle.state"

// maxIdlePages bounds DescribeInstances' pages: pages without end are no answer.
const maxIdlePages = 20

// idleState is when the gateway was last seen in use, and the forward counters' packet total then (-1: unknown).
type idleState struct {
	lastActive int64
	packets    int64
}

func (g *gatewayRun) Idle(ctx context.Context) error {
	idle := g.cfg.Idle
	if idle == nil {
		g.log.Printf("the gateway never sleeps (gateway.idleStop 0): nothing to check")
		return nil
	}
	g.newClock(g.cfg.Deadlines.Idle.D())
	now := g.now().Unix()
	path := g.files.Run(idleStateFile)
	state := g.readIdleState(path, now)

	if err := g.clock.Retry(ctx, g.log, "read the region and the partition's domain from IMDS", g.connect); err != nil {
		return err
	}
	var pool []string
	var last error
	if err := g.clock.Retry(ctx, g.log, "list the pool instances of cluster "+idle.ClusterName, func(ctx context.Context) error {
		pool, last = g.poolInstances(ctx)
		return last
	}); err != nil {
		return fmt.Errorf("cannot tell whether a pool instance runs (%w); the gateway stays up", last)
	}
	packets, err := g.forwardedPackets(ctx)
	if err != nil {
		return err
	}

	var busy []string
	if len(pool) > 0 {
		busy = append(busy, "pool instances "+strings.Join(pool, " "))
	}
	if packets >= 0 && packets != state.packets {
		busy = append(busy, fmt.Sprintf("packets forwarded through wg0 (counter %d -> %d)", state.packets, packets))
	}
	if len(busy) > 0 {
		state.lastActive = now
	}
	idleFor := now - state.lastActive
	limit := int64(idle.Stop.D() / time.Second)
	state.packets = packets
	if err := g.writeIdleState(path, state); err != nil {
		return err
	}

	switch {
	case len(busy) > 0:
		g.log.Printf("staying up: %s", strings.Join(busy, " "))
	case idleFor < limit:
		g.log.Printf("staying up: idle for %ds of %ds (no pool instance pending or running, no packet forwarded)",
			idleFor, limit)
	default:
		g.log.Printf("stopping: idle for %ds (limit %ds): no pool instance pending or running and no packet forwarded "+
			"through wg0; a booting node starts the gateway again", idleFor, limit)
		if g.host.Run(ctx, time.Minute, false, "systemctl", "poweroff") != nil {
			return errors.New("systemctl poweroff failed")
		}
	}
	return nil
}

// readIdleState reads the state a run of this boot left; none (a fresh boot) or a malformed one starts the window
// now.
func (g *gatewayRun) readIdleState(path string, now int64) idleState {
	fresh := idleState{lastActive: now, packets: -1}
	b, err := os.ReadFile(path)
	if err != nil {
		return fresh
	}
	f := strings.Fields(string(b))
	var s idleState
	var errA, errP error
	if len(f) == 2 {
		s.lastActive, errA = strconv.ParseInt(f[0], 10, 64)
		s.packets, errP = strconv.ParseInt(f[1], 10, 64)
	}
	if len(f) != 2 || errA != nil || errP != nil || s.lastActive < 0 || s.packets < -1 {
		g.log.Printf("ignoring malformed state in %s; the idle window starts now", path)
		return fresh
	}
	return s
}

func (g *gatewayRun) writeIdleState(path string, s idleState) error {
	if g.dryRun {
		return nil
	}
	if err := writePrivate(path, fmt.Appendf(nil, "%d %d\n", s.lastActive, s.packets)); err != nil {
		return fmt.Errorf("write the idle state %s: %w", path, err)
	}
	return nil
}

// poolInstances are the stack's pool instances that are pending or running, as "<id> (<state>)". Pool instances
// carry dynk8s:cluster and dynk8s:pool (the gateway has no pool tag); the states are filtered by EC2 and again here.
// One instance is enough to stay up, so it reads pages until one shows an instance or no NextToken is left: a
// filtered page may be empty while more follow ("Pagination in the Amazon EC2 API", EC2 developer guide).
func (g *gatewayRun) poolInstances(ctx context.Context) ([]string, error) {
	in := &ec2.DescribeInstancesInput{MaxResults: aws.Int32(5), Filters: []ec2types.Filter{
		{Name: aws.String("tag:" + names.TagCluster), Values: []string{g.cfg.Idle.ClusterName}},
		{Name: aws.String("tag-key"), Values: []string{names.TagPool}},
		{Name: aws.String("instance-state-name"), Values: []string{"pending", "running"}},
	}}
	for range maxIdlePages {
		out, err := g.describe(ctx, in)
		if err != nil {
			return nil, err
		}
		var found []string
		for _, r := range out.Reservations {
			for _, i := range r.Instances {
				if i.State == nil {
					continue
				}
				if s := i.State.Name; s == ec2types.InstanceStateNamePending || s == ec2types.InstanceStateNameRunning {
					found = append(found, fmt.Sprintf("%s (%s)", aws.ToString(i.InstanceId), s))
				}
			}
		}
		if len(found) > 0 || aws.ToString(out.NextToken) == "" {
			return found, nil
		}
		in.NextToken = out.NextToken
	}
	return nil, fmt.Errorf("EC2 DescribeInstances: still a NextToken after %d pages", maxIdlePages)
}

func (g *gatewayRun) describe(ctx context.Context, in *ec2.DescribeInstancesInput) (*ec2.DescribeInstancesOutput, error) {
	ctx, cancel := context.WithTimeout(ctx, g.clock.Timeout(10*time.Second))
	defer cancel()
	out, err := g.cloud.EC2.DescribeInstances(ctx, in)
	if err != nil {
		g.cloud.Forget(err)
		return nil, cloud.APIError("EC2 DescribeInstances", err)
	}
	return out, nil
}

// nftCounters is what `nft -j list counters` prints (libnftables-json(5)): objects of which the counters are those
// with a "counter" member.
type nftCounters struct {
	Nftables []struct {
		Counter *struct {
			Packets int64 `json:"packets"`
		} `json:"counter"`
	} `json:"nftables"`
}

// forwardedPackets is the packets forwarded into and out of wg0 so far, or -1 when the table is not loaded (the
// tunnel is down, so nothing can cross it).
func (g *gatewayRun) forwardedPackets(ctx context.Context) (int64, error) {
	table := g.cfg.Idle.NFTTable
	out, err := g.host.Output(ctx, g.clock.Timeout(10*time.Second), "nft", "-j", "list", "counters", "table", "inet", table)
	if err != nil {
		return -1, nil
	}
	var doc nftCounters
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return 0, fmt.Errorf("nft's counters in table inet %s are not JSON: %w", table, err)
	}
	var sum int64
	n := 0
	for _, e := range doc.Nftables {
		if e.Counter != nil {
			sum += e.Counter.Packets
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("nft lists no counters in table inet %s", table)
	}
	return sum, nil
}

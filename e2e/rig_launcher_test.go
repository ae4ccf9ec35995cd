//go:build e2e

package e2e

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// launcher plays EC2 for the boxes: each instance moto starts in the watched group gets a box that boots the
// pool's user data, with that instance's id, zone, private IP and Auto Scaling lifecycle state in its fake IMDS; a
// box whose instance moto stops or terminates is powered off, and booted again (a start of the same instance) when
// moto runs it again. A volume moto attaches to a running instance appears in its box (rig_volumes_test.go).
//
// With a warm pool (prepareWarm), the launcher also plays the group's warm pool: the first instance moto launches
// for new capacity is replaced by the warm one, which enters service (enterService).
//
// With a VPC (boxJoin.vpc), the launcher also plays EC2 for its gateway: moto's start of the gateway instance (a
// node's wake-up call) boots the gateway's box, and the box's powering itself off (the idle check's poweroff, with
// the instance's shutdown behaviour "stop") stops the instance in moto.
type launcher struct {
	aws      *awsEnv
	join     *boxJoin
	group    string
	archives []string
	boxes    map[string]*boxNode
	// stopping: the instances whose boxes have been told to power off and still run.
	stopping map[string]bool
	// gatewayBooted: the gateway's box was booted for the instance's current run.
	gatewayBooted bool
	// volumes: the EBS volumes moto attaches to the instances (rig_volumes_test.go).
	volumes *volumeStore
	// warm: the instance waiting in the group's warm pool, nil for none.
	warm *warmInstance
	// image: the baked image the group's instances boot from (boxInstance.image); "": the stock one.
	image string
}

// warmInstance is an instance in the group's warm pool: its box, prepared, the pool's state (Stopped or Running),
// and the Auto Scaling that holds its lifecycle actions.
type warmInstance struct {
	node  *boxNode
	state string
	asg   *fakeaws.AutoScaling
}

// ec2Instance is one instance as moto's EC2 and Auto Scaling describe it (awsEnv.ec2Instances).
type ec2Instance struct {
	State     string           `json:"state"`
	Zone      string           `json:"zone"`
	IP        string           `json:"ip"`
	Group     string           `json:"group"`
	Lifecycle string           `json:"lifecycle"`
	Volumes   []attachedVolume `json:"volumes"`
}

// ec2Instances are every instance EC2 knows, as the launcher reads them: state, zone, private IP, the volumes
// attached to it, and for a member of an Auto Scaling group its group and lifecycle state.
func (a *awsEnv) ec2Instances(ctx context.Context, t *testing.T) map[string]ec2Instance {
	t.Helper()
	type member struct{ group, lifecycle string }
	members := map[string]member{}
	for _, g := range a.autoscalingGroups(ctx, t) {
		for _, i := range g.Instances {
			members[aws.ToString(i.InstanceId)] = member{aws.ToString(g.AutoScalingGroupName), string(i.LifecycleState)}
		}
	}
	client := a.ec2()
	volumes := map[string][]attachedVolume{}
	vols := ec2.NewDescribeVolumesPaginator(client, &ec2.DescribeVolumesInput{})
	for vols.HasMorePages() {
		page, err := vols.NextPage(ctx)
		assert.NilError(t, err, "DescribeVolumes")
		for _, v := range page.Volumes {
			for _, at := range v.Attachments {
				if at.State == ec2types.VolumeAttachmentStateAttached {
					id := aws.ToString(at.InstanceId)
					volumes[id] = append(volumes[id], attachedVolume{ID: aws.ToString(v.VolumeId),
						Device: aws.ToString(at.Device), SizeGiB: int64(aws.ToInt32(v.Size))})
				}
			}
		}
	}
	out := map[string]ec2Instance{}
	insts := ec2.NewDescribeInstancesPaginator(client, &ec2.DescribeInstancesInput{})
	for insts.HasMorePages() {
		page, err := insts.NextPage(ctx)
		assert.NilError(t, err, "DescribeInstances")
		for _, r := range page.Reservations {
			for _, i := range r.Instances {
				id := aws.ToString(i.InstanceId)
				m := members[id]
				inst := ec2Instance{State: string(i.State.Name), IP: aws.ToString(i.PrivateIpAddress), Group: m.group,
					Lifecycle: m.lifecycle, Volumes: volumes[id]}
				if i.Placement != nil {
					inst.Zone = aws.ToString(i.Placement.AvailabilityZone)
				}
				out[id] = inst
			}
		}
	}
	return out
}

// cacheVolumes are the build cache volumes moto knows, by id: their state.
func (a *awsEnv) cacheVolumes(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	var out map[string]string
	a.python(ctx, t, nil, &out, "cache-volumes", a.admin.Key, a.admin.Secret)
	return out
}

func newLauncher(t *testing.T, a *awsEnv, j *boxJoin, group string, archives []string) *launcher {
	t.Helper()
	return &launcher{aws: a, join: j, group: group, archives: archives, boxes: map[string]*boxNode{},
		stopping: map[string]bool{}, volumes: newVolumeStore(t)}
}

// sync makes the boxes follow moto's instances once.
func (l *launcher) sync(ctx context.Context, t *testing.T) {
	t.Helper()
	for id, inst := range l.aws.ec2Instances(ctx, t) {
		if l.join.vpc != nil && id == l.join.vpc.gatewayID {
			l.syncGateway(ctx, t, inst.State)
			continue
		}
		n, known := l.boxes[id]
		up := known && n.cur != nil && n.running()
		switch {
		case inst.State == "pending" || inst.State == "running":
			if !known {
				if inst.Group != l.group {
					continue
				}
				if l.warm != nil {
					// The rest of this turn's states predate the swap; the next turn reads them anew.
					l.enterService(ctx, t, id)
					return
				}
				if inst.IP == "" {
					t.Fatalf("moto gave instance %s no private IP", id)
				}
				n = l.join.newNode(t, "burst-"+strings.TrimPrefix(id, "i-")[:8], boxInstance{id: id, zone: inst.Zone, ip: inst.IP,
					state: inst.Lifecycle, image: l.image})
				n.runsPods(t, l.archives)
				l.boxes[id] = n
			}
			if !up {
				t.Logf("launcher: %s is %s in %s: booting its box", id, inst.State, inst.Group)
				n.boot(t)
			}
			n.attachVolumes(t, l.volumes, inst.Volumes)
		case up && !l.stopping[id]:
			// As EC2 stops an instance: an orderly shutdown from outside; the test sees it end (box.running).
			t.Logf("launcher: %s is %s: powering its box off", id, inst.State)
			if out, err := n.exec(ctx, "systemctl", "poweroff"); err != nil && n.running() {
				t.Fatalf("box of %s: systemctl poweroff: %v: %s", id, err, out)
			}
			l.stopping[id] = true
		}
		if !up {
			delete(l.stopping, id)
		}
	}
}

// prepareWarm fills the group's warm pool with one instance in state (Stopped or Running), as EC2 Auto Scaling does:
// an instance launched from the group's launch template, outside the group, boots in Warmed:<state>, prepares and
// completes the launch hook's action, then is stopped (Stopped) or stays up (Running); the group holds the action
// again for when it leaves the pool ("Use lifecycle hooks with a warm pool", EC2 Auto Scaling user guide). Moto
// 5.2 has no warm pool instances and no CompleteLifecycleAction: the instance is moto's, its lifecycle actions an
// Auto Scaling fake's that knows it alone.
func (l *launcher) prepareWarm(ctx context.Context, t *testing.T, state string) {
	t.Helper()
	if infra.LaunchHook(l.join.pool) == "" || l.join.vpc == nil {
		t.Fatal("a warm pool needs the pool's launch hook and the burst's VPC")
	}
	id, inst := l.aws.launchFromGroup(ctx, t, l.group)
	role := l.join.vpc.nodeRole
	asg := fakeaws.NewAutoScaling(t, fakeaws.SigV4{Region: l.join.cfg.Region, Credentials: aws.Credentials{
		AccessKeyID: role.Key, SecretAccessKey: role.Secret, SessionToken: role.Token}},
		fakeaws.AutoScalingInstance{ID: id, Group: l.group, Hook: infra.LaunchHook(l.join.pool)})
	asg.Hold()
	j := *l.join
	j.autoscaling = asg.URL
	n := j.newNode(t, "burst-"+strings.TrimPrefix(id, "i-")[:8], boxInstance{id: id, zone: inst.Zone, ip: inst.IP,
		state: "Warmed:" + state, image: l.image})
	n.runsPods(t, l.archives)
	start := time.Now()
	n.boot(t)
	n.waitCloudInit(ctx, t, 4*time.Minute)
	if result, mode := n.timeline(ctx, t); result != "prepared" || mode != "prepare" || asg.Completed("CONTINUE") != 1 {
		t.Fatalf("warm pool: %s: timeline result %q mode %q, lifecycle actions completed %d, want prepared, prepare, 1",
			id, result, mode, asg.Completed("CONTINUE"))
	}
	t.Logf("warm pool: %s prepared %.1f s after its box started", id, time.Since(start).Seconds())
	if state == "Stopped" {
		assert.NilError(t, n.poweroff(time.Minute))
		l.aws.stopInstance(ctx, t, id)
	}
	asg.Hold()
	l.warm = &warmInstance{node: n, state: state, asg: asg}
}

// enterService plays the group's scale-out from its warm pool: the instance moto launched for the new capacity
// gives way to the warm one (detached with the capacity it brought, the warm one attached, which restores it, the
// launched one terminated), and the warm one enters service: InService in its IMDS, and a Stopped one started.
func (l *launcher) enterService(ctx context.Context, t *testing.T, launched string) {
	t.Helper()
	w := l.warm
	l.warm = nil
	client := l.aws.autoscaling()
	_, err := client.DetachInstances(ctx, &autoscaling.DetachInstancesInput{AutoScalingGroupName: aws.String(l.group),
		InstanceIds: []string{launched}, ShouldDecrementDesiredCapacity: aws.Bool(true)})
	assert.NilError(t, err, "DetachInstances")
	_, err = client.AttachInstances(ctx, &autoscaling.AttachInstancesInput{AutoScalingGroupName: aws.String(l.group),
		InstanceIds: []string{w.node.id}})
	assert.NilError(t, err, "AttachInstances")
	_, err = l.aws.ec2().TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{launched}})
	assert.NilError(t, err, "TerminateInstances")
	w.node.imds.SetLifecycleState("InService")
	l.boxes[w.node.id] = w.node
	t.Logf("launcher: %s leaves the warm pool (%s) for the capacity %s was launched for", w.node.id, w.state, launched)
	if w.state == "Stopped" {
		l.aws.startInstance(ctx, t, w.node.id)
		w.node.boot(t)
	}
}

// syncGateway makes the gateway's box follow its instance's state.
func (l *launcher) syncGateway(ctx context.Context, t *testing.T, state string) {
	t.Helper()
	g := l.join.vpc.gateway
	up := g.cur != nil && g.running()
	switch {
	case (state == "pending" || state == "running") && !up && !l.gatewayBooted:
		t.Logf("launcher: gateway %s is %s: booting its box", l.join.vpc.gatewayID, state)
		g.boot(t)
		l.gatewayBooted = true
	case (state == "pending" || state == "running") && !up:
		t.Logf("launcher: the gateway's box powered itself off: EC2 stops instance %s", l.join.vpc.gatewayID)
		l.aws.stopInstance(ctx, t, l.join.vpc.gatewayID)
		l.gatewayBooted = false
	case state == "stopping" || state == "stopped":
		if up {
			t.Fatalf("gateway %s is %s in moto while its box runs: nothing in the burst stops it from outside",
				l.join.vpc.gatewayID, state)
		}
		l.gatewayBooted = false
	}
}

// only is the one box the launcher has booted besides except (nil: none), nil before it has.
func (l *launcher) only(except *boxNode) *boxNode {
	for _, id := range slices.Sorted(maps.Keys(l.boxes)) {
		if except == nil || id != except.id {
			return l.boxes[id]
		}
	}
	return nil
}

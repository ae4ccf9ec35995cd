//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cmd/check/check"
	"github.com/dynk8s/dynk8s/cmd/status/status"
	"github.com/dynk8s/dynk8s/infra/config"
)

// operatorUser is the IAM user cmd/status runs as: the read-only calls docs/status.md lists, and nothing else, so
// that moto's IAM enforcement refuses any call the page does not name.
const operatorUser = "e2e-operator"

const operatorPolicy = `{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Resource": "*", "Action": [
	"autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeWarmPool", "autoscaling:DescribeScalingActivities",
	"ec2:DescribeInstances", "ssm:DescribeParameters"]}]}`

// operatorStatus is the built cmd/status, run as the operator would on the on-prem peer: in the mount namespace of
// the on-prem side's wireguard-go (where its control socket is; the host's network, where the API server and moto
// are), with the admin kubeconfig and the operator user's key against moto.
type operatorStatus struct {
	bin string
}

func buildStatus(t *testing.T) *operatorStatus {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "status")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/status")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/status: %v\n%s", err, out)
	}
	return &operatorStatus{bin: bin}
}

// run runs it once with -o json and returns the report; it logs the report as the text screen.
func (s *operatorStatus) run(ctx context.Context, t *testing.T, b *burst, when string) status.Report {
	t.Helper()
	pid, err := wireguardGoPID(ctx, b.vpc.gateway.tn.onprem)
	assert.NilError(t, err)
	key := b.aws.users[operatorUser]
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// nsenter -m starts the command at the namespace's root: the stack file by its absolute path.
	stackFile := devStackFile(t)
	cmd := exec.CommandContext(cctx, "nsenter", "-t", pid, "-m", "--", s.bin, "-config", stackFile,
		"-stack", "dev", "-kubeconfig", b.c.Kubeconfig, "-o", "json")
	cmd.Env = append(os.Environ(), "AWS_ENDPOINT_URL="+b.aws.url, "AWS_ACCESS_KEY_ID="+key.Key,
		"AWS_SECRET_ACCESS_KEY="+key.Secret, "AWS_SESSION_TOKEN=", "AWS_PROFILE=", "AWS_CONFIG_FILE=/dev/null",
		"AWS_SHARED_CREDENTIALS_FILE=/dev/null", "KUBECONFIG=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if exit := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exit) {
		t.Fatalf("cmd/status %s: %v\n%s", when, err, stderr.String())
	}
	var r status.Report
	assert.NilError(t, json.Unmarshal(stdout.Bytes(), &r), "cmd/status %s: %s\n%s", when, stdout.String(), stderr.String())
	var screen bytes.Buffer
	assert.NilError(t, r.WriteText(&screen))
	t.Logf("cmd/status %s (exit %d):\n%s%s", when, cmd.ProcessState.ExitCode(), screen.String(), stderr.String())
	// The operator's user may make every call the page names: a refusal would be an unread part.
	for _, u := range r.Unread {
		if bytes.Contains([]byte(u), []byte("AccessDenied")) || bytes.Contains([]byte(u), []byte("not authorized")) {
			t.Errorf("cmd/status %s: a call docs/status.md lists was refused: %s", when, u)
		}
	}
	return r
}

// pool is the report's pool of the burst.
func (s *operatorStatus) pool(t *testing.T, r status.Report, b *burst) status.Pool {
	t.Helper()
	for _, p := range r.Pools {
		if p.Name == b.pool.Name {
			assert.Check(t, is.Equal(p.Group, b.group), "the pool's group as moto has it")
			return p
		}
	}
	t.Fatalf("no pool %s in the report: %+v", b.pool.Name, r.Pools)
	return status.Pool{}
}

// checkAsleep checks the report before the burst: the gateway asleep, the pool at zero, the tunnel read from the
// on-prem peer's real interface.
func (s *operatorStatus) checkAsleep(ctx context.Context, t *testing.T, b *burst, when string) {
	t.Helper()
	r := s.run(ctx, t, b, when)
	assert.Check(t, is.Equal(r.Gateway.Instance, b.vpc.gatewayID))
	assert.Check(t, is.Equal(r.Gateway.State, "stopped"))
	p := s.pool(t, r, b)
	assert.Check(t, is.Equal(p.Desired, 0))
	assert.Check(t, is.Equal(p.InService, 0))
	assert.Check(t, is.Len(p.Nodes, 0))
	assert.Check(t, is.Equal(r.Tunnel.Interface, onPremIface), "the on-prem peer's interface found by its VPC route")
	assert.Check(t, !r.Tunnel.Up)
}

// checkBurst checks the report while the build pod runs: the pool at one, its Node Ready, the gateway awake, the
// tunnel up, the controller leading.
func (s *operatorStatus) checkBurst(ctx context.Context, t *testing.T, b *burst) {
	t.Helper()
	r := s.run(ctx, t, b, "during the burst")
	p := s.pool(t, r, b)
	assert.Check(t, is.Equal(p.Desired, 1))
	assert.Check(t, is.Equal(p.InService+p.Booting, 1))
	assert.Check(t, is.Len(p.Nodes, 1))
	if len(p.Nodes) == 1 {
		assert.Check(t, is.Equal(p.Nodes[0].Name, b.node))
		assert.Check(t, p.Nodes[0].Ready)
	}
	assert.Check(t, is.Equal(r.Gateway.State, "running"))
	assert.Check(t, r.Tunnel.Up, "the tunnel: %+v", r.Tunnel)
	assert.Check(t, r.Tunnel.LastHandshake != nil)
	assert.Check(t, r.Tunnel.ReceivedBytes > 0)
	assert.Check(t, is.Equal(r.Controller.Leader, "e2e-burst"))
	assert.Check(t, r.Controller.Leads)
}

// checkPreflightOfTheCluster runs cmd/check's cluster side against the real API server after the real kubeadm's
// bootstrap-token and upload-config phases: the four roles the stack binds its token group to are there, and the
// dev stack's ranges are kubeadm-config's; a stack with another pod range fails with the key that fixes it.
func checkPreflightOfTheCluster(ctx context.Context, t *testing.T, c cluster, cfg *config.Config) {
	t.Helper()
	run := func(cfg *config.Config) check.Report {
		return check.Run(ctx, check.Sources{Kube: clientFor(t, c)}, check.Input{Stack: "dev", Config: cfg, Now: time.Now()})
	}
	r := run(cfg)
	roles := 0
	for _, res := range r.Results {
		switch res.Check {
		case "kubeadm role":
			roles++
			assert.Check(t, is.Equal(res.Status, check.OK), "%+v", res)
		case "cluster ranges":
			assert.Check(t, is.Equal(res.Status, check.OK), "%+v", res)
		}
	}
	assert.Check(t, is.Equal(roles, 4), "%+v", r.Results)

	other := *cfg
	other.Kubernetes.PodCIDR = netip.MustParsePrefix("10.32.0.0/12")
	failed := []string{}
	for _, res := range run(&other).Results {
		if res.Status == check.Fail && res.Check != "in-cluster parts' nodes" { // no on-prem node is labelled here
			failed = append(failed, res.Check+": "+res.Detail)
		}
	}
	assert.Check(t, is.DeepEqual(failed, []string{"cluster ranges: dynk8s:kubernetes.podCidr: is 10.32.0.0/12, but the " +
		"cluster's networking.podSubnet is 10.244.0.0/16 (kube-system/kubeadm-config): set it to the cluster's, so " +
		"that the checks that the stack's ranges do not overlap it see the range the cluster uses"}))
}

package nodetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// Acceptance of the gateway's commands (gateway-key, gateway-packages, gateway-idle): the built agent with the
// gateway's configuration as Gateway renders it, against the wire-level fakes of internal/fakeaws (IMDSv2, SSM's JSON
// API, EC2's Query API, each checking the SigV4 signature with the role's credentials) through the endpoint overrides, and the
// host's commands (rpm, dnf, systemctl, nft) recorded by the stand-ins. The agent's table tests (node/cmd/dynk8s-node,
// gateway_test.go) cover every scenario of the scripts these replace with fake clients; these prove the real
// clients speak the wire protocols and the rendered config is the one the agent reads.

const idleStateFile = "run/dynk8s/gateway-idle.state"

// gatewayEnv is a gateway's root with the rendered user data (in) and the agent where the bootstrap installs it.
func gatewayEnv(t *testing.T, in cloudinit.GatewayInput, aws *cloud, env map[string]string, prepare func(root string)) *scriptEnv {
	t.Helper()
	ud, err := cloudinit.Gateway(in)
	assert.NilError(t, err)
	return newAgentEnv(t, ud, aws, env, prepare)
}

// The key from SSM, signed with the role's credentials, after IMDS's token and SSM each fail once: written 0600,
// and never on a command line, in the log or in the journal. The next start finds it current; a start with SSM
// down keeps it.
func TestGatewayAgentKey(t *testing.T) {
	t.Parallel()
	aws := newCloud(t, map[string]string{testKeyParameter: testGatewayPrivate}, fakeaws.IMDSInstance{}, 0)
	aws.imds.FailTokens(1)
	aws.ssm.Fail(1, "AccessDeniedException")
	env := gatewayEnv(t, testGateway(), aws, nil, nil)
	run := env.run(t, AgentPath, "gateway-key")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, strings.HasPrefix(run.stderr, "dynk8s-wg-key: dynk8s-node devel (sha256 "), "the first line names the agent")
	assert.Check(t, is.Contains(run.stderr, "read the WireGuard key from SSM parameter "+testKeyParameter+
		": succeeded on attempt 3"))
	assert.Check(t, is.Contains(run.stderr, "HTTP 400 AccessDeniedException: fake SSM says no"))
	keyFile := filepath.Join(run.root, wgKeyPath)
	assert.Check(t, is.Contains(run.stderr, "wrote the key from SSM to "+keyFile))
	b, err := os.ReadFile(keyFile)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), testGatewayPrivate+"\n"))
	fi, err := os.Stat(keyFile)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o600)))
	for _, secret := range []string{testGatewayPrivate, aws.inst.SecretAccessKey, aws.inst.SessionToken, fakeaws.IMDSSessionToken} {
		assert.Check(t, !strings.Contains(run.stderr, secret), "a secret is in the log")
		assert.Check(t, !strings.Contains(run.file("calls"), secret), "a secret is in some command's argv")
		assert.Check(t, !strings.Contains(run.file("journal"), secret), "a secret is in the journal")
	}

	again := env.run(t, AgentPath, "gateway-key")
	assert.Equal(t, again.exitCode, 0)
	assert.Check(t, is.Contains(again.stderr, "is current"))

	aws.ssm.Fail(-1, "AccessDeniedException")
	down := env.run(t, AgentPath, "gateway-key")
	assert.Equal(t, down.exitCode, 0)
	assert.Check(t, is.Contains(down.stderr, "keeping the key already in "+keyFile))
	assert.Check(t, is.Len(FailedLines(down.stderr), 0))
}

// A first boot with SSM refusing and no key on disk: one clear reason, to the kernel log too, and exit 1.
func TestGatewayAgentKeyFailsWithoutAnyKey(t *testing.T) {
	t.Parallel()
	aws := newCloud(t, nil, fakeaws.IMDSInstance{}, 0)
	aws.ssm.Fail(-1, "AccessDeniedException")
	env := gatewayEnv(t, testGateway(), aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, func(root string) {
		assert.NilError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, "dev/kmsg"), nil, 0o600))
	})
	run := env.run(t, AgentPath, "gateway-key")
	assert.Equal(t, run.exitCode, 1)
	failed := FailedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "no WireGuard key: SSM parameter "+testKeyParameter+" could not be read"))
	assert.Check(t, is.Contains(failed[0], "AccessDeniedException"))
	assert.Check(t, is.Contains(strings.Join(KernelLog(t, run.root), "\n"), "<3>dynk8s-wg-key: FAILED: no WireGuard key"))
}

// Two failed installs, then one that works, and the tunnel started after it: the first reads only Fedora's release
// repository, the next ones every repository.
func TestGatewayAgentPackages(t *testing.T) {
	t.Parallel()
	aws := newCloud(t, nil, fakeaws.IMDSInstance{}, 0)
	env := gatewayEnv(t, testGateway(), aws, map[string]string{"STUB_RPM_MISSING": "nftables wireguard-tools",
		"STUB_DNF_FAILURES": "2"}, nil)
	run := env.run(t, AgentPath, "gateway-packages")
	assert.Equal(t, run.exitCode, 0)
	install := "dnf install -y --setopt=install_weak_deps=False nftables wireguard-tools\n"
	assert.Check(t, is.Equal(run.file("calls"), "rpm -q --whatprovides nftables\nrpm -q --whatprovides wireguard-tools\n"+
		"dnf install -y --setopt=install_weak_deps=False --repo=fedora nftables wireguard-tools\n"+install+install+
		"systemctl enable --now --no-block wg-quick@wg0.service\n"))
	assert.Check(t, is.Contains(run.stderr, "install nftables wireguard-tools: attempt 1 failed: dnf install exited 1"))
	assert.Check(t, is.Contains(run.stderr, "installed nftables wireguard-tools"))
	assert.Check(t, is.Len(FailedLines(run.stderr), 0))
}

// nftCounters is `nft -j list counters table inet dynk8s_wg0_mss` with these packet counts (as nftables 1.0 prints it).
func nftCounters(in, out int) string {
	return fmt.Sprintf(`{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, `+
		`{"counter": {"family": "inet", "name": "forwarded_in", "table": "dynk8s_wg0_mss", "handle": 2, "packets": %d, "bytes": %d}}, `+
		`{"counter": {"family": "inet", "name": "forwarded_out", "table": "dynk8s_wg0_mss", "handle": 3, "packets": %d, "bytes": %d}}]}`,
		in, in*100, out, out*100)
}

// idleRun runs the idle check once on a gateway whose last activity was ago with the packet total 42, nft answering
// 40 + 2 packets; every DescribeInstances it makes asks exactly for the stack's pool instances (the cluster tag and
// the pool tag key) that are pending or running.
func idleRun(t *testing.T, aws *cloud, ago time.Duration, env map[string]string) scriptRun {
	t.Helper()
	in := testGateway()
	in.IdleStop, in.ClusterName = 15*time.Minute, testClusterName
	e := gatewayEnv(t, in, aws, env, func(root string) {
		p := filepath.Join(root, idleStateFile)
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, fmt.Appendf(nil, "%d 42\n", time.Now().Add(-ago).Unix()), 0o600))
	})
	assert.NilError(t, os.WriteFile(filepath.Join(e.stubDir, "nft.json"), []byte(nftCounters(40, 2)), 0o600))
	run := e.run(t, AgentPath, "gateway-idle")
	want := map[string][]string{
		"tag:dynk8s:cluster":  {testClusterName},
		"tag-key":             {"dynk8s:pool"},
		"instance-state-name": {"pending", "running"},
	}
	for _, filters := range aws.ec2.Filters() {
		assert.Check(t, is.DeepEqual(filters, want), "DescribeInstances filters")
	}
	return run
}

// idleAWS is a fake AWS whose EC2 knows the gateway itself (no pool tag), another cluster's node, and extra.
func idleAWS(t *testing.T, extra ...fakeaws.EC2Instance) *cloud {
	aws := newCloud(t, nil, fakeaws.IMDSInstance{}, 0)
	aws.ec2.AddInstances(append([]fakeaws.EC2Instance{
		{ID: "i-0aaaaaaaaaaaaaaa1", State: "running", Tags: map[string]string{"dynk8s:cluster": testClusterName}},
		{ID: "i-0bbbbbbbbbbbbbbb2", State: "running", Tags: map[string]string{"dynk8s:cluster": "other", "dynk8s:pool": "x"}},
	}, extra...)...)
	return aws
}

// Idle for 16 minutes: DescribeInstances with exactly the idle check's filters (idleRun checks them) finds no pool
// instance, the counters did not move, and the gateway powers off; no credential reaches a command line.
func TestGatewayAgentIdleStops(t *testing.T) {
	t.Parallel()
	aws := idleAWS(t, fakeaws.EC2Instance{ID: "i-0ccccccccccccccc3", State: "stopping",
		Tags: map[string]string{"dynk8s:cluster": testClusterName, "dynk8s:pool": "builders-x86"}})
	run := idleRun(t, aws, 16*time.Minute, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Equal(run.file("calls"), "nft -j list counters table inet dynk8s_wg0_mss\nsystemctl poweroff\n"))
	assert.Check(t, is.Contains(run.stderr, "stopping: idle for 96"), "16 minutes")
	assert.Check(t, is.Contains(run.stderr, "(limit 900s)"))
	assert.Check(t, is.DeepEqual(aws.ec2.Actions(), []string{"DescribeInstances"}))
	for _, secret := range []string{aws.inst.SecretAccessKey, aws.inst.SessionToken, fakeaws.IMDSSessionToken} {
		assert.Check(t, !strings.Contains(run.file("calls"), secret), "a secret is in some command's argv")
		assert.Check(t, !strings.Contains(run.stderr, secret), "a secret is in the log")
	}
}

// A running pool instance behind two empty pages keeps the gateway up: each page asks for the next with the
// NextToken of the XML answer.
func TestGatewayAgentIdleFollowsNextToken(t *testing.T) {
	t.Parallel()
	aws := idleAWS(t, fakeaws.EC2Instance{ID: "i-0eeeeeeeeeeeeeee5", State: "running",
		Tags: map[string]string{"dynk8s:cluster": testClusterName, "dynk8s:pool": "builders-x86"}})
	aws.ec2.EmptyPages(2)
	run := idleRun(t, aws, time.Hour, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"), "powered off with a pool instance running")
	assert.Check(t, is.Contains(run.stderr, "staying up: pool instances i-0eeeeeeeeeeeeeee5 (running)"))
	assert.Check(t, is.DeepEqual(aws.ec2.Tokens(), []string{"", "page-1", "page-2"}))
}

// EC2 errors are retried (EC2's XML error answer read for its code); EC2 that never answers keeps the gateway up,
// with one reason.
func TestGatewayAgentIdleEC2Errors(t *testing.T) {
	t.Parallel()
	aws := idleAWS(t)
	aws.ec2.Fail(2, 503, "RequestLimitExceeded")
	run := idleRun(t, aws, time.Hour, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "HTTP 503 RequestLimitExceeded: fake EC2 says no; retrying"))
	assert.Check(t, is.Contains(run.stderr, "list the pool instances of cluster homelab: succeeded on attempt 3"))
	assert.Check(t, is.Contains(run.file("calls"), "systemctl poweroff\n"))

	aws = idleAWS(t)
	aws.ec2.Fail(-1, 403, "UnauthorizedOperation")
	run = idleRun(t, aws, time.Hour, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"})
	assert.Equal(t, run.exitCode, 1)
	assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
	failed := FailedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "cannot tell whether a pool instance runs (EC2 DescribeInstances: HTTP "+
		strconv.Itoa(403)+" UnauthorizedOperation: fake EC2 says no); the gateway stays up"))
}

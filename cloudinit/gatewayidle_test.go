package cloudinit

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
)

const (
	idleScript    = libexecDir + "/gateway-idle.sh"
	idleStateFile = "run/dynk8s/gateway-idle.state"
	testIdleStop  = 15 * time.Minute
)

// idleGateway is the gateway's input with the idle check on.
func idleGateway() GatewayInput {
	in := testGateway()
	in.IdleStop = testIdleStop
	in.ClusterName = testClusterName
	return in
}

// idleFixture renders the gateway's user data with the idle check and a fake AWS whose EC2 knows instances: the
// gateway itself (no pool tag), another cluster's running node, and whatever the test adds.
func idleFixture(t *testing.T, extra ...fakeInstance) ([]byte, *fakeAWS) {
	t.Helper()
	ud, err := Gateway(idleGateway())
	assert.NilError(t, err)
	aws := newFakeAWS(t, nil)
	aws.ec2.instances = append([]fakeInstance{
		{ID: "i-0aaaaaaaaaaaaaaa1", State: "running", Tags: map[string]string{"dynk8s:cluster": testClusterName}},
		{ID: "i-0bbbbbbbbbbbbbbb2", State: "running", Tags: map[string]string{"dynk8s:cluster": "other", "dynk8s:pool": "x"}},
	}, extra...)
	return ud, aws
}

// nftCounters is `nft -j list counters table inet dynk8s_wg0_mss` with these packet counts (as nftables 1.0 prints it).
func nftCounters(in, out int) string {
	return fmt.Sprintf(`{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, `+
		`{"counter": {"family": "inet", "name": "forwarded_in", "table": "dynk8s_wg0_mss", "handle": 2, "packets": %d, "bytes": %d}}, `+
		`{"counter": {"family": "inet", "name": "forwarded_out", "table": "dynk8s_wg0_mss", "handle": 3, "packets": %d, "bytes": %d}}]}`,
		in, in*100, out, out*100)
}

// runIdle runs the idle check once; state is the prepared state file's line ("" for none) and counters nft's
// answer ("" for no table).
func runIdle(t *testing.T, ud []byte, aws *fakeAWS, state, counters string, env map[string]string) scriptRun {
	t.Helper()
	e := newScriptEnv(t, ud, aws, env, func(root string) {
		if state != "" {
			p := filepath.Join(root, idleStateFile)
			assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			assert.NilError(t, os.WriteFile(p, []byte(state), 0o600))
		}
	})
	if counters != "" {
		assert.NilError(t, os.WriteFile(filepath.Join(e.stubDir, "nft.json"), []byte(counters), 0o600))
	}
	return e.run(t, idleScript)
}

// stateLine is a state file line: the last activity ago, and the packet total then.
func stateLine(ago time.Duration, packets int) string {
	return fmt.Sprintf("%d %d\n", time.Now().Add(-ago).Unix(), packets)
}

// readState returns the state the run left: the last activity and the packet total.
func readState(t *testing.T, run scriptRun) (lastActive time.Time, packets int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(run.root, idleStateFile))
	assert.NilError(t, err)
	f := strings.Fields(string(b))
	assert.Assert(t, is.Len(f, 2), "state %q", b)
	sec, err := strconv.ParseInt(f[0], 10, 64)
	assert.NilError(t, err)
	packets, err = strconv.Atoi(f[1])
	assert.NilError(t, err)
	return time.Unix(sec, 0), packets
}

// Idle longer than idleStop: no pool instance pending or running (this cluster's stopping node, its gateway and
// another cluster's node do not count) and the counters did not move. The gateway powers off.
func TestGatewayIdleStopsWhenIdle(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t, fakeInstance{ID: "i-0ccccccccccccccc3", State: "stopping",
		Tags: map[string]string{"dynk8s:cluster": testClusterName, "dynk8s:pool": "builders-x86"}})
	run := runIdle(t, ud, aws, stateLine(16*time.Minute, 42), nftCounters(40, 2), nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.file("calls"), "systemctl poweroff\n"))
	assert.Check(t, is.Contains(run.file("calls"), "nft -j list counters table inet dynk8s_wg0_mss\n"))
	assert.Check(t, is.Contains(run.stderr, "stopping: idle for 96"), "16 minutes")
	assert.Check(t, is.Contains(run.stderr, "(limit 900s)"))
	assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"DescribeInstances"}))
	assert.Check(t, is.Len(failedLines(run.stderr), 0))
}

// A pool instance that is pending or running keeps the gateway up, however long ago the last packet was; the
// window restarts.
func TestGatewayIdleStaysUpWhilePoolInstancesRun(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"pending", "running"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			ud, aws := idleFixture(t, fakeInstance{ID: "i-0ddddddddddddddd4", State: state,
				Tags: map[string]string{"dynk8s:cluster": testClusterName, "dynk8s:pool": "builders-arm"}})
			before := time.Now()
			run := runIdle(t, ud, aws, stateLine(time.Hour, 7), nftCounters(5, 2), nil)
			assert.Equal(t, run.exitCode, 0)
			assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
			assert.Check(t, is.Contains(run.stderr, "staying up: pool instances i-0ddddddddddddddd4 ("+state+")"))
			last, packets := readState(t, run)
			assert.Check(t, !last.Before(before.Truncate(time.Second)), "the window restarts: %s", last)
			assert.Check(t, is.Equal(packets, 7))
		})
	}
}

// EC2 may answer a filtered search with an empty page and a nextToken: the check follows the tokens, so a pool
// instance on a later page keeps the gateway up (AWS N13), and an empty search ends where the tokens end.
func TestGatewayIdleFollowsNextToken(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t, fakeInstance{ID: "i-0ddddddddddddddd4", State: "running",
		Tags: map[string]string{"dynk8s:cluster": testClusterName, "dynk8s:pool": "builders-arm"}})
	aws.ec2.emptyPages = 2
	run := runIdle(t, ud, aws, stateLine(time.Hour, 7), nftCounters(5, 2), nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
	assert.Check(t, is.Contains(run.stderr, "staying up: pool instances i-0ddddddddddddddd4 (running)"))
	assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"DescribeInstances", "DescribeInstances", "DescribeInstances"}))

	ud, aws = idleFixture(t)
	aws.ec2.emptyPages = 1
	run = runIdle(t, ud, aws, stateLine(16*time.Minute, 7), nftCounters(5, 2), nil)
	assert.Check(t, is.Contains(run.file("calls"), "systemctl poweroff\n"))
	assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"DescribeInstances", "DescribeInstances"}))
	assert.Check(t, is.Len(failedLines(run.stderr), 0))
}

// No pool instance, but packets crossed the tunnel since the last run: the gateway stays up and the window restarts.
// A counter that went down (the table was reloaded) counts as traffic too.
func TestGatewayIdleStaysUpWhileTrafficFlows(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ last, in, out int }{"moved": {100, 90, 11}, "reset": {100, 3, 0}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ud, aws := idleFixture(t)
			before := time.Now()
			run := runIdle(t, ud, aws, stateLine(time.Hour, c.last), nftCounters(c.in, c.out), nil)
			assert.Equal(t, run.exitCode, 0)
			assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
			assert.Check(t, is.Contains(run.stderr, fmt.Sprintf("packets forwarded through wg0 (counter %d -> %d)", c.last, c.in+c.out)))
			last, packets := readState(t, run)
			assert.Check(t, !last.Before(before.Truncate(time.Second)))
			assert.Check(t, is.Equal(packets, c.in+c.out))
		})
	}
}

// Quiet, but not yet for idleStop: the gateway stays up and says how long it has been idle; the window is kept.
func TestGatewayIdleStaysUpInsideTheWindow(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t)
	run := runIdle(t, ud, aws, stateLine(10*time.Minute, 42), nftCounters(40, 2), nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
	assert.Check(t, is.Regexp(`staying up: idle for 60\ds of 900s \(no pool instance pending or running, no packet forwarded\)`, run.stderr))
	last, _ := readState(t, run)
	assert.Check(t, time.Since(last) > 9*time.Minute, "the window was kept: %s", last)
}

// The first run after a boot has no state: the boot starts the window, so a gateway a node just started stays up.
// The first counter reading counts as traffic (nothing to compare with).
func TestGatewayIdleFirstRunAfterBoot(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t)
	run := runIdle(t, ud, aws, "", nftCounters(0, 0), nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
	_, packets := readState(t, run)
	assert.Check(t, is.Equal(packets, 0))
	// With the tunnel's table not loaded (wg-quick down), nothing can cross it: the first run only starts the window.
	ud, aws = idleFixture(t)
	run = runIdle(t, ud, aws, "", "", nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "staying up: idle for 0s of 900s"))
	_, packets = readState(t, run)
	assert.Check(t, is.Equal(packets, -1))
}

// With the tunnel down (no nftables table) and no pool instance for longer than idleStop, the gateway stops.
func TestGatewayIdleStopsWithTunnelDown(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t)
	run := runIdle(t, ud, aws, stateLine(20*time.Minute, -1), "", nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.file("calls"), "systemctl poweroff\n"))
}

// When EC2 does not answer, nobody can tell whether a node needs the tunnel: the gateway stays up, and the run
// fails with one reason inside its deadline. A refusal (no permission) fails the same way.
func TestGatewayIdleStaysUpWhenEC2Fails(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		status int
		code   string
	}{"unavailable": {503, "Unavailable"}, "unauthorized": {403, "UnauthorizedOperation"}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ud, aws := idleFixture(t)
			aws.ec2.failures, aws.ec2.failStatus, aws.ec2.failCode = -1, c.status, c.code
			run := runIdle(t, ud, aws, stateLine(time.Hour, 42), nftCounters(40, 2),
				map[string]string{"DYNK8S_DEADLINE_SECONDS": "3"})
			assert.Check(t, run.exitCode != 0)
			assert.Check(t, run.elapsed < 15*time.Second, "took %s past a 3 s deadline", run.elapsed)
			assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
			failed := failedLines(run.stderr)
			assert.Assert(t, is.Len(failed, 1), run.stderr)
			assert.Check(t, is.Contains(failed[0], "cannot tell whether a pool instance runs (EC2 DescribeInstances: HTTP "+
				strconv.Itoa(c.status)+" "+c.code+": fake EC2 says no); the gateway stays up"))
		})
	}
}

// EC2 errors are retried inside the run: two 503s, then the answer, and the decision is taken.
func TestGatewayIdleRetriesEC2(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t)
	aws.ec2.failures, aws.ec2.failStatus, aws.ec2.failCode = 2, 503, "RequestLimitExceeded"
	run := runIdle(t, ud, aws, stateLine(time.Hour, 42), nftCounters(40, 2), nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "list the pool instances of cluster homelab: succeeded on attempt 3"))
	assert.Check(t, is.Contains(run.file("calls"), "systemctl poweroff\n"))
	assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"DescribeInstances", "DescribeInstances", "DescribeInstances"}))
}

// The role's credentials never reach a command line or the log.
func TestGatewayIdleKeepsCredentialsOffTheCommandLine(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t)
	run := runIdle(t, ud, aws, stateLine(time.Hour, 42), nftCounters(40, 2), nil)
	assert.Equal(t, run.exitCode, 0)
	for _, secret := range []string{fakeSecretKey, fakeSession} {
		assert.Check(t, !strings.Contains(run.file("calls"), secret), "a secret is in some command's argv")
		assert.Check(t, !strings.Contains(run.stderr, secret), "a secret is in the log")
	}
}

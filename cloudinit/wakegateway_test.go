package cloudinit

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const (
	wakeScript    = libexecDir + "/wake-gateway.sh"
	testGatewayID = "i-0feedfacecafe0001"
)

// wakeFixture renders a pool's user data with the gateway to wake, and a fake AWS whose gateway is in state.
func wakeFixture(t *testing.T, state string) ([]byte, *fakeAWS) {
	t.Helper()
	api := newFakeAPIServer(t, 0)
	u, err := url.Parse(api.URL)
	assert.NilError(t, err)
	in := spotPool()
	in.APIServerEndpoint = u.Host
	in.JoinTokenParameter = testTokenParameter
	in.GatewayInstanceID = testGatewayID
	ud, err := Node(in)
	assert.NilError(t, err)
	aws := newFakeAWS(t, map[string]string{testTokenParameter: testToken})
	aws.ec2.gatewayID, aws.ec2.gatewayState = testGatewayID, state
	return ud, aws
}

func runWake(t *testing.T, ud []byte, aws *fakeAWS, env map[string]string, id string) scriptRun {
	t.Helper()
	return newScriptEnv(t, ud, aws, env, nil).run(t, wakeScript, id)
}

// A stopped gateway is started once; a running one is "started" again, which EC2 answers without a change, and
// again through the settle window (a running gateway may be powering itself off), always without a change.
func TestWakeGatewayStartsIt(t *testing.T) {
	t.Parallel()
	for state, want := range map[string]string{"stopped": "was stopped, now pending", "running": "was running, now running"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			ud, aws := wakeFixture(t, state)
			run := runWake(t, ud, aws, wakeSettle, testGatewayID)
			assert.Equal(t, run.exitCode, 0)
			assert.Check(t, is.Contains(run.stderr, "gateway "+testGatewayID+" "+want))
			if state == "running" {
				// Once or twice more, as the 1 s ticks of bash's SECONDS fall.
				assert.Check(t, is.Contains(run.stderr, "gateway "+testGatewayID+" stayed running for 2s: it is up"))
				actions := aws.ec2Actions()
				assert.Check(t, len(actions) == 2 || len(actions) == 3, "%v", actions)
				for _, a := range actions {
					assert.Check(t, is.Equal(a, "StartInstances"))
				}
			} else {
				assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"StartInstances"}))
			}
			assert.Check(t, is.Equal(aws.ec2.gatewayState, "running"))
			for _, secret := range []string{fakeSecretKey, fakeSession} {
				assert.Check(t, !strings.Contains(run.file("calls"), secret), "a secret is in some command's argv")
				assert.Check(t, !strings.Contains(run.stderr, secret), "a secret is in the log")
			}
		})
	}
}

// wakeSettle shortens the settle window to 2 s, a start a second.
var wakeSettle = map[string]string{"DYNK8S_WAKE_SETTLE_SECONDS": "2", "DYNK8S_WAKE_INTERVAL_SECONDS": "1"}

// The race of AWS N6: the gateway's idle check ran before this node existed and its OS is powering off, which EC2
// still shows as running, so the first start changes nothing. The wake-up starts it again through the settle
// window, sees it stopping, retries, and starts it once it has stopped.
func TestWakeGatewayOutlastsAPowerOff(t *testing.T) {
	t.Parallel()
	ud, aws := wakeFixture(t, "running")
	aws.ec2.haltingCalls, aws.ec2.stoppingCalls = 1, 1
	run := runWake(t, ud, aws, wakeSettle, testGatewayID)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "was running, now running"))
	assert.Check(t, is.Contains(run.stderr, "(stopping): EC2 StartInstances: HTTP 400 IncorrectInstanceState"))
	assert.Check(t, is.Contains(run.stderr, "was stopped, now pending"))
	assert.Check(t, is.Equal(aws.ec2.gatewayState, "running"))
	assert.Check(t, is.Len(aws.ec2Actions(), 3))
}

// A gateway that is still stopping (it has just decided it was idle) refuses to start; the wake-up retries until it
// has stopped, then starts it.
func TestWakeGatewayRetriesThroughStopping(t *testing.T) {
	t.Parallel()
	ud, aws := wakeFixture(t, "stopping")
	aws.ec2.stoppingCalls = 2
	run := runWake(t, ud, aws, nil, testGatewayID)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "attempt 1 failed: gateway "+testGatewayID+" is not in a state it can start "+
		"from (stopping): EC2 StartInstances: HTTP 400 IncorrectInstanceState"))
	assert.Check(t, is.Contains(run.stderr, "start the WireGuard gateway "+testGatewayID+": succeeded on attempt 3"))
	assert.Check(t, is.Contains(run.stderr, "was stopped, now pending"))
	assert.Check(t, is.Len(aws.ec2Actions(), 3))
}

// Throttling and server errors are retried too.
func TestWakeGatewayRetriesServerErrors(t *testing.T) {
	t.Parallel()
	ud, aws := wakeFixture(t, "stopped")
	aws.ec2.failures, aws.ec2.failStatus, aws.ec2.failCode = 2, 503, "RequestLimitExceeded"
	run := runWake(t, ud, aws, nil, testGatewayID)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "HTTP 503 RequestLimitExceeded: fake EC2 says no; retrying"))
	assert.Check(t, is.Contains(run.stderr, "succeeded on attempt 3"))
}

// No permission, or no such instance: retrying cannot help, so the wake-up fails at once with the reason.
func TestWakeGatewayFailsAtOnceWhenRefused(t *testing.T) {
	t.Parallel()
	ud, aws := wakeFixture(t, "stopped")
	aws.ec2.failures, aws.ec2.failStatus, aws.ec2.failCode = -1, 403, "UnauthorizedOperation"
	run := runWake(t, ud, aws, nil, testGatewayID)
	assert.Check(t, run.exitCode != 0)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "cannot start gateway "+testGatewayID+": EC2 StartInstances: HTTP 403 UnauthorizedOperation"))
	assert.Check(t, is.Len(aws.ec2Actions(), 1))

	ud, aws = wakeFixture(t, "stopped")
	run = runWake(t, ud, aws, nil, "i-0000000000000dead")
	assert.Check(t, run.exitCode != 0)
	assert.Check(t, is.Contains(run.stderr, "FAILED: cannot start gateway i-0000000000000dead: EC2 StartInstances: HTTP 400 InvalidInstanceID.NotFound"))
}

// A gateway that never finishes stopping: the wake-up gives up at its deadline with one reason.
func TestWakeGatewayGivesUpAtDeadline(t *testing.T) {
	t.Parallel()
	ud, aws := wakeFixture(t, "stopping")
	aws.ec2.stoppingCalls = 1 << 20
	run := runWake(t, ud, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "3"}, testGatewayID)
	assert.Check(t, run.exitCode != 0)
	assert.Check(t, run.elapsed < 15*time.Second, "took %s past a 3 s deadline", run.elapsed)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "start the WireGuard gateway "+testGatewayID+": gave up after"))
	assert.Check(t, is.Contains(failed[0], "(deadline 3s): gateway "+testGatewayID+" is not in a state it can start from"))
}

// Without a gateway id (gateway.idleStop 0) there is nothing to wake and no AWS call.
func TestWakeGatewayWithoutIDDoesNothing(t *testing.T) {
	t.Parallel()
	ud, aws := wakeFixture(t, "stopped")
	run := runWake(t, ud, aws, nil, "")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "the gateway never sleeps"))
	assert.Check(t, is.Len(aws.ec2Actions(), 0))
	assert.Check(t, is.Equal(aws.imds.Requests(), 0))
}

// The join starts the wake-up in the background and joins as before; a wake-up that fails (here: no permission) is
// logged and does not stop a join whose tunnel works.
func TestJoinWakesTheGateway(t *testing.T) {
	t.Parallel()
	ud, aws := wakeFixture(t, "stopped")
	run := runScript(t, ud, joinScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "dynk8s-wake-gateway: gateway "+testGatewayID+" was stopped, now pending"))
	assert.Check(t, is.Contains(run.stderr, "joined the cluster as "+fakeInstanceID))
	assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"StartInstances"}))

	ud, aws = wakeFixture(t, "stopped")
	aws.ec2.failures, aws.ec2.failStatus, aws.ec2.failCode = -1, 403, "UnauthorizedOperation"
	run = runScript(t, ud, joinScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "dynk8s-wake-gateway: FAILED: cannot start gateway"))
	assert.Check(t, is.Contains(run.stderr, "joined the cluster as "+fakeInstanceID))
}

package boot

import (
	"context"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/node/internal/cloud/cloudfake"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The gateway's wake-up, scenario by scenario, against the fake clients.

type wakeRun struct {
	err error
	log string
}

// wake runs the wake-up of gateway against r's fakes, the settle window 300 ms, a start every 100 ms.
func (r *rig) wake(gateway string, deadline time.Duration) wakeRun {
	r.t.Helper()
	return r.wakeCtx(context.Background(), gateway, deadline)
}

func (r *rig) wakeCtx(ctx context.Context, gateway string, deadline time.Duration) wakeRun {
	r.t.Helper()
	out := &nodetest.SyncBuffer{}
	log := system.NewLogger("dynk8s-wake-gateway", out, r.root)
	log.Journal = false
	d := r.cfg.Deadlines
	w := &waker{cloud: r.cloud(), log: log, settle: d.WakeSettle.D(), interval: d.WakeInterval.D(),
		clock: system.NewClock(deadline, d.BackoffInitial.D(), d.BackoffMax.D())}
	err := w.wake(ctx, gateway)
	r.t.Logf("wake: %v\n%s", err, out)
	return wakeRun{err: err, log: out.String()}
}

func TestWakeGateway(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		modify  func(e *cloudfake.EC2)
		gateway string
		// minStarts and maxStarts bound the StartInstances calls: the settle window ticks fewer times on a busy machine.
		minStarts, maxStarts int
		logs                 []string
		failure              string
		// deadline is the wake-up's (default 10 s: a case that succeeds ends at once, so only the ones that must
		// give up wait it out, and a busy machine's slow attempts never run a succeeding case out of time).
		deadline time.Duration
	}{
		// A stopped gateway is started once.
		"stopped": {minStarts: 1, maxStarts: 1,
			logs: []string{"gateway " + cloudfake.GatewayID + " was stopped, now pending"}},
		// A running one is "started" again through the settle window (it may be powering itself off), always
		// without a change.
		"running": {modify: func(e *cloudfake.EC2) { e.State = "running" }, minStarts: 2, maxStarts: 4,
			logs: []string{"gateway " + cloudfake.GatewayID + " was running, now running",
				"gateway " + cloudfake.GatewayID + " stayed running for 300ms: it is up"}},
		// The race of AWS N6: the idle check ran before this node existed and the gateway's OS is powering off,
		// which EC2 still shows as running; the wake-up sees it stopping, retries, and starts it once stopped.
		"powering off": {modify: func(e *cloudfake.EC2) { e.State, e.HaltingCalls, e.StoppingCalls = "running", 1, 1 },
			minStarts: 3, maxStarts: 3, logs: []string{"was running, now running",
				"(stopping): EC2 StartInstances: HTTP 400 IncorrectInstanceState", "was stopped, now pending"}},
		// A gateway still stopping refuses to start; the wake-up retries until it has stopped.
		"stopping": {modify: func(e *cloudfake.EC2) { e.State, e.StoppingCalls = "stopping", 2 }, minStarts: 3, maxStarts: 3,
			logs: []string{"attempt 1 failed: gateway " + cloudfake.GatewayID + " is not in a state it can start from " +
				"(stopping): EC2 StartInstances: HTTP 400 IncorrectInstanceState",
				"start the WireGuard gateway " + cloudfake.GatewayID + ": succeeded on attempt 3", "was stopped, now pending"}},
		// Throttling and server errors are retried too.
		"throttled": {modify: func(e *cloudfake.EC2) { e.Failures, e.FailStatus, e.FailCode = 2, 503, "RequestLimitExceeded" },
			minStarts: 3, maxStarts: 3, logs: []string{"HTTP 503 RequestLimitExceeded: fake EC2 says no; retrying",
				"succeeded on attempt 3"}},
		// No permission, or no such instance: retrying cannot help, so the wake-up fails at once.
		"refused": {modify: func(e *cloudfake.EC2) { e.Failures, e.FailStatus, e.FailCode = -1, 403, "UnauthorizedOperation" },
			minStarts: 1, maxStarts: 1,
			failure: "cannot start gateway " + cloudfake.GatewayID + ": EC2 StartInstances: HTTP 403 UnauthorizedOperation"},
		"no such instance": {gateway: "i-0000000000000dead", minStarts: 1, maxStarts: 1,
			failure: "FAILED: cannot start gateway i-0000000000000dead: EC2 StartInstances: HTTP 400 InvalidInstanceID.NotFound"},
		// A gateway that never finishes stopping: the wake-up gives up at its deadline with one reason.
		"never stops": {modify: func(e *cloudfake.EC2) { e.State, e.StoppingCalls = "stopping", 1<<20 }, minStarts: 2, maxStarts: 1000,
			failure: "start the WireGuard gateway " + cloudfake.GatewayID + ": gave up after", deadline: time.Second},
		"not an instance id": {gateway: "sg-123", failure: "'sg-123' is not an EC2 instance id"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			if c.modify != nil {
				c.modify(r.ec2)
			}
			gateway := c.gateway
			if gateway == "" {
				gateway = cloudfake.GatewayID
			}
			deadline := c.deadline
			if deadline == 0 {
				deadline = 10 * time.Second
			}
			run := r.wake(gateway, deadline)
			starts := r.ec2.Started()
			assert.Check(t, starts >= c.minStarts && starts <= c.maxStarts, "%d starts", starts)
			for _, want := range c.logs {
				assert.Check(t, is.Contains(run.log, want))
			}
			var failed []string
			for _, l := range strings.Split(run.log, "\n") {
				if strings.Contains(l, "FAILED") {
					failed = append(failed, l)
				}
			}
			if c.failure == "" {
				assert.NilError(t, run.err)
				assert.Check(t, is.Len(failed, 0))
				assert.Check(t, is.Equal(r.ec2.State, "running"))
				return
			}
			assert.Check(t, run.err != nil)
			assert.Assert(t, is.Len(failed, 1), run.log)
			assert.Check(t, is.Contains(failed[0], c.failure))
		})
	}
}

// A boot that ends while its wake-up watches a running gateway settle stops the wake-up, which logs no failure of
// its own: the join that succeeded beside an awake gateway once ended its journal with "FAILED: context canceled".
// Stopped otherwise (the unit's stop), the wake-up says why.
func TestWakeGatewayStoppedByTheBootIsNoFailure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cause  error
		failed bool
	}{{errBootEnded, false}, {context.Canceled, true}} {
		r := newRig(t, "", "")
		r.ec2.State = "running"
		// A window the cancel always falls in, however slow the machine.
		r.cfg.Deadlines.WakeSettle = nodeconfig.Duration(time.Minute)
		ctx, cancel := context.WithCancelCause(context.Background())
		go func() {
			for r.ec2.Started() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			cancel(c.cause)
		}()
		run := r.wakeCtx(ctx, cloudfake.GatewayID, 10*time.Second)
		assert.Check(t, run.err != nil, "the wake-up ran its settle window out")
		assert.Check(t, is.Equal(strings.Contains(run.log, "FAILED"), c.failed), "cause %v:\n%s", c.cause, run.log)
	}
}

// Without a gateway id (gateway.idleStop 0) there is nothing to wake and no AWS call.
func TestWakeGatewayWithoutIDDoesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	run := r.wake("", time.Second)
	assert.NilError(t, run.err)
	assert.Check(t, is.Contains(run.log, "the gateway never sleeps"))
	assert.Check(t, is.Equal(r.ec2.Started(), 0))
	assert.Check(t, is.Equal(r.imds.Requests, 0))
}

// The join starts the wake-up beside it and joins; a wake-up that fails (no permission) is logged and
// does not stop a join whose tunnel works.
func TestJoinWakesTheGateway(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]bool{"starts": false, "refused": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			r.cfg.GatewayInstanceID = cloudfake.GatewayID
			if fail {
				r.ec2.Failures, r.ec2.FailStatus, r.ec2.FailCode = -1, 403, "UnauthorizedOperation"
			}
			run := r.join()
			assert.NilError(t, run.err)
			if fail {
				assert.Check(t, is.Contains(run.log, "dynk8s-wake-gateway: FAILED: cannot start gateway"))
			} else {
				assert.Check(t, is.Contains(run.log, "dynk8s-wake-gateway: gateway "+cloudfake.GatewayID+" was stopped, now pending"))
			}
			assert.Check(t, is.Contains(run.log, "joined the cluster as "+cloudfake.InstanceID))
			assert.Check(t, is.Equal(r.ec2.Started(), 1))
		})
	}
}

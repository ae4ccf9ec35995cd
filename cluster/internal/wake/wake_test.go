package wake

import (
	"context"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop/looptest"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

const (
	gateway = "i-0123456789abcdef0"
	ours    = "dev-builders-x86-20261203"
	theirs  = "other-team-pool"
)

// status is an autoscaler status document as cluster-autoscaler 1.34 writes it (YAML, clusterstate/api/types.go),
// with the scaleUp status of each group given.
func status(groups map[string]string) string {
	var b strings.Builder
	b.WriteString("time: 2026-12-03 12:00:00.000000000 +0000 UTC\nautoscalerStatus: Running\nclusterWide:\n" +
		"  health:\n    status: Healthy\n  scaleUp:\n    status: NoActivity\nnodeGroups:\n")
	for _, name := range []string{ours, theirs} {
		s, ok := groups[name]
		if !ok {
			continue
		}
		b.WriteString("- name: " + name + "\n  health:\n    status: Healthy\n    nodeCounts:\n      registered:\n" +
			"        total: 0\n      longUnregistered: 0\n      unregistered: 0\n    cloudProviderTarget: 0\n" +
			"    minSize: 0\n    maxSize: 10\n  scaleUp:\n    status: " + s + "\n" +
			"    lastProbeTime: \"2026-12-03T12:00:00Z\"\n    lastTransitionTime: \"2026-12-03T12:00:00Z\"\n" +
			"  scaleDown:\n    status: NoCandidates\n")
	}
	return b.String()
}

func TestRaisingReadsTheStackGroupsInProgress(t *testing.T) {
	for _, c := range []struct {
		name   string
		groups map[string]string
		want   []string
	}{
		{"nothing scales", map[string]string{ours: "NoActivity", theirs: "NoActivity"}, nil},
		{"ours scales up", map[string]string{ours: "InProgress", theirs: "NoActivity"}, []string{ours}},
		{"another group scales up", map[string]string{ours: "NoActivity", theirs: "InProgress"}, nil},
		{"ours backed off", map[string]string{ours: "Backoff"}, nil},
		{"no groups yet", map[string]string{}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Raising(status(c.groups), []string{ours})
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(got, c.want))
		})
	}
	_, err := Raising("nodeGroups: {", []string{ours})
	assert.Check(t, is.ErrorContains(err, "not the autoscaler's YAML"))
}

func TestConfigNamesWhatIsWrong(t *testing.T) {
	rig := looptest.New(t0)
	_, client := cloudtest.EC2(t)
	_, err := New(Config{Gateway: "gw-1", Groups: nil, EC2: client}, rig.Deps())
	assert.Check(t, is.ErrorContains(err, `Gateway "gw-1" is not an EC2 instance id`))
	assert.Check(t, is.ErrorContains(err, "Groups must name"))
	_, err = New(Config{Gateway: gateway, Groups: []string{ours}}, rig.Deps())
	assert.Check(t, is.ErrorContains(err, "EC2 is required"))
}

// fixture is the loop against a fake clientset holding the status ConfigMap, the fake EC2 knowing the gateway, and
// a fake clock.
type fixture struct {
	*looptest.Rig
	c   *Controller
	ec2 *fakeaws.EC2
}

func newFixture(t *testing.T, gw fakeaws.EC2Instance) *fixture {
	t.Helper()
	rig := looptest.New(t0)
	fake, client := cloudtest.EC2(t, gw)
	c, err := New(Config{Gateway: gateway, Groups: []string{ours}, EC2: client}, rig.Deps())
	assert.NilError(t, err)
	f := &fixture{Rig: rig, c: c, ec2: fake}
	f.write(t, map[string]string{ours: "NoActivity", theirs: "NoActivity"})
	rig.Run(t, c)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if strings.Contains(rig.Logs.String(), "started") {
			return poll.Success()
		}
		return poll.Continue("the loop has not started")
	})
	return f
}

// write creates or updates the status ConfigMap, as the autoscaler does at the end of each of its loops.
func (f *fixture) write(t *testing.T, groups map[string]string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: DefaultStatusName},
		Data: map[string]string{statusKey: status(groups)}}
	cms := f.Client.CoreV1().ConfigMaps("kube-system")
	if _, err := cms.Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		_, err = cms.Create(context.Background(), cm, metav1.CreateOptions{})
		assert.NilError(t, err)
	}
}

// starts waits until the fake EC2 has answered n StartInstances calls, and then a moment more for any further one.
func (f *fixture) starts(t *testing.T, n int) {
	t.Helper()
	count := func() int {
		c := 0
		for _, a := range f.ec2.Actions() {
			if a == "StartInstances" {
				c++
			}
		}
		return c
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if count() >= n {
			return poll.Success()
		}
		return poll.Continue("%d StartInstances, want %d", count(), n)
	})
	time.Sleep(100 * time.Millisecond)
	assert.Check(t, is.Equal(count(), n), "StartInstances calls")
}

func (f *fixture) wakes(t *testing.T, result string) float64 {
	t.Helper()
	return looptest.Counter(t, f.c.wakes.WithLabelValues(result))
}

// A group of ours turning InProgress starts the stopped gateway once, whatever further statuses say while it stays
// InProgress; the next scale-up (after the group was quiet) asks again, and finds it running. A scale-up of a group
// that is not the stack's wakes nothing.
func TestWakesTheGatewayOncePerScaleUpOfOurGroups(t *testing.T) {
	f := newFixture(t, fakeaws.EC2Instance{ID: gateway, State: "stopped"})
	f.write(t, map[string]string{ours: "NoActivity", theirs: "InProgress"})
	f.starts(t, 0)

	f.write(t, map[string]string{ours: "InProgress", theirs: "InProgress"})
	f.starts(t, 1)
	assert.Check(t, is.Equal(f.ec2.State(gateway), "running"))
	looptest.WaitCounter(t, f.c.wakes.WithLabelValues(ResultStarted), 1)
	events := f.WaitEvents(t, 1)
	assert.Assert(t, is.Len(events, 1))
	assert.Check(t, is.Contains(events[0], "Normal GatewayWoken started the WireGuard gateway "+gateway+
		" for the scale-up of "+ours))

	f.write(t, map[string]string{ours: "InProgress"})
	f.write(t, map[string]string{ours: "InProgress", theirs: "NoActivity"})
	f.starts(t, 1)

	f.write(t, map[string]string{ours: "NoActivity"})
	f.write(t, map[string]string{ours: "InProgress"})
	f.starts(t, 2)
	looptest.WaitCounter(t, f.c.wakes.WithLabelValues(ResultRunning), 1)
	assert.Check(t, is.Len(f.Events(), 0), "no Event for a gateway that was up")
}

// A gateway that is still stopping refuses to start: the loop asks again every RetryEvery (on its clock) until it
// starts.
func TestRetriesAGatewayThatIsStillStopping(t *testing.T) {
	f := newFixture(t, fakeaws.EC2Instance{ID: gateway, State: "stopping", StartsRefused: 2})
	f.write(t, map[string]string{ours: "InProgress"})
	f.starts(t, 1)
	for i := 2; i <= 3; i++ {
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if f.Clock.HasWaiters() {
				return poll.Success()
			}
			return poll.Continue("no retry waits on the clock")
		})
		f.Clock.Step(DefaultRetryEvery)
		f.starts(t, i)
	}
	assert.Check(t, is.Equal(f.ec2.State(gateway), "running"))
	looptest.WaitCounter(t, f.c.wakes.WithLabelValues(ResultStarted), 1)
	assert.Check(t, is.Equal(f.wakes(t, ResultFailed), 0.0))
}

// A start EC2 refuses for good (here: no such instance) is not retried: it counts as failed, with a Warning Event
// that says the nodes' own wake-up is left.
func TestARefusedStartIsNotRetried(t *testing.T) {
	f := newFixture(t, fakeaws.EC2Instance{ID: "i-0fedcba9876543210", State: "stopped"})
	f.write(t, map[string]string{ours: "InProgress"})
	f.starts(t, 1)
	f.Clock.Step(DefaultRetryFor)
	f.starts(t, 1)
	looptest.WaitCounter(t, f.c.wakes.WithLabelValues(ResultFailed), 1)
	events := f.WaitEvents(t, 1)
	assert.Assert(t, is.Len(events, 1))
	assert.Check(t, is.Contains(events[0], "Warning GatewayWakeFailed cannot start the WireGuard gateway "+gateway))
	assert.Check(t, is.Contains(events[0], "InvalidInstanceID.NotFound"))
}

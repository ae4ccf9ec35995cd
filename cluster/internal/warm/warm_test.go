package warm

import (
	"context"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop/looptest"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

var t0 = time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)

const (
	x86 = "dev-builders-x86-20261206"
	arm = "dev-builders-arm-20261206"
)

// fixture is the loop against a fake Auto Scaling that knows the groups and a fake EC2 that knows their warm
// instances, wired as AWS is: an instance EC2 terminates leaves its warm pool and the group launches another.
type fixture struct {
	*looptest.Rig
	c     *Controller
	pools *fakeaws.WarmPools
	ec2   *fakeaws.EC2
}

func newFixture(t *testing.T, groups map[string]fakeaws.WarmGroup) *fixture {
	t.Helper()
	rig := looptest.New(t0)
	var known []fakeaws.EC2Instance
	var names []string
	for name, g := range groups {
		names = append(names, name)
		for _, in := range g.Instances {
			state := "stopped"
			if strings.HasPrefix(in.State, "Warmed:Running") {
				state = "running"
			}
			known = append(known, fakeaws.EC2Instance{ID: in.ID, State: state,
				Tags: map[string]string{"aws:autoscaling:groupName": name}})
		}
	}
	pools, asg := cloudtest.WarmPools(t, groups)
	fakeEC2, ec2c := cloudtest.EC2(t, known...)
	fakeEC2.OnTerminate(pools.Replace)
	c, err := New(Config{Groups: names, AutoScaling: asg, EC2: ec2c}, rig.Deps())
	assert.NilError(t, err)
	return &fixture{Rig: rig, c: c, pools: pools, ec2: fakeEC2}
}

func (f *fixture) stale(t *testing.T, group string) float64 {
	return looptest.Gauge(t, f.c.stale.WithLabelValues(group))
}

func (f *fixture) replaced(t *testing.T, result string) float64 {
	return looptest.Counter(t, f.c.replaced.WithLabelValues(result))
}

// terminateCalls counts the TerminateInstances calls EC2 had.
func (f *fixture) terminateCalls() int {
	n := 0
	for _, a := range f.ec2.Actions() {
		if a == "TerminateInstances" {
			n++
		}
	}
	return n
}

func TestConfigNamesWhatIsWrong(t *testing.T) {
	rig := looptest.New(t0)
	_, err := New(Config{Groups: []string{x86, ""}, Every: -time.Second}, rig.Deps())
	assert.Check(t, is.ErrorContains(err, "Groups must name"))
	assert.Check(t, is.ErrorContains(err, "AutoScaling is required"))
	assert.Check(t, is.ErrorContains(err, "EC2 is required"))
	assert.Check(t, is.ErrorContains(err, "Every must not be negative"))
}

// A `pulumi up` gives the group's template a new version: every warm instance launched from an older one that has
// finished its preparation is terminated at once, in one call, and the group replaces each from the new version;
// one still preparing is left for a later look, a current one and another group's are never touched, and a second
// look changes nothing.
func TestAVersionChangeReplacesTheStaleWarmInstancesAtOnce(t *testing.T) {
	f := newFixture(t, map[string]fakeaws.WarmGroup{
		x86: {Version: "3", Instances: []fakeaws.WarmInstance{
			{ID: "i-0a00000000000000a", Version: "3", State: "Warmed:Stopped"},
			{ID: "i-0b00000000000000b", Version: "3", State: "Warmed:Hibernated"},
			{ID: "i-0c00000000000000c", Version: "2", State: "Warmed:Running"},
			{ID: "i-0d00000000000000d", Version: "3", State: "Warmed:Pending:Wait"},
			{ID: "i-0e00000000000000e", Version: "3", State: "Warmed:Stopped"},
		}},
		arm: {Version: "7", Instances: []fakeaws.WarmInstance{
			{ID: "i-0f00000000000000f", Version: "7", State: "Warmed:Stopped"},
		}},
	})
	// Two instances a page: the loop reads every page.
	f.pools.PageSize(2)
	ctx := context.Background()

	// Before the change only the one launched from version 2 is stale.
	assert.NilError(t, f.c.Replace(ctx, x86))
	assert.Check(t, is.DeepEqual(f.ec2.Terminated(), []string{"i-0c00000000000000c"}))
	assert.Check(t, is.Equal(f.stale(t, x86), 1.0))

	f.pools.SetVersion(x86, "4")
	assert.NilError(t, f.c.Replace(ctx, x86))
	assert.NilError(t, f.c.Replace(ctx, arm))
	assert.Check(t, is.DeepEqual(f.ec2.Terminated(), []string{"i-0c00000000000000c",
		"i-0a00000000000000a", "i-0b00000000000000b", "i-0e00000000000000e"}))
	assert.Check(t, is.Equal(f.terminateCalls(), 2), "one call per look that found stale instances")
	// The three terminated, and two still preparing: d, and what the group launched for c from version 3.
	assert.Check(t, is.Equal(f.stale(t, x86), 5.0))
	assert.Check(t, is.Equal(f.stale(t, arm), 0.0))
	assert.Check(t, is.Equal(f.replaced(t, ResultTerminated), 4.0))
	assert.Check(t, is.Contains(f.Logs.String(),
		"instances=i-0a00000000000000a,i-0b00000000000000b,i-0e00000000000000e version=4 from=\"3 (3)\""))

	// What the group launched in their place is current; the stale ones still preparing wait.
	var current, preparing int
	for _, in := range f.pools.Warm(x86) {
		switch {
		case in.Version == "4":
			current++
		case in.Version == "3" && strings.HasPrefix(in.State, "Warmed:Pending"):
			preparing++
		default:
			t.Errorf("a stale instance left in the pool: %+v", in)
		}
	}
	assert.Check(t, is.Equal(current, 3))
	assert.Check(t, is.Equal(preparing, 2))

	calls := f.terminateCalls()
	assert.NilError(t, f.c.Replace(ctx, x86))
	assert.Check(t, is.Equal(f.terminateCalls(), calls), "a second look terminated again")
	assert.Check(t, is.Equal(f.stale(t, x86), 2.0))
	assert.Check(t, is.Contains(f.Logs.String(), "still preparing"))
}

// A group the loop cannot compare against is left alone, with an error that says why; a group without a warm pool
// is not asked for one.
func TestWhatTheLoopLeavesAlone(t *testing.T) {
	stale := []fakeaws.WarmInstance{{ID: "i-0a00000000000000a", Version: "1", State: "Warmed:Stopped"}}
	f := newFixture(t, map[string]fakeaws.WarmGroup{
		x86: {Version: "$Latest", Instances: stale},
		arm: {Version: "2", NoWarmPool: true},
	})
	ctx := context.Background()
	assert.Check(t, is.ErrorContains(f.c.Replace(ctx, x86), `launches launch template version "$Latest", not a version number`))
	assert.NilError(t, f.c.Replace(ctx, arm))
	assert.Check(t, is.ErrorContains(f.c.Replace(ctx, "gone-group"), "no group gone-group"))
	assert.Check(t, is.Len(f.ec2.Terminated(), 0))
	for _, call := range f.pools.Calls() {
		assert.Check(t, !strings.HasPrefix(call, "DescribeWarmPool"), "asked for a warm pool: %s", call)
	}
}

// EC2 refuses the termination: the error names the call, the instances count as failed, and the next look tries
// again; a failed read terminates nothing.
func TestRefusalsAreTriedAgainAtTheNextLook(t *testing.T) {
	f := newFixture(t, map[string]fakeaws.WarmGroup{
		x86: {Version: "2", Instances: []fakeaws.WarmInstance{{ID: "i-0a00000000000000a", Version: "1", State: "Warmed:Stopped"}}},
	})
	ctx := context.Background()
	f.pools.Fail("DescribeWarmPool", "Throttling")
	assert.Check(t, is.ErrorContains(f.c.Replace(ctx, x86), "autoscaling:DescribeWarmPool "+x86))
	f.pools.Fail("DescribeWarmPool", "")

	f.ec2.Fail(1, 403, "UnauthorizedOperation")
	assert.Check(t, is.ErrorContains(f.c.Replace(ctx, x86), "ec2:TerminateInstances i-0a00000000000000a"))
	assert.Check(t, is.Equal(f.replaced(t, ResultFailed), 1.0))
	assert.Check(t, is.Len(f.ec2.Terminated(), 0))

	assert.NilError(t, f.c.Replace(ctx, x86))
	assert.Check(t, is.DeepEqual(f.ec2.Terminated(), []string{"i-0a00000000000000a"}))
	assert.Check(t, is.Equal(f.replaced(t, ResultTerminated), 1.0))
}

// The running loop looks at every group at once and again every Every: a version change between two looks is
// acted on at the next, not before.
func TestTheLoopLooksAgainEveryEvery(t *testing.T) {
	f := newFixture(t, map[string]fakeaws.WarmGroup{
		x86: {Version: "5", Instances: []fakeaws.WarmInstance{{ID: "i-0a00000000000000a", Version: "5", State: "Warmed:Stopped"}}},
		arm: {Version: "1"},
	})
	looks := func(group string) int {
		n := 0
		for _, c := range f.pools.Calls() {
			if strings.HasPrefix(c, "DescribeWarmPool") && strings.Contains(c, "AutoScalingGroupName="+group) {
				n++
			}
		}
		return n
	}
	f.Run(t, f.c)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if looks(x86) >= 1 && looks(arm) >= 1 {
			return poll.Success()
		}
		return poll.Continue("looks: %d, %d", looks(x86), looks(arm))
	}, poll.WithTimeout(30*time.Second))
	f.pools.SetVersion(x86, "6")
	f.Clock.Step(DefaultEvery / 2)
	time.Sleep(100 * time.Millisecond)
	assert.Check(t, is.Len(f.ec2.Terminated(), 0), "acted before its next look")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(f.ec2.Terminated()) == 1 {
			return poll.Success()
		}
		f.Clock.Step(DefaultEvery / 2)
		return poll.Continue("terminated: %v", f.ec2.Terminated())
	}, poll.WithTimeout(30*time.Second))
	assert.Check(t, is.DeepEqual(f.ec2.Terminated(), []string{"i-0a00000000000000a"}))
}

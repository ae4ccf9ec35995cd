package cleanup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/cluster/internal/loop/looptest"

	"github.com/prometheus/client_golang/prometheus"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// t0 is the fake clock's time when a test starts.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const (
	notReadyAfter = 10 * time.Minute
	instanceID    = "i-0123456789abcdef0"
	nodeName      = instanceID
)

// poolNode is a pool Node of instance id in eu-central-1a (the fakes' region) whose Ready condition has had status
// since since.
func poolNode(id string, status corev1.ConditionStatus, since time.Time) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: id, UID: types.UID("uid-" + id), ResourceVersion: "7",
			Labels: map[string]string{kube.LabelPool: "burst", kube.LabelHostname: id},
		},
		Spec: corev1.NodeSpec{ProviderID: "aws:///" + cloudtest.Region + "a/" + id},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(t0.Add(-48 * time.Hour))},
			{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(since)},
		}},
	}
}

// fixture is one cleanup Controller on a fake clientset, a fake EC2 and a fake clock.
type fixture struct {
	c *Controller
	*looptest.Rig
	ec2 *fakeaws.EC2
}

// newFixture builds the Controller with server holding the API server's Nodes and EC2 knowing instances. The
// clientset's Node deletes honour preconditions as the API server does (a 409 Conflict when the UID or the
// resourceVersion differs): the fake tracker ignores them.
func newFixture(t *testing.T, server []*corev1.Node, instances ...fakeaws.EC2Instance) *fixture {
	t.Helper()
	rig := looptest.New(t0, server...)
	client := rig.Client
	client.PrependReactor("delete", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		del := a.(k8stesting.DeleteAction)
		obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", del.GetName())
		if err != nil {
			return true, nil, err
		}
		have := obj.(*corev1.Node)
		if pre := del.GetDeleteOptions().Preconditions; pre != nil {
			if pre.UID != nil && *pre.UID != have.UID {
				return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), del.GetName(),
					fmt.Errorf("precondition failed: UID in precondition: %s, UID in object meta: %s", *pre.UID, have.UID))
			}
			if pre.ResourceVersion != nil && *pre.ResourceVersion != have.ResourceVersion {
				return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), del.GetName(),
					fmt.Errorf("precondition failed: ResourceVersion in precondition: %s, in object meta: %s",
						*pre.ResourceVersion, have.ResourceVersion))
			}
		}
		return false, nil, nil
	})
	ec2Fake, ec2Client := cloudtest.EC2(t, instances...)
	f := &fixture{Rig: rig, ec2: ec2Fake}
	c, err := New(Config{PoolLabel: kube.LabelPool, Region: cloudtest.Region, NotReadyAfter: notReadyAfter, EC2: ec2Client},
		rig.Deps())
	assert.NilError(t, err)
	f.c = c
	return f
}

// deletes are the Node deletes sent, with their preconditions.
func (f *fixture) deletes() []k8stesting.DeleteAction {
	var out []k8stesting.DeleteAction
	for _, a := range f.Client.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && a.GetResource().Resource == "nodes" {
			out = append(out, d)
		}
	}
	return out
}

func (f *fixture) exists(t *testing.T, name string) bool {
	t.Helper()
	_, err := f.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	assert.NilError(t, err)
	return true
}

// TestCleanupRules is the old script's rule set, one row per rule: a Node is deleted only when it is a pool Node
// of an AWS instance of this region, NotReady (False or Unknown) for more than NotReadyAfter, and EC2 says its
// instance is shutting down, terminated or unknown; EC2 is asked only about a Node that passed every other rule;
// an instance that exists keeps its Node and is asked about again after Recheck; a failed DescribeInstances keeps the
// Node, fails the sync (a rate-limited retry), records a Warning and counts; a Node re-registered under the same
// name (another UID) or changed since it was judged (another resourceVersion) is not deleted by the stale decision.
func TestCleanupRules(t *testing.T) {
	old := t0.Add(-time.Hour)
	type row struct {
		name string
		// node is the Node in the informer's cache; server, when set, the API server's Node of that name.
		node, server *corev1.Node
		// state is the instance's in EC2; "" for an instance EC2 does not know.
		state string
		// ec2Down fails DescribeInstances.
		ec2Down bool

		deleted bool
		// asked is how many DescribeInstances calls the sync made.
		asked int
		// requeue is the Requeue the sync returns; 0 for none.
		requeue time.Duration
		// failed: the sync returns an error (a rate-limited retry), with errors_total{op=failedOp} at 1.
		failed   bool
		failedOp string
		// event is a fragment of the one Event recorded; "" for none.
		event string
	}
	with := func(n *corev1.Node, change func(*corev1.Node)) *corev1.Node {
		n = n.DeepCopy()
		change(n)
		return n
	}
	unknown := poolNode(nodeName, corev1.ConditionUnknown, old)
	rows := []row{
		{name: "pool label missing", node: with(unknown, func(n *corev1.Node) { delete(n.Labels, kube.LabelPool) }),
			state: "terminated"},
		{name: "on-prem providerID", node: with(unknown, func(n *corev1.Node) { n.Spec.ProviderID = "k3s://onprem-1" }),
			state: "terminated"},
		{name: "no providerID", node: with(unknown, func(n *corev1.Node) { n.Spec.ProviderID = "" }), state: "terminated"},
		{name: "zone of another region", state: "terminated",
			node: with(unknown, func(n *corev1.Node) { n.Spec.ProviderID = "aws:///eu-west-1a/" + instanceID })},
		{name: "zone of a region whose name is longer", state: "terminated",
			node: with(unknown, func(n *corev1.Node) { n.Spec.ProviderID = "aws:///eu-central-10a/" + instanceID })},
		{name: "local zone of the region, terminated", state: "terminated", deleted: true, asked: 1,
			event: "Normal DeletingStaleNode",
			node:  with(unknown, func(n *corev1.Node) { n.Spec.ProviderID = "aws:///eu-central-1-ham-1a/" + instanceID })},
		{name: "Ready", node: poolNode(nodeName, corev1.ConditionTrue, old), state: "terminated"},
		{name: "no Ready condition yet", state: "terminated",
			node: with(unknown, func(n *corev1.Node) { n.Status.Conditions = n.Status.Conditions[:1] })},
		{name: "being deleted", state: "terminated",
			node: with(unknown, func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{Time: t0} })},
		{name: "NotReady too recent", node: poolNode(nodeName, corev1.ConditionFalse, t0.Add(-9*time.Minute)),
			state: "terminated", requeue: time.Minute + time.Second},
		{name: "Unknown for exactly NotReadyAfter", node: poolNode(nodeName, corev1.ConditionUnknown, t0.Add(-notReadyAfter)),
			state: "terminated", requeue: time.Second},
		{name: "instance stopped", node: unknown, state: "stopped", asked: 1, requeue: Recheck},
		{name: "instance running", node: unknown, state: "running", asked: 1, requeue: Recheck},
		{name: "instance pending", node: unknown, state: "pending", asked: 1, requeue: Recheck},
		{name: "instance stopping", node: unknown, state: "stopping", asked: 1, requeue: Recheck},
		{name: "instance terminated", node: unknown, state: "terminated", asked: 1, deleted: true,
			event: "Normal DeletingStaleNode deleting the node of a gone instance: Ready=Unknown for 1h0m0s, more than 10m0s, and instance " + instanceID + " is terminated"},
		{name: "instance shutting-down, Ready False", node: poolNode(nodeName, corev1.ConditionFalse, old),
			state: "shutting-down", asked: 1, deleted: true, event: "is shutting-down"},
		{name: "instance unknown to EC2", node: unknown, asked: 1, deleted: true, event: "is unknown to EC2"},
		{name: "EC2 down", node: unknown, state: "terminated", ec2Down: true, asked: 1, failed: true,
			failedOp: opDescribe, event: "Warning StaleNodeCheckFailed cannot ask EC2 about instance " + instanceID},
		{name: "providerID names no instance", state: "terminated", failedOp: opJudge,
			node:  with(unknown, func(n *corev1.Node) { n.Spec.ProviderID = "aws:///eu-central-1a/" }),
			event: "Warning StaleNodeUnjudgeable"},
		{name: "re-registered under the same name", node: unknown, state: "terminated", asked: 1,
			server: with(unknown, func(n *corev1.Node) {
				n.UID = "uid-new"
				n.ResourceVersion = "7"
				n.Status.Conditions[1].Status = corev1.ConditionTrue
			}), event: "DeletingStaleNode"},
		{name: "changed since it was judged", node: unknown, state: "terminated", asked: 1,
			server: with(unknown, func(n *corev1.Node) { n.ResourceVersion = "8" }), event: "DeletingStaleNode"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			var instances []fakeaws.EC2Instance
			if r.state != "" {
				instances = append(instances, fakeaws.EC2Instance{ID: instanceID, State: r.state})
			}
			server := r.server
			if server == nil {
				server = r.node
			}
			f := newFixture(t, []*corev1.Node{server}, instances...)
			f.Cache(t, r.node)
			if r.ec2Down {
				f.ec2.Fail(-1, 503, "Unavailable")
			}

			err := f.c.sync(context.Background(), nodeName)

			var again loop.Requeue
			switch {
			case r.failed:
				assert.Assert(t, err != nil && !errors.As(err, &again), "sync: %v", err)
				assert.ErrorContains(t, err, instanceID)
			case r.requeue != 0:
				assert.Assert(t, errors.As(err, &again), "sync: %v", err)
				assert.Equal(t, again.After, r.requeue)
			default:
				assert.NilError(t, err)
			}
			assert.Equal(t, len(f.ec2.Actions()), r.asked, "DescribeInstances calls")
			assert.Equal(t, f.exists(t, nodeName), !r.deleted, "the Node exists")
			if r.deleted {
				assert.Equal(t, looptest.Counter(t, f.c.deleted), 1.0)
			} else {
				assert.Equal(t, looptest.Counter(t, f.c.deleted), 0.0)
			}
			for _, op := range []string{opDescribe, opDelete, opJudge} {
				want := 0.0
				if op == r.failedOp {
					want = 1
				}
				assert.Equal(t, looptest.Counter(t, f.c.errors.WithLabelValues(op)), want, "errors_total{op=%q}", op)
			}
			events := f.Events()
			if r.event == "" {
				assert.Equal(t, len(events), 0, "events: %q", events)
			} else {
				assert.Equal(t, len(events), 1, "events: %q", events)
				assert.Check(t, is.Contains(events[0], r.event))
			}
			// Every delete is of the object judged: its UID and resourceVersion as preconditions.
			for _, d := range f.deletes() {
				pre := d.GetDeleteOptions().Preconditions
				assert.Assert(t, pre != nil && pre.UID != nil && pre.ResourceVersion != nil, "preconditions %+v", pre)
				assert.Equal(t, *pre.UID, r.node.UID)
				assert.Equal(t, *pre.ResourceVersion, r.node.ResourceVersion)
			}
		})
	}
}

// TestInRegion: a zone is its region's when it is the region and one letter, or a Local or Wavelength Zone (the
// region, a dash and a name); a longer region's name that starts with this one's is another region.
func TestInRegion(t *testing.T) {
	for zone, want := range map[string]bool{
		"eu-central-1a":           true,
		"eu-central-1c":           true,
		"eu-central-1-ham-1a":     true,
		"us-east-1-wl1-bos-wlz-1": false, // another region's Wavelength Zone
		"eu-central-10a":          false,
		"eu-central-1":            false,
		"eu-central-1A":           false,
		"eu-central-1-":           false,
		"eu-central-1-1a":         false,
		"eu-west-1a":              false,
		"":                        false,
	} {
		assert.Check(t, inRegion(zone, "eu-central-1") == want, "zone %q", zone)
	}
	assert.Check(t, inRegion("us-east-1-wl1-bos-wlz-1", "us-east-1"))
}

// TestNoEC2CallBeforeNotReadyAfter runs the loop on a fake clock: a pool Node NotReady for one minute of ten is
// judged when the informer delivers it, without an EC2 call, and requeued on the loop's clock; when the clock passes
// the threshold the loop asks EC2 once and deletes the Node. A Ready pool Node beside it is never asked about.
func TestNoEC2CallBeforeNotReadyAfter(t *testing.T) {
	stale := poolNode(nodeName, corev1.ConditionUnknown, t0.Add(-time.Minute))
	ready := poolNode("i-0aaaaaaaaaaaaaaa1", corev1.ConditionTrue, t0.Add(-time.Hour))
	f := newFixture(t, []*corev1.Node{stale, ready}, fakeaws.EC2Instance{ID: instanceID, State: "terminated"},
		fakeaws.EC2Instance{ID: ready.Name, State: "running"})
	f.Run(t, f.c)

	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if strings.Contains(f.Logs.String(), "msg=keep loop=cleanup node="+nodeName) &&
			strings.Contains(f.Logs.String(), "msg=skip loop=cleanup node="+ready.Name) {
			return poll.Success()
		}
		return poll.Continue("the loop has not judged both Nodes yet:\n%s", f.Logs.String())
	}, poll.WithTimeout(30*time.Second))
	f.WaitRequeued(t, nodeName, 1)
	assert.Equal(t, len(f.ec2.Actions()), 0, "DescribeInstances before NotReadyAfter")
	assert.Assert(t, f.exists(t, nodeName))

	f.Clock.Step(notReadyAfter - time.Minute + time.Second)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if f.exists(t, nodeName) {
			return poll.Continue("the Node is still there")
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second))
	assert.DeepEqual(t, f.ec2.Filters(), []map[string][]string{{"instance-id": {instanceID}}})
	assert.Assert(t, f.exists(t, ready.Name))
	looptest.WaitCounter(t, f.c.deleted, 1)
}

// TestRecheckWhileTheInstanceExists: a due Node whose instance is stopped is kept, and asked about again once per
// Recheck on the loop's clock, not sooner.
func TestRecheckWhileTheInstanceExists(t *testing.T) {
	f := newFixture(t, []*corev1.Node{poolNode(nodeName, corev1.ConditionUnknown, t0.Add(-time.Hour))},
		fakeaws.EC2Instance{ID: instanceID, State: "stopped"})
	f.Run(t, f.c)
	calls := func(want int) {
		t.Helper()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if n := len(f.ec2.Actions()); n >= want {
				return poll.Success()
			}
			return poll.Continue("DescribeInstances calls: %d of %d", len(f.ec2.Actions()), want)
		}, poll.WithTimeout(30*time.Second))
	}
	calls(1)
	f.WaitRequeued(t, nodeName, 1)
	f.Clock.Step(Recheck - time.Second)
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, len(f.ec2.Actions()), 1, "asked again before Recheck")
	f.Clock.Step(time.Second)
	calls(2)
	assert.Equal(t, len(f.ec2.Actions()), 2)
	assert.Assert(t, f.exists(t, nodeName))
}

// TestEC2FailureIsRetried: a failed DescribeInstances keeps the Node and is retried rate-limited (on the loop's
// clock); once EC2 answers terminated, the Node goes.
func TestEC2FailureIsRetried(t *testing.T) {
	f := newFixture(t, []*corev1.Node{poolNode(nodeName, corev1.ConditionUnknown, t0.Add(-time.Hour))},
		fakeaws.EC2Instance{ID: instanceID, State: "terminated"})
	f.ec2.Fail(1, 500, "InternalError")
	f.Run(t, f.c)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if !f.exists(t, nodeName) {
			return poll.Success()
		}
		// The retry waits out the rate limiter's back-off on the fake clock.
		f.Clock.Step(time.Second)
		return poll.Continue("the Node is still there after %d calls", len(f.ec2.Actions()))
	}, poll.WithTimeout(30*time.Second))
	assert.Equal(t, len(f.ec2.Actions()), 2)
	assert.Equal(t, looptest.Counter(t, f.c.errors.WithLabelValues(opDescribe)), 1.0)
	events := f.Events()
	assert.Assert(t, len(events) == 2, "events: %q", events)
	assert.Check(t, is.Contains(events[0], "Warning StaleNodeCheckFailed"))
	assert.Check(t, is.Contains(events[1], "Normal DeletingStaleNode"))
}

// TestDueNodesShareOneCall runs the loop with two due Nodes (instances terminated and stopped), a Ready one and one
// not due yet: a single DescribeInstances asks about the two due instances, and only them; the Node of the
// terminated one goes, the others stay.
func TestDueNodesShareOneCall(t *testing.T) {
	gone := poolNode("i-0aaaaaaaaaaaaaaa1", corev1.ConditionUnknown, t0.Add(-time.Hour))
	stopped := poolNode("i-0aaaaaaaaaaaaaaa2", corev1.ConditionFalse, t0.Add(-2*time.Hour))
	ready := poolNode("i-0aaaaaaaaaaaaaaa3", corev1.ConditionTrue, t0.Add(-time.Hour))
	recent := poolNode("i-0aaaaaaaaaaaaaaa4", corev1.ConditionUnknown, t0.Add(-time.Minute))
	f := newFixture(t, []*corev1.Node{gone, stopped, ready, recent},
		fakeaws.EC2Instance{ID: gone.Name, State: "terminated"}, fakeaws.EC2Instance{ID: stopped.Name, State: "stopped"},
		fakeaws.EC2Instance{ID: ready.Name, State: "running"}, fakeaws.EC2Instance{ID: recent.Name, State: "terminated"})
	f.Run(t, f.c)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if !f.exists(t, gone.Name) && strings.Contains(f.Logs.String(), "msg=keep loop=cleanup node="+stopped.Name+" ") &&
			strings.Contains(f.Logs.String(), "state=stopped") {
			return poll.Success()
		}
		return poll.Continue("not judged yet:\n%s", f.Logs.String())
	}, poll.WithTimeout(30*time.Second))
	assert.DeepEqual(t, f.ec2.Filters(), []map[string][]string{{"instance-id": {gone.Name, stopped.Name}}})
	for _, n := range []*corev1.Node{stopped, ready, recent} {
		assert.Check(t, f.exists(t, n.Name), n.Name)
	}
}

// TestDeleteFailureIsCounted: a delete the API server refuses (other than a changed or gone Node) fails the sync,
// for a rate-limited retry, and counts as errors_total{op="delete"}; the Node stays.
func TestDeleteFailureIsCounted(t *testing.T) {
	node := poolNode(nodeName, corev1.ConditionUnknown, t0.Add(-time.Hour))
	f := newFixture(t, []*corev1.Node{node}, fakeaws.EC2Instance{ID: instanceID, State: "terminated"})
	f.Client.PrependReactor("delete", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), nodeName, errors.New("RBAC says no"))
	})
	f.Cache(t, node)

	err := f.c.sync(context.Background(), nodeName)
	var again loop.Requeue
	assert.Assert(t, err != nil && !errors.As(err, &again), "sync: %v", err)
	assert.ErrorContains(t, err, "RBAC says no")
	assert.Assert(t, f.exists(t, nodeName))
	assert.Equal(t, looptest.Counter(t, f.c.errors.WithLabelValues(opDelete)), 1.0)
	assert.Equal(t, looptest.Counter(t, f.c.deleted), 0.0)
}

// TestNewValidatesConfig: each required field missing or malformed is an error naming it; Workers defaults to 2;
// the metrics are registered, every errors_total op at zero.
func TestNewValidatesConfig(t *testing.T) {
	_, ec2Client := cloudtest.EC2(t)
	valid := Config{PoolLabel: kube.LabelPool, Region: "eu-central-1", NotReadyAfter: time.Minute, EC2: ec2Client}
	deps := func(reg prometheus.Registerer) loop.Deps {
		client := fake.NewClientset()
		return loop.Deps{Client: client, Informers: informers.NewSharedInformerFactory(client, 0),
			Recorder: record.NewFakeRecorder(1), Metrics: reg, Log: slog.New(slog.DiscardHandler),
			Clock: clocktesting.NewFakeClock(t0)}
	}
	for _, r := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no pool label", func(c *Config) { c.PoolLabel = "" }, "PoolLabel is required"},
		{"bad pool label", func(c *Config) { c.PoolLabel = "not a/label/key" }, "PoolLabel"},
		{"no region", func(c *Config) { c.Region = "" }, "Region is required"},
		{"no threshold", func(c *Config) { c.NotReadyAfter = 0 }, "NotReadyAfter must be positive"},
		{"negative workers", func(c *Config) { c.Workers = -1 }, "Workers must not be negative"},
		{"no EC2", func(c *Config) { c.EC2 = nil }, "EC2 is required"},
	} {
		t.Run(r.name, func(t *testing.T) {
			cfg := valid
			r.change(&cfg)
			_, err := New(cfg, deps(prometheus.NewRegistry()))
			assert.ErrorContains(t, err, r.want)
		})
	}
	reg := prometheus.NewRegistry()
	c, err := New(valid, deps(reg))
	assert.NilError(t, err)
	assert.Equal(t, c.cfg.Workers, 2)
	assert.Equal(t, c.Name(), "cleanup")
	families, err := reg.Gather()
	assert.NilError(t, err)
	series := map[string]int{}
	for _, mf := range families {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	assert.DeepEqual(t, series, map[string]int{
		"dynk8s_controller_cleanup_deleted_total": 1, "dynk8s_controller_cleanup_errors_total": 3})
	_, err = New(valid, deps(reg))
	assert.ErrorContains(t, err, "registering metrics")
}

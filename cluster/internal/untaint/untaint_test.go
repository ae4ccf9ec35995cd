package untaint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/cluster/internal/loop/looptest"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// t0 is the fake clock's time when a test starts.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const nodeName = "i-0123456789abcdef0"

// fuseTaint is the startup taint as a Node carries it.
var fuseTaint = corev1.Taint{Key: kube.FuseStartupTaint.Key, Value: kube.FuseStartupTaint.Value,
	Effect: corev1.TaintEffect(kube.FuseStartupTaint.Effect)}

// otherTaints are taints a pool Node may carry besides the fuse one: the pool's own and the node lifecycle
// controller's.
var otherTaints = []corev1.Taint{
	{Key: "dedicated", Value: "burst", Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute, TimeAdded: &metav1.Time{Time: t0.Add(-time.Minute)}},
}

// poolNode is a pool Node created age before t0 with the fuse taint between otherTaints, advertising fuse devices
// of the fuse resource ("" for none).
func poolNode(age time.Duration, fuse string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: nodeName, UID: "uid-1", ResourceVersion: "1", CreationTimestamp: metav1.NewTime(t0.Add(-age)),
			Labels:      map[string]string{kube.LabelPool: "burst", kube.LabelHostname: nodeName},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{
			ProviderID: "aws:///eu-central-1a/" + nodeName,
			Taints:     []corev1.Taint{otherTaints[0], fuseTaint, otherTaints[1]},
		},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"),
		}},
	}
	if fuse != "" {
		n.Status.Allocatable[kube.FuseResource] = resource.MustParse(fuse)
	}
	return n
}

// minusFuse is n without the fuse taint: what the loop may send, and nothing else.
func minusFuse(n *corev1.Node) *corev1.Node {
	out := n.DeepCopy()
	out.Spec.Taints = []corev1.Taint{otherTaints[0], otherTaints[1]}
	return out
}

// fixture is one untaint Controller on a fake clientset and a fake clock.
type fixture struct {
	c *Controller
	*looptest.Rig
}

// newFixture builds the Controller with the API server holding nodes. The clientset's Node updates are checked
// against the stored resourceVersion as the API server does (409 Conflict when they differ); the fake tracker does
// not check it.
func newFixture(t *testing.T, nodes ...*corev1.Node) *fixture {
	t.Helper()
	rig := looptest.New(t0, nodes...)
	client := rig.Client
	client.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sent := a.(k8stesting.UpdateAction).GetObject().(*corev1.Node)
		obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", sent.Name)
		if err != nil {
			return true, nil, err
		}
		if have := obj.(*corev1.Node).ResourceVersion; have != sent.ResourceVersion {
			return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), sent.Name,
				fmt.Errorf("the object has been modified: resourceVersion %s, stored %s", sent.ResourceVersion, have))
		}
		return false, nil, nil
	})
	f := &fixture{Rig: rig}
	c, err := New(Config{PoolLabel: kube.LabelPool, TaintKey: kube.FuseStartupTaint.Key, Resource: kube.FuseResource},
		rig.Deps())
	assert.NilError(t, err)
	f.c = c
	return f
}

// updates are the Nodes the loop sent in Updates, in order.
func (f *fixture) updates() []*corev1.Node {
	var out []*corev1.Node
	for _, a := range f.Client.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetResource().Resource == "nodes" {
			out = append(out, u.GetObject().(*corev1.Node))
		}
	}
	return out
}

// verbs are the verbs of the clientset's Node calls, in order.
func (f *fixture) verbs() []string {
	var out []string
	for _, a := range f.Client.Actions() {
		if a.GetResource().Resource == "nodes" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			out = append(out, a.GetVerb())
		}
	}
	return out
}

// server is the API server's Node.
func (f *fixture) server(t *testing.T) *corev1.Node {
	t.Helper()
	n, err := f.Client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	assert.NilError(t, err)
	return n
}

// removed waits until the API server's Node has no fuse taint.
func (f *fixture) removed(t *testing.T) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, taint := range f.server(t).Spec.Taints {
			if taint.Key == fuseTaint.Key {
				return poll.Continue("the Node still has the taint")
			}
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second))
}

// waitLog waits until the loop has logged fragment.
func (f *fixture) waitLog(t *testing.T, fragment string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if strings.Contains(f.Logs.String(), fragment) {
			return poll.Success()
		}
		return poll.Continue("no %q in the log yet:\n%s", fragment, f.Logs.String())
	}, poll.WithTimeout(30*time.Second))
}

// TestAdvertisedRemovesOnlyTheTaint runs the loop: a pool Node that advertises the fuse resource loses the fuse
// taint in one Update whose object is the cached Node minus that taint, byte for byte otherwise (labels,
// annotations, the other taints in their order, the resourceVersion): what the admission policy admits. The
// latency from the Node's creation is observed, the outcome counted, no Event recorded.
func TestAdvertisedRemovesOnlyTheTaint(t *testing.T) {
	node := poolNode(30*time.Second, "5000")
	f := newFixture(t, node)
	f.Run(t, f.c)
	f.removed(t)
	looptest.WaitCounter(t, f.c.total.WithLabelValues(OutcomeAdvertised), 1)

	sent := f.updates()
	assert.Equal(t, len(sent), 1)
	assert.Equal(t, cmp.Diff(minusFuse(node), sent[0]), "", "the Update changes more than the taint")
	assert.DeepEqual(t, f.server(t).Labels, node.Labels)
	assert.Equal(t, looptest.Counter(t, f.c.total.WithLabelValues(OutcomeAdvertised)), 1.0)
	assert.Equal(t, looptest.Counter(t, f.c.total.WithLabelValues(OutcomeGaveUp)), 0.0)
	count, sum := looptest.Histogram(t, f.c.latency)
	assert.Equal(t, count, uint64(1))
	assert.Equal(t, sum, 30.0)
	assert.Equal(t, len(f.Events()), 0)
}

// TestNotAdvertisedGivesUp runs the loop on a fake clock: a pool Node created a minute ago that advertises no fuse
// keeps its taint, with no Update, until the give-up deadline four minutes on; then the taint goes anyway, with a
// Warning Event in the old script's words, counted as gave_up, the latency the full five minutes.
func TestNotAdvertisedGivesUp(t *testing.T) {
	node := poolNode(time.Minute, "")
	f := newFixture(t, node)
	f.Run(t, f.c)
	f.waitLog(t, "msg=keep loop=untaint node="+nodeName)
	f.WaitRequeued(t, nodeName, 1)
	assert.Equal(t, len(f.updates()), 0, "an Update before the give-up deadline")

	f.Clock.Step(DefaultGiveUp - time.Minute)
	f.removed(t)
	looptest.WaitCounter(t, f.c.total.WithLabelValues(OutcomeGaveUp), 1)
	sent := f.updates()
	assert.Equal(t, len(sent), 1)
	assert.Equal(t, cmp.Diff(minusFuse(node), sent[0]), "", "the Update changes more than the taint")
	events := f.WaitEvents(t, 1)
	assert.Equal(t, len(events), 1, "events: %q", events)
	assert.Check(t, is.Contains(events[0], "Warning "+ReasonGaveUp+" node advertises no github.com/fuse after 5m0s "+
		"(is the device plugin running?): removed the startup taint "+fuseTaint.Key+" so that other pods can run"))
	assert.Equal(t, looptest.Counter(t, f.c.total.WithLabelValues(OutcomeGaveUp)), 1.0)
	assert.Equal(t, looptest.Counter(t, f.c.total.WithLabelValues(OutcomeAdvertised)), 0.0)
	count, sum := looptest.Histogram(t, f.c.latency)
	assert.Equal(t, count, uint64(1))
	assert.Equal(t, sum, DefaultGiveUp.Seconds())
}

// TestAdvertisedLater runs the loop: a Node that advertises nothing at first waits; the status update that brings
// the resource lifts the taint at once, without the clock moving, as advertised.
func TestAdvertisedLater(t *testing.T) {
	node := poolNode(10*time.Second, "")
	f := newFixture(t, node)
	f.Run(t, f.c)
	f.waitLog(t, "msg=keep loop=untaint node="+nodeName)

	ready := f.server(t)
	ready.Status.Allocatable[kube.FuseResource] = resource.MustParse("5000")
	_, err := f.Client.CoreV1().Nodes().UpdateStatus(context.Background(), ready, metav1.UpdateOptions{})
	assert.NilError(t, err)
	f.removed(t)
	looptest.WaitCounter(t, f.c.total.WithLabelValues(OutcomeAdvertised), 1)
	assert.Equal(t, len(f.Events()), 0)
}

// TestConflictIsRetried: an Update refused for a stale resourceVersion (the kubelet changed the Node since the
// cache saw it) is retried on the Node read again from the API server, so that what the other writer changed stays
// and only the taint goes; the removal is counted once.
func TestConflictIsRetried(t *testing.T) {
	cached := poolNode(20*time.Second, "5000")
	current := cached.DeepCopy()
	current.ResourceVersion = "2"
	current.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] = "true"
	f := newFixture(t, current)
	f.Cache(t, cached)

	assert.NilError(t, f.c.sync(context.Background(), nodeName))
	assert.DeepEqual(t, f.verbs(), []string{"update", "get", "update"})
	sent := f.updates()
	assert.Equal(t, cmp.Diff(minusFuse(cached), sent[0]), "")
	assert.Equal(t, cmp.Diff(minusFuse(current), sent[1]), "")
	assert.Equal(t, cmp.Diff(minusFuse(current), f.server(t)), "")
	assert.Equal(t, looptest.Counter(t, f.c.total.WithLabelValues(OutcomeAdvertised)), 1.0)
	count, _ := looptest.Histogram(t, f.c.latency)
	assert.Equal(t, count, uint64(1))
}

// TestConflictWithTheTaintGone: when the Node read again no longer has the taint (another writer removed it), the
// loop sends nothing more and counts nothing.
func TestConflictWithTheTaintGone(t *testing.T) {
	cached := poolNode(20*time.Second, "5000")
	current := minusFuse(cached)
	current.ResourceVersion = "2"
	f := newFixture(t, current)
	f.Cache(t, cached)

	assert.NilError(t, f.c.sync(context.Background(), nodeName))
	assert.DeepEqual(t, f.verbs(), []string{"update", "get"})
	assert.Equal(t, looptest.Counter(t, f.c.total.WithLabelValues(OutcomeAdvertised)), 0.0)
}

// TestSyncDecisions is the decision table of one sync: which Nodes are the loop's (a pool Node with the taint), when
// the taint goes (the resource advertised, at once; else at the give-up deadline from the Node's creation or the
// taint's timeAdded) and what is left alone.
func TestSyncDecisions(t *testing.T) {
	with := func(n *corev1.Node, change func(*corev1.Node)) *corev1.Node {
		n = n.DeepCopy()
		change(n)
		return n
	}
	for _, r := range []struct {
		name string
		node *corev1.Node
		// outcome is the removal's outcome; "" for a Node left as it is.
		outcome string
		// requeue is the Requeue the sync returns; 0 for none.
		requeue time.Duration
	}{
		{name: "advertised", node: poolNode(time.Minute, "5000"), outcome: OutcomeAdvertised},
		{name: "advertised, the taint's value and effect differ", outcome: OutcomeAdvertised,
			node: with(poolNode(time.Minute, "1"), func(n *corev1.Node) {
				n.Spec.Taints[1] = corev1.Taint{Key: fuseTaint.Key, Effect: corev1.TaintEffectNoExecute}
			})},
		{name: "not a pool node", node: with(poolNode(time.Hour, "5000"), func(n *corev1.Node) { delete(n.Labels, kube.LabelPool) })},
		{name: "no taint", node: with(poolNode(time.Hour, ""), func(n *corev1.Node) { n.Spec.Taints = otherTaints })},
		{name: "no resource yet", node: poolNode(time.Minute, ""), requeue: 4 * time.Minute},
		{name: "zero of the resource", node: poolNode(time.Minute, "0"), requeue: 4 * time.Minute},
		{name: "at the give-up deadline", node: poolNode(DefaultGiveUp, ""), outcome: OutcomeGaveUp},
		{name: "past the give-up deadline", node: poolNode(time.Hour, "0"), outcome: OutcomeGaveUp},
		{name: "the deadline counts from the taint's timeAdded", requeue: 3 * time.Minute,
			node: with(poolNode(time.Hour, ""), func(n *corev1.Node) {
				n.Spec.Taints[1].TimeAdded = &metav1.Time{Time: t0.Add(-2 * time.Minute)}
			})},
	} {
		t.Run(r.name, func(t *testing.T) {
			f := newFixture(t, r.node)
			f.Cache(t, r.node)

			err := f.c.sync(context.Background(), nodeName)

			var again loop.Requeue
			if r.requeue != 0 {
				assert.Assert(t, errors.As(err, &again), "sync: %v", err)
				assert.Equal(t, again.After, r.requeue)
			} else {
				assert.NilError(t, err)
			}
			sent := f.updates()
			if r.outcome == "" {
				assert.Equal(t, len(sent), 0)
			} else {
				assert.Equal(t, len(sent), 1)
				want := r.node.DeepCopy()
				want.Spec.Taints = otherTaints
				assert.Equal(t, cmp.Diff(want, sent[0]), "")
			}
			for _, o := range []string{OutcomeAdvertised, OutcomeGaveUp} {
				want := 0.0
				if o == r.outcome {
					want = 1
				}
				assert.Equal(t, looptest.Counter(t, f.c.total.WithLabelValues(o)), want, "untaint_total{outcome=%q}", o)
			}
			if r.outcome == OutcomeGaveUp {
				assert.Equal(t, len(f.Events()), 1)
			} else {
				assert.Equal(t, len(f.Events()), 0)
			}
		})
	}
}

// TestNonPoolNodeUntouched runs the loop with a Node that carries the taint but not the pool label, next to a pool
// Node: only the pool Node is updated, the other is never even read again.
func TestNonPoolNodeUntouched(t *testing.T) {
	onPrem := poolNode(time.Hour, "")
	onPrem.Name = "onprem-1"
	delete(onPrem.Labels, kube.LabelPool)
	f := newFixture(t, onPrem, poolNode(time.Minute, "1"))
	f.Run(t, f.c)
	f.removed(t)
	sent := f.updates()
	assert.Equal(t, len(sent), 1)
	assert.Equal(t, sent[0].Name, nodeName)
	n, err := f.Client.CoreV1().Nodes().Get(context.Background(), onPrem.Name, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, n.Spec.Taints, onPrem.Spec.Taints)
}

// TestNewValidatesConfig: each required field missing or malformed is an error naming it; GiveUp defaults to five
// minutes; the metrics are registered, both outcomes at zero.
func TestNewValidatesConfig(t *testing.T) {
	valid := Config{PoolLabel: kube.LabelPool, TaintKey: fuseTaint.Key, Resource: kube.FuseResource}
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
		{"no taint key", func(c *Config) { c.TaintKey = "" }, "TaintKey is required"},
		{"bad taint key", func(c *Config) { c.TaintKey = "a b" }, "TaintKey"},
		{"no resource", func(c *Config) { c.Resource = "" }, "Resource is required"},
		{"negative give-up", func(c *Config) { c.GiveUp = -time.Second }, "GiveUp must not be negative"},
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
	assert.Equal(t, c.cfg.GiveUp, 5*time.Minute)
	assert.Equal(t, c.Name(), "untaint")
	families, err := reg.Gather()
	assert.NilError(t, err)
	series := map[string]int{}
	for _, mf := range families {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	assert.DeepEqual(t, series, map[string]int{
		"dynk8s_controller_untaint_latency_seconds": 1, "dynk8s_controller_untaint_total": 2})
	_, err = New(valid, deps(reg))
	assert.ErrorContains(t, err, "registering metrics")
}

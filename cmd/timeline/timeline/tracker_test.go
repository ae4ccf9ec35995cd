package timeline_test

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynk8s/dynk8s/cmd/timeline/timeline"
	"github.com/dynk8s/dynk8s/internal/kube"
)

var t0 = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func node(name, pool string, ready bool, fuse int64) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelPool: pool}}}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}
	if fuse > 0 {
		n.Status.Allocatable = corev1.ResourceList{kube.FuseResource: *resource.NewQuantity(fuse, resource.DecimalSI)}
	}
	return n
}

func pod(name, nodeName string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
	p.Spec.NodeName, p.Status.Phase = nodeName, phase
	return p
}

func event(podName, reason, msg string) *corev1.Event {
	return &corev1.Event{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: podName}, Reason: reason, Message: msg}
}

func phases(steps []timeline.Step) []timeline.Phase {
	var out []timeline.Phase
	for _, s := range steps {
		out = append(out, s.Phase)
	}
	return out
}

// TestScaleUpTimeline: a whole scale-up, each phase once, in order, at the time it was seen; the other pool's node,
// the other pod's event and repeats of a phase change nothing.
func TestScaleUpTimeline(t *testing.T) {
	tr := timeline.NewTracker("builders", "p", true, []string{"old"}, t0)
	assert.Check(t, !tr.Done())
	assert.Check(t, tr.Event(event("other", "TriggeredScaleUp", "x"), at(1)) == nil)
	assert.DeepEqual(t, phases(tr.Event(event("p", "TriggeredScaleUp", "pod triggered scale-up: [{asg 0->1 (max: 4)}]"), at(2.5))),
		[]timeline.Phase{timeline.ScaleUpTriggered})
	assert.Check(t, tr.Event(event("p", "TriggeredScaleUp", "again"), at(12)) == nil, "a phase is reported once")
	assert.Check(t, tr.Node(node("i-other", "gpu", true, 0), at(20)) == nil, "another pool's node")
	assert.Check(t, tr.Node(node("old", "builders", true, 5000), at(21)) == nil, "a node from before the pod")
	assert.DeepEqual(t, phases(tr.Node(node("i-new", "builders", false, 0), at(40))), []timeline.Phase{timeline.NodeRegistered})
	assert.Check(t, tr.Node(node("i-new", "builders", false, 0), at(41)) == nil)
	assert.DeepEqual(t, phases(tr.Node(node("i-new", "builders", true, 0), at(43))), []timeline.Phase{timeline.NodeReady})
	assert.DeepEqual(t, phases(tr.Node(node("i-new", "builders", true, 5000), at(45.25))), []timeline.Phase{timeline.FuseAdvertised})
	assert.DeepEqual(t, phases(tr.Pod(pod("p", "", corev1.PodPending), at(45.5))), []timeline.Phase(nil))
	assert.DeepEqual(t, phases(tr.Pod(pod("p", "i-new", corev1.PodPending), at(46))), []timeline.Phase{timeline.PodScheduled})
	assert.Check(t, !tr.Done())
	assert.DeepEqual(t, phases(tr.Pod(pod("p", "i-new", corev1.PodRunning), at(47.75))), []timeline.Phase{timeline.PodRunning})
	assert.Check(t, tr.Done())
	assert.DeepEqual(t, tr.Missing(), []timeline.Phase(nil))

	var lines []string
	var prev time.Duration
	for _, s := range tr.Steps() {
		lines = append(lines, s.Line(prev))
		prev = s.At
	}
	assert.DeepEqual(t, lines, []string{
		"   +0.0s            pod created: p",
		"   +2.5s   (+2.5s)  scale-up triggered: pod triggered scale-up: [{asg 0->1 (max: 4)}]",
		"  +40.0s  (+37.5s)  node registered: i-new",
		"  +43.0s   (+3.0s)  node Ready",
		"  +45.2s   (+2.2s)  fuse advertised: github.com/fuse",
		"  +46.0s   (+0.8s)  pod scheduled: on i-new",
		"  +47.8s   (+1.8s)  pod Running",
	})
}

// TestNodeSeenLate: a node first seen Ready and advertising fuse gives its three phases at once, in order; a Ready
// node is not reported before it registered, nor Running before scheduled.
func TestNodeSeenLate(t *testing.T) {
	tr := timeline.NewTracker("builders", "p", true, nil, t0)
	assert.DeepEqual(t, phases(tr.Node(node("i-1", "builders", true, 3), at(30))),
		[]timeline.Phase{timeline.NodeRegistered, timeline.NodeReady, timeline.FuseAdvertised})
	assert.DeepEqual(t, phases(tr.Pod(pod("p", "i-1", corev1.PodRunning), at(31))),
		[]timeline.Phase{timeline.PodScheduled, timeline.PodRunning})
	assert.DeepEqual(t, tr.Missing(), []timeline.Phase{timeline.ScaleUpTriggered}) // no autoscaler event seen
}

// TestWithoutFuse: a pod that requests no fuse device does not wait for the node to advertise it.
func TestWithoutFuse(t *testing.T) {
	tr := timeline.NewTracker("builders", "p", false, nil, t0)
	assert.DeepEqual(t, phases(tr.Node(node("i-1", "builders", true, 5000), at(30))),
		[]timeline.Phase{timeline.NodeRegistered, timeline.NodeReady})
	assert.DeepEqual(t, tr.Missing(), []timeline.Phase{timeline.ScaleUpTriggered, timeline.PodScheduled, timeline.PodRunning})
}

// TestPodOnAnotherNode: the timeline follows the first new node, and switches to the node the pod is bound to.
func TestPodOnAnotherNode(t *testing.T) {
	tr := timeline.NewTracker("builders", "p", false, nil, t0)
	tr.Node(node("i-1", "builders", false, 0), at(30))
	assert.Check(t, tr.Node(node("i-2", "builders", true, 0), at(31)) == nil, "i-2 is not followed yet")
	steps := tr.Pod(pod("p", "i-2", corev1.PodPending), at(33))
	assert.DeepEqual(t, phases(steps), []timeline.Phase{timeline.Note, timeline.NodeReady, timeline.PodScheduled})
	assert.Check(t, is.Contains(steps[0].Detail, "not to i-1"))
	assert.Equal(t, steps[1].At, 31*time.Second, "when i-2 was seen Ready")
}

// TestNoScaleUpNeeded: a pod bound to a node from before it says so; the autoscaler's reason not to scale up is
// noted once per message.
func TestNoScaleUpNeeded(t *testing.T) {
	tr := timeline.NewTracker("builders", "p", false, []string{"old"}, t0)
	notes := tr.Event(event("p", "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached"), at(3))
	assert.Equal(t, len(notes), 1)
	assert.Check(t, is.Contains(notes[0].Line(0), "note: no scale-up: pod didn't trigger"))
	assert.Check(t, tr.Event(event("p", "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached"), at(13)) == nil)
	steps := tr.Pod(pod("p", "old", corev1.PodRunning), at(14))
	assert.DeepEqual(t, phases(steps), []timeline.Phase{timeline.Note, timeline.PodScheduled, timeline.PodRunning})
	assert.Check(t, strings.Contains(steps[0].Detail, "no scale-up was needed"))
	assert.Check(t, tr.Done())
}

// TestPodSpec: the pod selects the pool, tolerates exactly its taints (not the nodes' startup taint), asks for a
// fuse device only when told, and needs no pull of its own.
func TestPodSpec(t *testing.T) {
	o := timeline.Options{Namespace: "ci", Pool: "arm", Image: "registry.k8s.io/pause:3.10",
		Taints: []kube.Taint{{Key: "example.com/spot", Value: "true", Effect: kube.NoSchedule}}}
	p := timeline.Pod(o, "dynk8s-timeline-0a")
	assert.DeepEqual(t, p.Spec.NodeSelector, map[string]string{kube.LabelPool: "arm"})
	assert.DeepEqual(t, p.Spec.Tolerations, []corev1.Toleration{{Key: "example.com/spot", Operator: corev1.TolerationOpEqual,
		Value: "true", Effect: corev1.TaintEffectNoSchedule}})
	_, fuse := p.Spec.Containers[0].Resources.Limits[kube.FuseResource]
	assert.Check(t, !fuse)
	o.Fuse = true
	q := timeline.Pod(o, "x").Spec.Containers[0].Resources.Limits[kube.FuseResource]
	assert.Equal(t, q.String(), "1")
	assert.Equal(t, p.Labels["app.kubernetes.io/name"], timeline.AppLabel)
}

// TestMainRefuses: bad usage exits 2, a pool the stack lacks exits 1 naming the pools, and neither touches a
// cluster.
func TestMainRefuses(t *testing.T) {
	var out, errs strings.Builder
	assert.Equal(t, timeline.Main(t.Context(), []string{"-config", "../../../Pulumi.dev.yaml"}, &out, &errs), 2)
	assert.Check(t, is.Contains(errs.String(), "usage"))
	errs.Reset()
	assert.Equal(t, timeline.Main(t.Context(), []string{"-config", "../../../Pulumi.dev.yaml", "-pool", "gpu"}, &out, &errs), 1)
	assert.Check(t, is.Contains(errs.String(), `no node pool "gpu" (pools: [builders-x86 builders-arm])`))
	errs.Reset()
	assert.Equal(t, timeline.Main(t.Context(), []string{"-config", "../../../Pulumi.dev.yaml", "-pool", "builders-arm",
		"-kubeconfig", "/nonexistent/kubeconfig"}, &out, &errs), 1)
	assert.Check(t, is.Contains(errs.String(), "kubeconfig"))
	assert.Equal(t, out.String(), "")
}

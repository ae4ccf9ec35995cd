// Package timeline measures a scale-up on a real cluster: one pending pod aimed at a pool, and what the cluster
// does about it, phase by phase (cmd/timeline). The Tracker turns watched objects into the timeline's steps and
// holds no client; Run drives it from the API server.
package timeline

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodeutil "k8s.io/component-helpers/node/util"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// Phase is one step of a scale-up, in the order a scale-up goes through them.
type Phase int

// The phases. Note is not a phase of the scale-up: a remark (the autoscaler's reason not to scale up, a pod on a
// node the timeline did not follow) printed where it happened.
const (
	PodCreated Phase = iota
	ScaleUpTriggered
	NodeRegistered
	NodeReady
	FuseAdvertised
	PodScheduled
	PodRunning
	Note
)

var phaseNames = [...]string{"pod created", "scale-up triggered", "node registered", "node Ready",
	"fuse advertised", "pod scheduled", "pod Running", "note"}

func (p Phase) String() string { return phaseNames[p] }

// Autoscaler event reasons on a pending pod (cluster-autoscaler/core/scaleup/orchestrator at
// cluster-autoscaler-1.34.5: "TriggeredScaleUp" and "NotTriggerScaleUp").
const (
	reasonTriggeredScaleUp = "TriggeredScaleUp"
	reasonNotTriggered     = "NotTriggerScaleUp"
)

// Step is one line of the timeline.
type Step struct {
	Phase Phase
	// At is the time since the pod was created.
	At     time.Duration
	Detail string
}

// Line formats the step with its time since the pod was created and, for phases, the time since prev (the
// previous phase's At).
func (s Step) Line(prev time.Duration) string {
	since := fmt.Sprintf("(+%.1fs)", (s.At - prev).Seconds())
	if s.Phase == Note || s.Phase == PodCreated {
		since = ""
	}
	line := fmt.Sprintf("%8s %9s  %s", fmt.Sprintf("+%.1fs", s.At.Seconds()), since, s.Phase)
	if s.Detail != "" {
		line += ": " + s.Detail
	}
	return line
}

// nodeSeen is when the tracker first saw a new pool node reach each node phase.
type nodeSeen struct {
	at map[Phase]time.Duration
}

// Tracker follows one pod aimed at one pool, and the pool's node that comes up for it: the first pool node that
// registers after the pod was created, or the node the pod is bound to when that is another one.
type Tracker struct {
	pool     string
	fuse     bool
	podName  string
	start    time.Time
	existing map[string]bool
	nodes    map[string]*nodeSeen
	follow   string
	done     map[Phase]bool
	notes    map[string]bool
	steps    []Step
}

// NewTracker starts a timeline at start, when the pod named podName was created. existing are the pool's nodes
// from before it (they do not count as registering for it); fuse says whether the pod requests github.com/fuse, so
// that the node's advertising it is a phase.
func NewTracker(pool, podName string, fuse bool, existing []string, start time.Time) *Tracker {
	t := &Tracker{pool: pool, fuse: fuse, podName: podName, start: start, existing: map[string]bool{},
		nodes: map[string]*nodeSeen{}, done: map[Phase]bool{}, notes: map[string]bool{}}
	for _, n := range existing {
		t.existing[n] = true
	}
	t.emit(PodCreated, 0, podName)
	return t
}

func (t *Tracker) emit(p Phase, at time.Duration, detail string) []Step {
	if p != Note {
		if t.done[p] {
			return nil
		}
		t.done[p] = true
	}
	s := Step{Phase: p, At: at, Detail: detail}
	t.steps = append(t.steps, s)
	return []Step{s}
}

// Steps are the steps so far, in the order they happened.
func (t *Tracker) Steps() []Step { return t.steps }

// Done reports whether the pod runs: the end of the timeline.
func (t *Tracker) Done() bool { return t.done[PodRunning] }

// Missing are the phases not reached yet, in order (for a timeline cut short).
func (t *Tracker) Missing() []Phase {
	var out []Phase
	for p := ScaleUpTriggered; p <= PodRunning; p++ {
		if !t.done[p] && (p != FuseAdvertised || t.fuse) {
			out = append(out, p)
		}
	}
	return out
}

// Event takes an event the API server delivered at at; only the autoscaler's events on the pod count.
func (t *Tracker) Event(ev *corev1.Event, at time.Time) []Step {
	if ev.InvolvedObject.Kind != "Pod" || ev.InvolvedObject.Name != t.podName {
		return nil
	}
	switch ev.Reason {
	case reasonTriggeredScaleUp:
		return t.emit(ScaleUpTriggered, at.Sub(t.start), ev.Message)
	case reasonNotTriggered:
		if t.notes[ev.Message] {
			return nil
		}
		t.notes[ev.Message] = true
		return t.emit(Note, at.Sub(t.start), "no scale-up: "+ev.Message)
	}
	return nil
}

// Node takes a node as the API server delivered it at at.
func (t *Tracker) Node(n *corev1.Node, at time.Time) []Step {
	if n.Labels[kube.LabelPool] != t.pool || t.existing[n.Name] {
		return nil
	}
	seen := t.nodes[n.Name]
	if seen == nil {
		seen = &nodeSeen{at: map[Phase]time.Duration{NodeRegistered: at.Sub(t.start)}}
		t.nodes[n.Name] = seen
	}
	if _, ok := seen.at[NodeReady]; !ok && nodeReady(n) {
		seen.at[NodeReady] = at.Sub(t.start)
	}
	if _, ok := seen.at[FuseAdvertised]; !ok && t.fuse {
		if q, has := n.Status.Allocatable[corev1.ResourceName(kube.FuseResource)]; has && !q.IsZero() {
			seen.at[FuseAdvertised] = at.Sub(t.start)
		}
	}
	if t.follow == "" {
		t.follow = n.Name
	}
	return t.nodeSteps()
}

// nodeSteps emits the followed node's phases not emitted yet, in order.
func (t *Tracker) nodeSteps() []Step {
	seen := t.nodes[t.follow]
	if seen == nil {
		return nil
	}
	var out []Step
	for _, p := range []Phase{NodeRegistered, NodeReady, FuseAdvertised} {
		at, ok := seen.at[p]
		if !ok {
			break // a later phase is not reported before an earlier one
		}
		detail := ""
		switch p {
		case NodeRegistered:
			detail = t.follow
		case FuseAdvertised:
			detail = kube.FuseResource
		}
		out = append(out, t.emit(p, at, detail)...)
	}
	return out
}

// nodeReady says whether n's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	_, c := nodeutil.GetNodeCondition(&n.Status, corev1.NodeReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// Pod takes the pod as the API server delivered it at at.
func (t *Tracker) Pod(p *corev1.Pod, at time.Time) []Step {
	if p.Name != t.podName {
		return nil
	}
	var out []Step
	since := at.Sub(t.start)
	if node := p.Spec.NodeName; node != "" && !t.done[PodScheduled] {
		switch {
		case t.existing[node]:
			out = append(out, t.emit(Note, since, "bound to "+node+", a pool node from before the pod: no "+
				"scale-up was needed (scale the pool to zero, or aim at a full pool, to measure one)")...)
		case node != t.follow && t.nodes[node] != nil:
			out = append(out, t.emit(Note, since, "bound to "+node+", not to "+t.follow+": following it")...)
			t.follow = node
			out = append(out, t.nodeSteps()...)
		}
		out = append(out, t.emit(PodScheduled, since, "on "+node)...)
	}
	if p.Status.Phase == corev1.PodRunning && t.done[PodScheduled] {
		out = append(out, t.emit(PodRunning, since, "")...)
	}
	return out
}

package timeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// AppLabel marks the pods the tool creates (app.kubernetes.io/name), so an operator can find a leftover one.
const AppLabel = "dynk8s-timeline"

// ErrLimit is returned when the pod does not run within the limit.
var ErrLimit = errors.New("past the limit")

// Options are what Run measures.
type Options struct {
	// Namespace of the pod (required).
	Namespace string
	// Pool is the node pool's name: the pod selects dynk8s.io/pool=<Pool> (required).
	Pool string
	// Taints are the pool's taints, which the pod tolerates (optional).
	Taints []kube.Taint
	// Fuse makes the pod request one github.com/fuse device, and the fuse device plugin's advertising it a phase.
	Fuse bool
	// Image is the pod's image: one every node already has, so that no pull is measured (required).
	Image string
	// Limit is how long the pod may take to run; Run stops waiting then (required).
	Limit time.Duration
	// Now is the clock (optional; time.Now).
	Now func() time.Time
}

// Pod is the pending pod Run creates: aimed at the pool by its label, tolerating exactly the pool's taints (not the
// nodes' startup taints, so it waits for them to go, as a build would), small, and optionally asking for one fuse
// device.
func Pod(o Options, name string) *corev1.Pod {
	var tolerations []corev1.Toleration
	for _, t := range o.Taints {
		tolerations = append(tolerations, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOpEqual,
			Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	requests := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("10m"),
		corev1.ResourceMemory: resource.MustParse("16Mi"),
	}
	limits := corev1.ResourceList{}
	if o.Fuse {
		// Extended resources are requested as limits (requests default to them).
		limits[corev1.ResourceName(kube.FuseResource)] = resource.MustParse("1")
	}
	grace := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/name": AppLabel},
		},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{kube.LabelPool: o.Pool},
			Tolerations:                   tolerations,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  new(bool),
			Containers: []corev1.Container{{
				Name: "wait", Image: o.Image,
				Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits},
			}},
		},
	}
}

// Run creates the pod, prints each step of the timeline to out as it happens, and deletes the pod however it ends
// (done, past the limit, ctx cancelled). It returns the tracker, and ErrLimit past the limit.
func Run(ctx context.Context, client kubernetes.Interface, o Options, out io.Writer) (*Tracker, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	core := client.CoreV1()
	poolNodes := labels.SelectorFromSet(labels.Set{kube.LabelPool: o.Pool}).String()
	nodes, err := core.Nodes().List(ctx, metav1.ListOptions{LabelSelector: poolNodes})
	if err != nil {
		return nil, fmt.Errorf("list the pool's nodes: %w", err)
	}
	var existing []string
	for _, n := range nodes.Items {
		existing = append(existing, n.Name)
	}
	name, err := podName()
	if err != nil {
		return nil, err
	}
	pod, err := core.Pods(o.Namespace).Create(ctx, Pod(o, name), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create the pod: %w", err)
	}
	t := NewTracker(o.Pool, pod.Name, o.Fuse, existing, o.Now())
	fmt.Fprintf(out, "timeline: pod %s/%s for pool %s (%d node(s) there already; limit %s)\n", o.Namespace,
		pod.Name, o.Pool, len(existing), o.Limit)
	emit := printer(out)
	emit(t.Steps())
	defer func() {
		// Whatever ended the run, ctx included: the pod goes.
		del, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := core.Pods(o.Namespace).Delete(del, pod.Name, metav1.DeleteOptions{}); err != nil {
			fmt.Fprintf(out, "timeline: could not delete pod %s/%s: %v\n", o.Namespace, pod.Name, err)
		} else {
			fmt.Fprintf(out, "timeline: deleted pod %s/%s\n", o.Namespace, pod.Name)
		}
	}()

	ctx, cancel := context.WithTimeout(ctx, o.Limit)
	defer cancel()
	podEvents := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod.Name}.String()
	watches := []struct {
		rv      string
		watcher cache.WatcherWithContext
	}{
		{nodes.ResourceVersion, watcher(func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = poolNodes
			return core.Nodes().Watch(ctx, opts)
		})},
		{pod.ResourceVersion, watcher(func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = fields.OneTermEqualSelector("metadata.name", pod.Name).String()
			return core.Pods(o.Namespace).Watch(ctx, opts)
		})},
		{pod.ResourceVersion, watcher(func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = podEvents
			return core.Events(o.Namespace).Watch(ctx, opts)
		})},
	}
	updates := make(chan watch.Event)
	for _, w := range watches {
		rw, err := watchtools.NewRetryWatcherWithContext(ctx, w.rv, w.watcher)
		if err != nil {
			return t, fmt.Errorf("watch: %w", err)
		}
		defer rw.Stop()
		go func() {
			for ev := range rw.ResultChan() {
				select {
				case updates <- ev:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for !t.Done() {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return t, fmt.Errorf("%w: the pod does not run %s after it was created (not reached: %v)",
					ErrLimit, o.Limit, t.Missing())
			}
			return t, ctx.Err()
		case ev := <-updates:
			if ev.Type == watch.Error {
				return t, fmt.Errorf("watch: %v", apiStatus(ev.Object))
			}
			steps, err := t.observe(ev, o.Now())
			emit(steps)
			if err != nil {
				return t, err
			}
		}
	}
	steps := t.Steps()
	fmt.Fprintf(out, "timeline: pod Running %.1fs after it was created\n", steps[len(steps)-1].At.Seconds())
	return t, nil
}

// observe hands a watch event to the tracker; a pod that failed or went away ends the run.
func (t *Tracker) observe(ev watch.Event, at time.Time) ([]Step, error) {
	switch obj := ev.Object.(type) {
	case *corev1.Node:
		if ev.Type != watch.Deleted {
			return t.Node(obj, at), nil
		}
	case *corev1.Event:
		return t.Event(obj, at), nil
	case *corev1.Pod:
		if ev.Type == watch.Deleted {
			return nil, fmt.Errorf("pod %s was deleted by someone else", obj.Name)
		}
		steps := t.Pod(obj, at)
		if obj.Status.Phase == corev1.PodFailed || obj.Status.Phase == corev1.PodSucceeded {
			return steps, fmt.Errorf("pod %s ended (%s): %s %s", obj.Name, obj.Status.Phase, obj.Status.Reason,
				obj.Status.Message)
		}
		return steps, nil
	}
	return nil, nil
}

func printer(out io.Writer) func([]Step) {
	var prev time.Duration
	return func(steps []Step) {
		for _, s := range steps {
			fmt.Fprintln(out, s.Line(prev))
			if s.Phase != Note {
				prev = s.At
			}
		}
	}
}

func watcher(f cache.WatchFuncWithContext) cache.WatcherWithContext {
	return &cache.ListWatch{WatchFuncWithContext: f}
}

func apiStatus(obj runtime.Object) string {
	if s, ok := obj.(*metav1.Status); ok {
		return s.Message
	}
	return fmt.Sprintf("%T", obj)
}

// podName is a fresh name: dynk8s-timeline- and 10 random hex digits.
func podName() (string, error) {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("pod name: %w", err)
	}
	return AppLabel + "-" + hex.EncodeToString(b), nil
}

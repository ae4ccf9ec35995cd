//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/dynk8s/dynk8s/cmd/timeline/timeline"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The timeline tests run cmd/timeline's Main against the real kube-apiserver of hack/start-kube.sh. With no
// autoscaler, kubelet, scheduler or device plugin there, the test stands in for them, in the order a scale-up goes:
// the autoscaler's TriggeredScaleUp event on the pod, a Node of the pool registering, turning Ready, advertising
// github.com/fuse, the pod bound to it and running.

func clientFor(t *testing.T, c cluster) kubernetes.Interface {
	t.Helper()
	rest, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	assert.NilError(t, err)
	client, err := kubernetes.NewForConfig(rest)
	assert.NilError(t, err)
	return client
}

// timelinePods are the pods the tool created and has not deleted yet (bound pods wait for a kubelet to finish
// deleting them: they carry a deletion timestamp).
func timelinePods(ctx context.Context, t *testing.T, client kubernetes.Interface) []corev1.Pod {
	t.Helper()
	pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=" + timeline.AppLabel})
	assert.NilError(t, err)
	return pods.Items
}

// runTimeline runs the tool's Main in the background and returns its exit status and output when it ends.
func runTimeline(ctx context.Context, args ...string) (<-chan int, *nodetest.SyncBuffer, *nodetest.SyncBuffer) {
	stdout, stderr := &nodetest.SyncBuffer{}, &nodetest.SyncBuffer{}
	done := make(chan int, 1)
	go func() { done <- timeline.Main(ctx, args, stdout, stderr) }()
	return done, stdout, stderr
}

func TestTimelineScaleUp(t *testing.T) {
	c := requireCluster(t)
	client := clientFor(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	core := client.CoreV1()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	nodeName := "i-0timeline" + hex.EncodeToString(suffix)
	t.Cleanup(func() {
		bg := context.Background()
		_ = core.Nodes().Delete(bg, nodeName, metav1.DeleteOptions{})
		for _, p := range timelinePods(bg, t, client) {
			_ = core.Pods("default").Delete(bg, p.Name, *metav1.NewDeleteOptions(0))
		}
	})

	// The spot pool of the dev stack: the pod must tolerate its example.com/spot taint.
	done, stdout, stderr := runTimeline(ctx, "-config", devStackFile(t), "-pool", "builders-arm", "-fuse",
		"-limit", "90s", "-kubeconfig", c.Kubeconfig, "-namespace", "default")

	var pod corev1.Pod
	for pod.Name == "" {
		select {
		case code := <-done:
			t.Fatalf("timeline ended (%d) before its pod appeared:\n%s%s", code, stdout, stderr)
		case <-time.After(200 * time.Millisecond):
		}
		if pods := timelinePods(ctx, t, client); len(pods) == 1 {
			pod = pods[0]
		}
	}
	assert := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v\n%s%s", what, err, stdout, stderr)
		}
	}
	assertPod(t, pod)
	step := func() { time.Sleep(300 * time.Millisecond) }

	step()
	now := metav1.Now()
	_, err := core.Events("default").Create(ctx, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + "."},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod.Name, UID: pod.UID,
			APIVersion: "v1"},
		Reason: "TriggeredScaleUp", Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "cluster-autoscaler"},
		Message:        "pod triggered scale-up: [{homelab-builders-arm 0->1 (max: 6)}]",
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}, metav1.CreateOptions{})
	assert(err, "autoscaler event")

	step()
	node, err := core.Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{kube.LabelPool: "builders-arm"}},
		Spec:       corev1.NodeSpec{ProviderID: "aws:///eu-central-1a/" + nodeName},
	}, metav1.CreateOptions{})
	assert(err, "register the node")

	// The controller manager updates the Node too (its not-ready taint): each status change is retried on conflict.
	updateStatus := func(mutate func(*corev1.Node)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := core.Nodes().Get(ctx, node.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			mutate(n)
			_, err = core.Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		})
	}
	step()
	assert(updateStatus(func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	}), "node Ready")

	step()
	fuse := corev1.ResourceName(kube.FuseResource)
	assert(updateStatus(func(n *corev1.Node) {
		n.Status.Capacity = corev1.ResourceList{fuse: resource.MustParse("5000")}
		n.Status.Allocatable = corev1.ResourceList{fuse: resource.MustParse("5000")}
	}), "advertise fuse")

	step()
	assert(core.Pods("default").Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: nodeName}}, metav1.CreateOptions{}), "bind the pod")

	step()
	running, err := core.Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
	assert(err, "get the pod")
	running.Status.Phase = corev1.PodRunning
	_, err = core.Pods("default").UpdateStatus(ctx, running, metav1.UpdateOptions{})
	assert(err, "pod Running")

	var code int
	select {
	case code = <-done:
	case <-ctx.Done():
		t.Fatalf("timeline did not end:\n%s%s", stdout, stderr)
	}
	out := stdout.String()
	t.Logf("timeline output:\n%s", out)
	if code != 0 {
		t.Fatalf("exit %d, want 0:\n%s%s", code, out, stderr)
	}
	// Every phase, once, in order, each with its time and the time since the one before.
	want := []string{
		`timeline: pod default/` + pod.Name + ` for pool builders-arm \(0 node\(s\) there already; limit 1m30s\)`,
		`\+0\.0s +pod created: ` + pod.Name,
		`\+\d+\.\ds +\(\+\d+\.\ds\) +scale-up triggered: pod triggered scale-up: \[\{homelab-builders-arm 0->1 \(max: 6\)\}\]`,
		`\+\d+\.\ds +\(\+\d+\.\ds\) +node registered: ` + nodeName,
		`\+\d+\.\ds +\(\+\d+\.\ds\) +node Ready`,
		`\+\d+\.\ds +\(\+\d+\.\ds\) +fuse advertised: github.com/fuse`,
		`\+\d+\.\ds +\(\+\d+\.\ds\) +pod scheduled: on ` + nodeName,
		`\+\d+\.\ds +\(\+\d+\.\ds\) +pod Running`,
		`timeline: pod Running \d+\.\ds after it was created`,
		`timeline: deleted pod default/` + pod.Name,
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d", len(lines), len(want))
	}
	for i, w := range want {
		if !regexp.MustCompile(`^\s*` + w + `$`).MatchString(lines[i]) {
			t.Errorf("line %d: %q does not match %q", i+1, lines[i], w)
		}
	}
	// The bound pod waits for a kubelet to finish its deletion; the tool has asked for it.
	for _, p := range timelinePods(context.Background(), t, client) {
		if p.DeletionTimestamp == nil {
			t.Errorf("pod %s left behind undeleted", p.Name)
		}
	}
}

// assertPod: the pod aims at the pool and tolerates its taint, and asks for one fuse device.
func assertPod(t *testing.T, pod corev1.Pod) {
	t.Helper()
	if pod.Spec.NodeSelector[kube.LabelPool] != "builders-arm" {
		t.Errorf("node selector %v", pod.Spec.NodeSelector)
	}
	if len(pod.Spec.Tolerations) == 0 || pod.Spec.Tolerations[0].Key != "example.com/spot" {
		t.Errorf("tolerations %v, want the pool's example.com/spot", pod.Spec.Tolerations)
	}
	if q := pod.Spec.Containers[0].Resources.Requests[corev1.ResourceName(kube.FuseResource)]; q.String() != "1" {
		t.Errorf("fuse request %s, want 1", q.String())
	}
}

// TestTimelinePastTheLimit: with nothing scaling up, the tool gives up at -limit, says which phases it never saw,
// exits 1 and leaves no pod behind.
func TestTimelinePastTheLimit(t *testing.T) {
	c := requireCluster(t)
	client := clientFor(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	done, stdout, stderr := runTimeline(ctx, "-config", devStackFile(t), "-pool", "builders-x86",
		"-limit", "3s", "-kubeconfig", c.Kubeconfig, "-namespace", "default")
	code := <-done
	t.Logf("after %s, exit %d:\n%s%s", time.Since(start).Round(time.Millisecond), code, stdout, stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{"past the limit", "does not run 3s after it was created",
		"not reached: [scale-up triggered node registered node Ready pod scheduled pod Running]"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if !strings.Contains(stdout.String(), "timeline: deleted pod default/") {
		t.Errorf("stdout does not report the pod deleted")
	}
	if pods := timelinePods(context.Background(), t, client); len(pods) > 0 {
		t.Errorf("pod %s left behind", pods[0].Name)
	}
}

// TestTimelineInterrupted: Ctrl-C (the context cancelled) ends the run with exit 1, and the pod is deleted.
func TestTimelineInterrupted(t *testing.T) {
	c := requireCluster(t)
	client := clientFor(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done, stdout, stderr := runTimeline(ctx, "-config", devStackFile(t), "-pool", "builders-x86",
		"-kubeconfig", c.Kubeconfig, "-namespace", "default")
	deadline := time.Now().Add(30 * time.Second)
	for len(timelinePods(t.Context(), t, client)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no pod appeared:\n%s%s", stdout, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(stdout.String(), "timeline: deleted pod default/") || !strings.Contains(stderr.String(), "context canceled") {
		t.Errorf("output:\n%s%s", stdout, stderr)
	}
	if pods := timelinePods(context.Background(), t, client); len(pods) > 0 {
		t.Errorf("pod %s left behind", pods[0].Name)
	}
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// TestDaemonSetTokensActOnTheirOwnNode: the ServiceAccount token a pool node carries (the termination handler's) may
// change its own Node only, against the real API server with the dev stack's rendered RBAC and admission policies.
// RBAC grants it Nodes cluster-wide (`kubectl auth can-i` says yes for any Node; it asks RBAC only), so the refusals
// come from admission, on real patches with a token bound to a pod on one Node, as the kubelet mounts it. Denied:
// the termination handler cordoning another Node; a token bound to no pod changing any Node. Admitted, the twin:
// the handler cordoning its own Node.
func TestDaemonSetTokensActOnTheirOwnNode(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	applyRendered(ctx, t, c, func(name string) bool {
		return strings.Contains(name, nthSA) && !strings.HasPrefix(name, "daemonset-") ||
			strings.Contains(name, addons.TerminationHandlerNodePolicyName)
	}, 4)

	const own, other = "i-0e2e00000000000b1", "i-0e2e00000000000b2"
	for _, n := range []string{own, other} {
		createPoolNode(ctx, t, c, n, "")
	}
	nth := boundToken(ctx, t, c, nthSA, own)
	unbound, err := c.kubectl(ctx, "-n", "kube-system", "create", "token", nthSA, "--duration", "10m")
	assert.NilError(t, err)
	as := func(tok string, args ...string) error {
		_, err := c.kubectl(ctx, append([]string{"--token", tok}, args...)...)
		return err
	}
	if out, err := c.kubectl(ctx, "--token", nth, "auth", "can-i", "patch", "node/"+other); err != nil ||
		strings.TrimSpace(out) != "yes" {
		t.Errorf("RBAC no longer lets the termination handler patch any Node (%q, %v): the policy is moot", out, err)
	}
	ownNode := "this ServiceAccount may change only the Node its pod runs on"
	// The policy is enforced once the API server has compiled it, a moment after it was created.
	errOther := untilDenied(t, func() error { return as(nth, cordon(other)...) },
		func() { _, _ = c.kubectl(ctx, "uncordon", other) })
	deniedWith(t, "the termination handler cordoning another Node", errOther, ownNode)
	assert.Check(t, as(nth, cordon(own)...), "the termination handler cannot cordon its own Node")
	deniedWith(t, "a token bound to no pod labelling a Node", as(strings.TrimSpace(unbound), "label", "node", own,
		"e2e=x"), ownNode)
}

// TestControllerNodePolicy: what RBAC lets dynk8s-controller do to Nodes (update and delete any), the stack's
// controller node policy narrows to its two jobs, against the real API server with the controller ServiceAccount's
// token, through the calls it makes (an update of the Node as read, a delete). Admitted: removing the fuse startup
// taint, deleting a NotReady pool node. Denied: relabelling, cordoning, adding another taint, removing another
// taint, the untaint with a relabel, deleting a Ready pool node and deleting an on-prem node (NotReady).
func TestControllerNodePolicy(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	controllerObjects(ctx, t, c)

	const tainted, ready, notReady, onPrem = "i-0e2e00000000000c1", "i-0e2e00000000000c2", "i-0e2e00000000000c3",
		"e2e-onprem-c4"
	taint := kube.FuseStartupTaint
	createPoolNode(ctx, t, c, tainted, "")
	createPoolNode(ctx, t, c, ready, "True")
	createPoolNode(ctx, t, c, notReady, "Unknown")
	createNode(ctx, t, c, onPrem, nil, "Unknown")
	out, err := c.kubectl(ctx, "-n", "kube-system", "create", "token", addons.ControllerName, "--duration", "10m")
	assert.NilError(t, err)
	tok := strings.TrimSpace(out)
	for _, verb := range []string{"update", "delete"} {
		if out, err := c.kubectl(ctx, "--token", tok, "auth", "can-i", verb, "node/"+ready); err != nil ||
			strings.TrimSpace(out) != "yes" {
			t.Errorf("RBAC no longer lets the controller %s any Node (%q, %v): the policy is moot", verb, out, err)
		}
	}
	// The controller's own calls: an update of the Node as read (RBAC gives it update, not patch) and a delete.
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: c.Server, BearerToken: tok,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.CAFile}})
	assert.NilError(t, err)
	update := func(name string, change func(n *corev1.Node)) error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(n)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}
	remove := func(key string) func(n *corev1.Node) {
		return func(n *corev1.Node) {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == key })
		}
	}
	del := func(name string) error { return cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) }

	untaintOnly := "the controller may only remove the " + taint.Key + " taint from a Node"
	// The policy is enforced once the API server has compiled it, a moment after it was created.
	deniedWith(t, "the controller relabelling a Node", untilDenied(t,
		func() error { return update(tainted, func(n *corev1.Node) { n.Labels["e2e"] = "yes" }) },
		func() { _, _ = c.kubectl(ctx, "label", "node", tainted, "e2e-") }), untaintOnly)
	deniedWith(t, "the controller cordoning a Node",
		update(tainted, func(n *corev1.Node) { n.Spec.Unschedulable = true }), untaintOnly)
	deniedWith(t, "the controller tainting a Node", update(tainted, func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "e2e.dynk8s.io/x", Value: "y", Effect: "NoSchedule"})
	}), untaintOnly)
	deniedWith(t, "the controller removing the fuse taint and relabelling at once", update(tainted,
		func(n *corev1.Node) { remove(taint.Key)(n); n.Labels["e2e"] = "yes" }), untaintOnly)
	// A taint of the Node's own (as a pool's would be) may not go.
	if _, err := c.kubectl(ctx, "taint", "node", ready, "e2e.dynk8s.io/pool-taint=y:NoSchedule"); err != nil {
		t.Fatal(err)
	}
	deniedWith(t, "the controller removing another taint", update(ready, remove("e2e.dynk8s.io/pool-taint")),
		untaintOnly)
	assert.Check(t, update(tainted, remove(taint.Key)), "the controller cannot remove the fuse startup taint")
	if n, err := getNode(ctx, c, tainted); err != nil || n.hasTaint(taint.Key) {
		t.Errorf("the fuse startup taint is still on %s (%v)", tainted, err)
	}

	deleteOnly := "the controller may delete only a pool node that is not Ready"
	deniedWith(t, "the controller deleting a Ready pool node", del(ready), deleteOnly)
	deniedWith(t, "the controller deleting an on-prem node", del(onPrem), deleteOnly)
	assert.Check(t, del(notReady), "the controller cannot delete a NotReady pool node")
	for name, gone := range map[string]bool{ready: false, onPrem: false, notReady: true} {
		_, err := c.kubectl(ctx, "get", "node", name)
		if isNotFound(err) != gone {
			t.Errorf("node %s: gone %t, want %t (%v)", name, isNotFound(err), gone, err)
		}
	}
}

// cordon is a cordon as a patch: `kubectl cordon` reports a refused patch but exits 0 (kubectl 1.34).
func cordon(node string) []string {
	return []string{"patch", "node", node, "-p", `{"spec":{"unschedulable":true}}`}
}

// untilDenied retries try (undoing what it did, if it was admitted) for up to 20 s until it fails: an admission
// policy is enforced once the API server has compiled it, a moment after it was created. It returns try's last
// error.
func untilDenied(t *testing.T, try func() error, undo func()) error {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		err := try()
		if err != nil || time.Now().After(deadline) {
			return err
		}
		undo()
	}
}

// deniedWith fails the test unless err is a refusal carrying want.
func deniedWith(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s was not denied (%q): %v", what, want, err)
	}
}

// createPoolNode registers a pool Node with the fuse startup taint and, unless ready is "", a Ready condition of
// that status; it is deleted when the test ends.
func createPoolNode(ctx context.Context, t *testing.T, c cluster, name, ready string) {
	t.Helper()
	createNode(ctx, t, c, name, map[string]string{kube.LabelPool: "e2e"}, ready)
}

// createNode registers a Node with labels, the fuse startup taint and, unless ready is "", a Ready condition of
// that status since a minute ago; it is deleted when the test ends.
func createNode(ctx context.Context, t *testing.T, c cluster, name string, labels map[string]string, ready string) {
	t.Helper()
	taint := kube.FuseStartupTaint
	doc, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "labels": labels},
		"spec": map[string]any{"taints": []any{map[string]string{"key": taint.Key, "value": taint.Value,
			"effect": string(taint.Effect)}}}})
	assert.NilError(t, err)
	createFromJSON(ctx, t, c, name, doc)
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "delete", "node", name, "--ignore-not-found", "--wait=false")
	})
	if ready == "" {
		return
	}
	since := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	status, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{map[string]string{
		"type": "Ready", "status": ready, "reason": "E2E", "lastHeartbeatTime": since, "lastTransitionTime": since}}}})
	assert.NilError(t, err)
	if out, err := c.kubectl(ctx, "patch", "node", name, "--subresource=status", "--type=merge", "-p",
		string(status)); err != nil {
		t.Fatalf("Ready=%s on %s: %v\n%s", ready, name, err, out)
	}
}

// boundToken is a token (10 minutes) of the ServiceAccount sa of kube-system bound to a pod of it on node, as the
// kubelet mounts it; the pod is deleted when the test ends.
func boundToken(ctx context.Context, t *testing.T, c cluster, sa, node string) string {
	t.Helper()
	pod := "e2e-own-node-" + sa
	doc, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": pod, "namespace": "kube-system"},
		"spec": map[string]any{"nodeName": node, "serviceAccountName": sa, "automountServiceAccountToken": false,
			"containers": []any{map[string]any{"name": "c", "image": "registry.k8s.io/pause:3.10.1"}}}})
	assert.NilError(t, err)
	createFromJSON(ctx, t, c, pod, doc)
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "kube-system", "delete", "pod", pod, "--wait=false",
			"--force", "--grace-period=0")
	})
	out, err := c.kubectl(ctx, "-n", "kube-system", "create", "token", sa, "--bound-object-kind", "Pod",
		"--bound-object-name", pod, "--duration", "10m")
	assert.NilError(t, err)
	return strings.TrimSpace(out)
}

// applyRendered applies the dev stack's rendered manifests (its golden files, which TestStackGolden holds current)
// whose file name matches (at least least of them), and deletes them when the test ends.
func applyRendered(ctx context.Context, t *testing.T, c cluster, match func(string) bool, least int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "testdata", "stacks", "dev", "manifests", "*"))
	assert.NilError(t, err)
	var args []string
	for _, f := range files {
		if match(filepath.Base(f)) {
			args = append(args, "-f", f)
		}
	}
	if len(args) < 2*least {
		t.Fatalf("the dev stack renders only %v of what the test needs", args)
	}
	if out, err := c.kubectl(ctx, append([]string{"apply"}, args...)...); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), append([]string{"delete", "--ignore-not-found"}, args...)...)
	})
}

// createFromJSON creates one object from its JSON as the admin.
func createFromJSON(ctx context.Context, t *testing.T, c cluster, name string, doc []byte) {
	t.Helper()
	file := filepath.Join(t.TempDir(), name+".json")
	assert.NilError(t, os.WriteFile(file, doc, 0o600))
	if out, err := c.kubectl(ctx, "create", "-f", file); err != nil {
		t.Fatalf("create %s: %v\n%s", name, err, out)
	}
}

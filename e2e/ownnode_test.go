//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// TestDaemonSetTokensActOnTheirOwnNode: the ServiceAccount tokens a pool node carries (the fuse untaint container's,
// the termination handler's) may change their own Node only, against the real API server with the dev stack's
// rendered RBAC and admission policies. RBAC grants them Nodes cluster-wide (`kubectl auth can-i` says yes for any
// Node; it asks RBAC only), so the refusals come from admission, on real patches with tokens bound to a pod on one
// Node, as the kubelet mounts them. Denied: the untaint token removing another Node's taint, relabelling or cordoning
// its own; the termination handler cordoning another Node; a token bound to no pod changing any Node. Admitted, the
// twins: the untaint token removing its own Node's startup taint, the handler cordoning its own Node.
func TestDaemonSetTokensActOnTheirOwnNode(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const fuseSA, nthSA = "fuse-device-plugin", "aws-node-termination-handler"
	applyRendered(ctx, t, c, func(name string) bool {
		return strings.Contains(name, fuseSA) && !strings.HasPrefix(name, "daemonset-") ||
			strings.Contains(name, nthSA) && !strings.HasPrefix(name, "daemonset-") ||
			strings.Contains(name, addons.FuseNodePolicyName) || strings.Contains(name, addons.TerminationHandlerNodePolicyName)
	}, 8)

	const own, other = "i-0e2e00000000000b1", "i-0e2e00000000000b2"
	taint := kube.FuseStartupTaint
	for _, n := range []string{own, other} {
		doc, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": n, "labels": map[string]string{kube.LabelPool: "e2e"}},
			"spec": map[string]any{"taints": []any{map[string]string{"key": taint.Key, "value": taint.Value,
				"effect": string(taint.Effect)}}}})
		assert.NilError(t, err)
		createFromJSON(ctx, t, c, n, doc)
		t.Cleanup(func() { _, _ = c.kubectl(context.Background(), "delete", "node", n, "--wait=false") })
	}
	token := func(sa string) string {
		pod := "e2e-own-node-" + sa
		doc, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": pod, "namespace": "kube-system"},
			"spec": map[string]any{"nodeName": own, "serviceAccountName": sa, "automountServiceAccountToken": false,
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
	fuse, nth := token(fuseSA), token(nthSA)
	unbound, err := c.kubectl(ctx, "-n", "kube-system", "create", "token", nthSA, "--duration", "10m")
	assert.NilError(t, err)
	as := func(tok string, args ...string) error {
		_, err := c.kubectl(ctx, append([]string{"--token", tok}, args...)...)
		return err
	}
	denied := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s was not denied (%q): %v", what, want, err)
		}
	}
	if out, err := c.kubectl(ctx, "--token", fuse, "auth", "can-i", "patch", "node/"+other); err != nil ||
		strings.TrimSpace(out) != "yes" {
		t.Errorf("RBAC no longer lets the untaint container patch any Node (%q, %v): the policy is moot", out, err)
	}
	ownNode := "this ServiceAccount may change only the Node its pod runs on"
	// The policies are enforced once the API server has compiled them, a moment after they were created.
	var errOther error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		errOther = as(fuse, "taint", "node", other, taint.Key+"-")
		if errOther != nil || time.Now().After(deadline) {
			break
		}
		_, _ = c.kubectl(ctx, "taint", "node", other, taint.Key+"="+taint.Value+":"+string(taint.Effect))
	}
	denied("the untaint token removing another Node's taint", errOther, ownNode)
	untaintOnly := "the fuse untaint container may only remove the " + taint.Key + " taint"
	denied("the untaint token relabelling its own Node", as(fuse, "label", "node", own, "e2e=yes"), untaintOnly)
	// A cordon as a patch: `kubectl cordon` reports a refused patch but exits 0 (kubectl 1.34).
	cordon := func(node string) []string {
		return []string{"patch", "node", node, "-p", `{"spec":{"unschedulable":true}}`}
	}
	denied("the untaint token cordoning its own Node", as(fuse, cordon(own)...), untaintOnly)
	assert.Check(t, as(fuse, "taint", "node", own, taint.Key+"-"), "the untaint token cannot remove its own Node's startup taint")
	denied("the termination handler cordoning another Node", as(nth, cordon(other)...), ownNode)
	assert.Check(t, as(nth, cordon(own)...), "the termination handler cannot cordon its own Node")
	denied("a token bound to no pod labelling a Node", as(strings.TrimSpace(unbound), "label", "node", own, "e2e=x"),
		ownNode)
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

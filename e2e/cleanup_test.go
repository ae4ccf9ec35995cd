//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// TestCleanupAsksEC2 runs the stale-node cleanup script exactly as the dev stack renders it (its ConfigMap's script,
// its CronJob's environment) with the real kubectl against the real kube-apiserver and the real AWS CLI against
// moto, signed with the key of an IAM user holding the stack's own cleanup policy (moto enforces IAM here). Five
// pool Nodes have been NotReady past the threshold or not; only those whose instance EC2 reports gone are deleted.
// A second run under a policy without ec2:DescribeInstances deletes nothing and fails: the policy is what lets the
// script judge, and nothing is deleted on a guess.
func TestCleanupAsksEC2(t *testing.T) {
	c := requireCluster(t)
	requireTool(t, "aws")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	s := loadStackAutoscaling(t)
	if s.cleanupPolicy == "" || s.cleanupScript == "" || s.cleanup == nil {
		t.Fatalf("dev stack: cleanup policy %t, script %t, CronJob %t", s.cleanupPolicy != "",
			s.cleanupScript != "", s.cleanup != nil)
	}
	// The policy's one action swapped for another read: IAM refuses a statement without actions.
	denied := strings.Replace(s.cleanupPolicy, `"ec2:DescribeInstances"`, `"ec2:DescribeRegions"`, 1)
	if denied == s.cleanupPolicy {
		t.Fatalf("the stack's cleanup policy does not grant ec2:DescribeInstances:\n%s", s.cleanupPolicy)
	}
	a := startAWS(ctx, t, s, []replayUser{
		{Name: s.cleanupUser, Policy: s.cleanupPolicy},
		{Name: "cleanup-denied", Policy: denied},
	})
	template, _ := s.replay.LaunchTemplates[0]["name"].(string)
	var fleet map[string]string
	a.python(ctx, t, nil, &fleet, "fleet", a.admin.Key, a.admin.Secret, template)

	env := cleanupEnv(t, s.cleanup)
	threshold := env["NOT_READY_AFTER_SECONDS"]
	if threshold != "300" {
		t.Fatalf("the dev stack's cleanup threshold is %q s, want 300 (cleanup.notReadyAfter 5m)", threshold)
	}
	hourAgo := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	nodes := map[string]struct{ instance, since string }{
		"e2e-cleanup-terminated": {fleet["terminated"], hourAgo},
		"e2e-cleanup-unknown":    {"i-0123456789abcdef0", hourAgo},
		"e2e-cleanup-stopped":    {fleet["stopped"], hourAgo},
		"e2e-cleanup-running":    {fleet["running"], hourAgo},
		"e2e-cleanup-recent":     {fleet["terminated"], time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)},
	}
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		createNotReadyNode(ctx, t, c, name, env["POOL_LABEL"], "aws:///"+a.region+"a/"+nodes[name].instance,
			nodes[name].since)
	}

	run := func(key awsKey) (string, error) { return runCleanup(ctx, t, c, s, threshold, key, a.url) }

	out, err := run(a.users["cleanup-denied"])
	if err == nil {
		t.Errorf("a run that may not ask EC2 succeeded:\n%s", out)
	}
	if left := cleanupNodesLeft(ctx, t, c); len(left) != len(nodes) {
		t.Errorf("a run that may not ask EC2 deleted nodes: left %v\n%s", left, out)
	}
	if !strings.Contains(out, "cannot ask EC2 about") || !strings.Contains(out, "UnauthorizedOperation") &&
		!strings.Contains(out, "AccessDenied") {
		t.Errorf("the denied run does not say why it kept the nodes:\n%s", out)
	}

	out, err = run(a.users[s.cleanupUser])
	if err != nil {
		t.Fatalf("cleanup with the stack's policy: %v\n%s", err, out)
	}
	t.Logf("cleanup output:\n%s", out)
	want := []string{"e2e-cleanup-recent", "e2e-cleanup-running", "e2e-cleanup-stopped"}
	if left := cleanupNodesLeft(ctx, t, c); !slices.Equal(left, want) {
		t.Errorf("nodes left: %v, want %v\n%s", left, want, out)
	}
	for _, line := range []string{
		"delete e2e-cleanup-terminated: Ready=Unknown for",
		"instance " + fleet["terminated"] + " terminated",
		"instance i-0123456789abcdef0 gone",
		"keep e2e-cleanup-running: Ready=Unknown for",
		"but instance " + fleet["running"] + " is running",
		"but instance " + fleet["stopped"] + " is stopped",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}
}

// runCleanup runs the rendered cleanup script once, as its CronJob's container would, with the rendered
// environment, Nodes older than threshold seconds counted stale, and key's AWS user asking ec2URL.
func runCleanup(ctx context.Context, t *testing.T, c cluster, s stackAutoscaling, threshold string, key awsKey,
	ec2URL string) (string, error) {
	t.Helper()
	env := cleanupEnv(t, s.cleanup)
	dir := t.TempDir()
	script := filepath.Join(dir, "cleanup.sh")
	assert.NilError(t, os.WriteFile(script, []byte(s.cleanupScript), 0o755))
	cmd := exec.CommandContext(ctx, "/bin/sh", script)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "HOME="+dir, "TMPDIR="+dir,
		"POOL_LABEL="+env["POOL_LABEL"], "NOT_READY_AFTER_SECONDS="+threshold,
		"AWS_ACCESS_KEY_ID="+key.Key, "AWS_SECRET_ACCESS_KEY="+key.Secret,
		"AWS_DEFAULT_REGION="+env["AWS_DEFAULT_REGION"], "EC2_ENDPOINT_URL="+ec2URL)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cleanupEnv is the plain environment of the cleanup CronJob's container, as rendered.
func cleanupEnv(t *testing.T, rendered map[string]any) map[string]string {
	t.Helper()
	raw, err := json.Marshal(rendered)
	assert.NilError(t, err)
	var cj cronJob
	assert.NilError(t, json.Unmarshal(raw, &cj))
	containers := cj.Spec.JobTemplate.Spec.Template.Spec.Containers
	if len(containers) != 1 {
		t.Fatalf("cleanup CronJob has %d containers", len(containers))
	}
	env := map[string]string{}
	for _, e := range containers[0].Env {
		env[e.Name] = e.Value
	}
	return env
}

// createNotReadyNode registers a pool Node whose Ready condition has been Unknown since since, and removes it when
// the test ends (if the cleanup has not).
func createNotReadyNode(ctx context.Context, t *testing.T, c cluster, name, poolLabel, providerID, since string) {
	t.Helper()
	node := map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "labels": map[string]string{poolLabel: "builders"}},
		"spec":     map[string]any{"providerID": providerID},
	}
	manifest := filepath.Join(t.TempDir(), name+".json")
	raw, _ := json.Marshal(node)
	assert.NilError(t, os.WriteFile(manifest, raw, 0o644))
	if _, err := c.kubectl(ctx, "create", "-f", manifest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "delete", "node", name, "--ignore-not-found", "--wait=false")
	})
	status := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown",`+
		`"lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`, since, since)
	if _, err := c.kubectl(ctx, "patch", "node", name, "--subresource=status", "--type=merge", "-p", status); err != nil {
		t.Fatal(err)
	}
}

// cleanupNodesLeft are the names of this test's Nodes that still exist, sorted.
func cleanupNodesLeft(ctx context.Context, t *testing.T, c cluster) []string {
	t.Helper()
	out, err := c.kubectl(ctx, "get", "nodes", "-o", "name")
	assert.NilError(t, err)
	var left []string
	for _, n := range strings.Fields(out) {
		if name := strings.TrimPrefix(n, "node/"); strings.HasPrefix(name, "e2e-cleanup-") {
			left = append(left, name)
		}
	}
	slices.Sort(left)
	return left
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// TestCleanupAsksEC2 runs dynk8s-controller's stale-node cleanup loop as the dev stack's Deployment runs it (its
// rendered args, the controller ServiceAccount's RBAC and node policy) against the real kube-apiserver, with moto as
// EC2, signed with the key of an IAM user holding the stack's own cleanup policy (moto enforces IAM here). Five pool
// Nodes have been NotReady past the threshold or not; only those whose instance EC2 reports gone are deleted. A run
// under a policy without ec2:DescribeInstances deletes nothing and says why: the policy is what lets the loop
// judge, and nothing is deleted on a guess.
func TestCleanupAsksEC2(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	s := loadStackAutoscaling(t)
	if s.cleanupPolicy == "" {
		t.Fatal("the dev stack declares no cleanup policy")
	}
	// The policy's one action swapped for another read: IAM refuses a statement without actions.
	denied := strings.Replace(s.cleanupPolicy, `"ec2:DescribeInstances"`, `"ec2:DescribeRegions"`, 1)
	if denied == s.cleanupPolicy {
		t.Fatalf("the stack's cleanup policy does not grant ec2:DescribeInstances:\n%s", s.cleanupPolicy)
	}
	controllerObjects(ctx, t, c)
	a := startAWS(ctx, t, s, []replayUser{
		{Name: s.cleanupUser, Policy: s.cleanupPolicy},
		{Name: "cleanup-denied", Policy: denied},
	})
	template, _ := s.replay.LaunchTemplates[0]["name"].(string)
	var fleet map[string]string
	a.python(ctx, t, nil, &fleet, "fleet", a.admin.Key, a.admin.Secret, template)

	args := renderedControllerArgs(t)
	if got := argValue(args, "not-ready-after"); got != "5m0s" {
		t.Fatalf("the dev stack's cleanup threshold is %q, want 5m0s (cleanup.notReadyAfter 5m)", got)
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
		createNotReadyNode(ctx, t, c, name, kube.LabelPool, "aws:///"+a.region+"a/"+nodes[name].instance,
			nodes[name].since)
	}
	run := func(id string, key awsKey) *controllerProcess {
		return startController(ctx, t, c, controllerSpec{args: args, identity: id, set: []string{"--loops=cleanup"},
			ec2: a.url, ssm: a.url, ec2Key: key})
	}

	// May not ask EC2: keeps every Node, and says why.
	p := run("e2e-cleanup-denied", a.users["cleanup-denied"])
	l := p.waitLine(t, time.Minute, "will try again", map[string]string{"key": "e2e-cleanup-terminated"})
	if msg := l.str("error"); !strings.Contains(msg, "asking EC2 about instance "+fleet["terminated"]) ||
		!strings.Contains(msg, "UnauthorizedOperation") && !strings.Contains(msg, "AccessDenied") {
		t.Errorf("the denied run does not say why it kept the node: %q", msg)
	}
	p.waitLine(t, time.Minute, "will try again", map[string]string{"key": "e2e-cleanup-unknown"})
	if left := cleanupNodesLeft(ctx, t, c); len(left) != len(nodes) {
		t.Errorf("a run that may not ask EC2 deleted nodes: left %v", left)
	}
	p.stop(t)

	// With the stack's policy: the Nodes of gone instances go, the others stay.
	p = run("e2e-cleanup", a.users[s.cleanupUser])
	want := []string{"e2e-cleanup-recent", "e2e-cleanup-running", "e2e-cleanup-stopped"}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		left := cleanupNodesLeft(ctx, t, c)
		if slices.Equal(left, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes left: %v, want %v\n%s", left, want, tail(p.log(), 40))
		}
	}
	for node, reason := range map[string]string{
		"e2e-cleanup-terminated": "and instance " + fleet["terminated"] + " is terminated",
		"e2e-cleanup-unknown":    "and instance i-0123456789abcdef0 is unknown to EC2",
	} {
		if l := p.waitLine(t, 10*time.Second, "delete", map[string]string{"node": node}); !strings.Contains(l.str("reason"), reason) {
			t.Errorf("delete %s: reason %q lacks %q", node, l.str("reason"), reason)
		}
	}
	for node, state := range map[string]string{"e2e-cleanup-running": "running", "e2e-cleanup-stopped": "stopped"} {
		p.waitLine(t, 10*time.Second, "keep", map[string]string{"node": node, "state": state})
	}
	// The recent one is not due for minutes: nothing asks EC2 about it, nothing deletes it.
	time.Sleep(3 * time.Second)
	if left := cleanupNodesLeft(ctx, t, c); !slices.Equal(left, want) {
		t.Errorf("nodes left: %v, want %v", left, want)
	}
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

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
)

// rankedStack is the dev stack with the priority expander, first in a chain with least-waste, and the given rank on
// each pool (by pool name).
func rankedStack(t *testing.T, ranks map[string]int) stackAutoscaling {
	t.Helper()
	return loadStackVariant(t, func(values map[string]any) {
		mockcloud.Object(values, "autoscaler")["expander"] = "priority,least-waste"
		for i := range values["dynk8s:nodePools"].([]any) {
			p := mockcloud.Pool(values, i)
			p["autoscaling"] = map[string]any{"priority": ranks[p["name"].(string)]}
		}
	})
}

// bothPoolsPod is a build agent both dev pools fit: no architecture asked for, the spot pool's taint tolerated, a
// fuse device and ephemeral storage requested.
func bothPoolsPod(name string, spot declaredGroup) podSpec {
	p := fitsPod(name, spot, true)
	p.selector = nil
	return p
}

// TestAutoscalerPriorityExpander: with the priority expander the real autoscaler reads the ConfigMap the stack
// renders and raises the higher-ranked of two groups that both fit the pod, whichever that is: once with the spot
// pool ranked first, once with the on-demand pool (least-waste alone could not tell them apart: both types have 8
// vCPUs and 16 GiB).
func TestAutoscalerPriorityExpander(t *testing.T) {
	c := requireCluster(t)
	for _, first := range []string{"builders-arm", "builders-x86"} {
		t.Run(first+" ranked first", func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			ranks := map[string]int{"builders-arm": 10, "builders-x86": 10}
			ranks[first] = 20
			s := rankedStack(t, ranks)
			if s.priorities == nil {
				t.Fatal("the stack renders no priority expander ConfigMap with expander priority,least-waste")
			}
			winner := s.poolGroup(t, first)
			_, spot := s.spotGroup(t)
			a := startAWS(ctx, t, s, []replayUser{{Name: s.userName, Policy: s.policy}})
			applyPriorities(ctx, t, c, s)
			ca := startAutoscaler(ctx, t, c, s, a, a.users[s.userName])

			p := bothPoolsPod("e2e-ranked-agent", spot)
			createPendingPod(ctx, t, c, p)
			d := waitDesired(ctx, t, a, ca, 60*time.Second, winner+" raised", func(d map[string]int) bool {
				return d[winner] >= 1
			})
			for name, n := range d {
				if want := map[bool]int{true: 1, false: 0}[name == winner]; n != want {
					t.Errorf("group %s desired %d, want %d", name, n, want)
				}
			}
			msg := waitEvent(ctx, t, c, "default", p.name, "TriggeredScaleUp", start, 30*time.Second)
			if !strings.Contains(msg, winner+" 0->1") {
				t.Errorf("TriggeredScaleUp says %q, want %s 0->1", msg, winner)
			}
			explainAgrees(ctx, t, c, s, p.name, winner)
			// Both groups were options, and the priority expander chose: it logs its choice
			// (expander/priority/priority.go at cluster-autoscaler-1.34.5) and no unmatched group.
			log := ca.logs.String()
			if !strings.Contains(log, "priority expander: "+winner+" chosen as the highest available") {
				t.Errorf("the autoscaler log names no priority choice of %s:\n%s", winner, tail(log, 60))
			}
			if strings.Contains(log, "not found in priority expander configuration") {
				t.Errorf("a group is missing from the rendered priorities:\n%s", tail(log, 60))
			}
			deletePod(ctx, t, c, p.name)
		})
	}
}

// applyPriorities creates the priority expander's ConfigMap the stack renders in kube-system, for this test only.
func applyPriorities(ctx context.Context, t *testing.T, c cluster, s stackAutoscaling) {
	t.Helper()
	if _, err := c.kubectl(ctx, "-n", "kube-system", "delete", "configmap", priorityExpanderConfigMap,
		"--ignore-not-found"); err != nil {
		t.Fatal(err)
	}
	applyJSON(ctx, t, c, s.priorities)
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "kube-system", "delete", "configmap", priorityExpanderConfigMap,
			"--ignore-not-found")
	})
	t.Logf("priorities: %s", fmt.Sprint(s.priorities["data"]))
}

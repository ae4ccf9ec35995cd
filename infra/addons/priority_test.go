package addons

import (
	"regexp"
	"slices"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"sigs.k8s.io/yaml"
)

// priorityArgs are testAddonsArgs with the priority expander: the spot pool ranked over the on-demand one, and group
// names as Pulumi makes them (prefix and a unique suffix), one pool's name extending the other's.
func priorityArgs() *ClusterAddonsArgs {
	a := testAddonsArgs()
	a.Autoscaler.Expander = "priority,least-waste"
	a.Pools[0].Name, a.Pools[1].Name = "build", "build-arm"
	spot, onDemand := 20, 10
	a.Pools[0].Autoscaling.Priority = &spot
	a.Pools[1].Autoscaling.Priority = &onDemand
	a.GroupNames = pulumi.StringMap{
		"build":     pulumi.String("dev-build-20261201153000000000000001"),
		"build-arm": pulumi.String("dev-build-arm-20261201153000000000000002"),
	}
	return a
}

// TestAddonsPriorityExpanderConfigMap: with the priority expander the component declares the ConfigMap the expander
// reads, in its documented form (rank: [regexps over group ids], expander/priority/readme.md at
// cluster-autoscaler-1.34.5), each rank matching exactly its pool's group, and the autoscaler waits for it.
func TestAddonsPriorityExpanderConfigMap(t *testing.T) {
	run := mustRunAddons(t, priorityArgs)
	cm := run.object(t, typeConfigMap, priorityExpanderName)
	assert.Equal(t, dig(t, cm, "metadata", "namespace"), testKubeSystem)
	doc, _ := dig(t, cm, "data", priorityExpanderKey).(string)
	assert.Equal(t, doc, "20:\n  - \"^dev-build-20261201153000000000000001$\"\n"+
		"10:\n  - \"^dev-build-arm-20261201153000000000000002$\"\n")

	// Parsed as the expander does: a map of int to regexps, each matching its own group's name only.
	var ranks map[int][]string
	assert.NilError(t, yaml.Unmarshal([]byte(doc), &ranks))
	groups := map[int]string{20: "dev-build-20261201153000000000000001", 10: "dev-build-arm-20261201153000000000000002"}
	for rank, res := range ranks {
		assert.Equal(t, len(res), 1)
		re := regexp.MustCompile(res[0])
		for other, name := range groups {
			assert.Equal(t, re.MatchString(name), other == rank, "rank %d's %s against %s", rank, res[0], name)
		}
	}
	deps := run.cloud.Find(typeDeployment, testComponentName+"-autoscaler").DependsOn
	assert.Check(t, is.Contains(deps, testComponentName+"-autoscaler-priorities"),
		"the autoscaler does not wait for its priorities: %v", deps)

	// Without the priority expander there is no such ConfigMap.
	assert.Check(t, !slices.Contains(mustRunAddons(t, testAddonsArgs).objectNames(t, typeConfigMap), priorityExpanderName))
}

func TestAddonsPriorityExpanderNeedsGroupNames(t *testing.T) {
	_, err := runAddons(t, func() *ClusterAddonsArgs {
		a := priorityArgs()
		a.GroupNames = nil
		return a
	})
	assert.ErrorContains(t, err, "missing GroupNames")
}

func TestPriorityExpanderConfigEqualRanks(t *testing.T) {
	a := priorityArgs()
	a.Pools[1].Autoscaling.Priority = a.Pools[0].Autoscaling.Priority
	doc, err := priorityExpanderConfig(a.Pools, map[string]string{"build": "g-b", "build-arm": "g.a"})
	assert.NilError(t, err)
	// One rank, both groups, sorted; the dot of a name is quoted.
	assert.Equal(t, doc, "20:\n  - \"^g-b$\"\n  - \"^g\\\\.a$\"\n")
	_, err = priorityExpanderConfig(a.Pools, map[string]string{"build": "g-b"})
	assert.ErrorContains(t, err, "pool build-arm: no Auto Scaling group name")
}

// TestAddonsAutoscalerBackoffFlags: the node group backoff that moves a scale-up off a group AWS cannot launch in is
// pinned (autoscalerArgs says why).
func TestAddonsAutoscalerBackoffFlags(t *testing.T) {
	args := autoscalerArgs("dev", testAddonsArgs().Autoscaler)
	for _, want := range []string{"--initial-node-group-backoff-duration=5m0s",
		"--max-node-group-backoff-duration=30m0s", "--node-group-backoff-reset-timeout=3h0m0s"} {
		assert.Check(t, is.Contains(args, want))
	}
}

package infra_test

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra/config"
)

// nameTags collects every Name tag value in v (an input of a resource): `tags: {Name: ...}` maps and the groups'
// `[{key: Name, value: ...}]` lists.
func nameTags(v any, out map[string]bool) {
	switch t := v.(type) {
	case map[string]any:
		if n, ok := t["Name"].(string); ok {
			out[n] = true
		}
		if t["key"] == "Name" {
			if n, ok := t["value"].(string); ok {
				out[n] = true
			}
		}
		for _, e := range t {
			nameTags(e, out)
		}
	case []any:
		for _, e := range t {
			nameTags(e, out)
		}
	}
}

// TestPoolNamesNeverTakeAStackName: every Name the stack gives a resource of its own (not a pool's) is one that
// config refuses as a pool name, so the list behind that refusal cannot fall behind the code.
func TestPoolNamesNeverTakeAStackName(t *testing.T) {
	for _, stack := range []string{"dev", "prod", "dev with a baked pool"} {
		file, _, baked := strings.Cut(stack, " ")
		values, err := config.ReadStackFile("../Pulumi." + file + ".yaml")
		assert.NilError(t, err)
		if baked {
			pool(values, 0)["image"] = config.ImageBaked
		}
		res := runStack(t, values)
		cfg, err := mockcloud.ConfigFromMap(values)
		assert.NilError(t, err)
		parsed, err := config.ParseValues(cfg.Values)
		assert.NilError(t, err)
		pools := map[string]bool{}
		for _, p := range parsed.NodePools {
			pools[parsed.ClusterName+"-"+p.Name] = true
		}
		names := map[string]bool{}
		for _, r := range res.Cloud.Resources() {
			for k := range r.Inputs {
				nameTags(in(&r, string(k)), names)
			}
		}
		assert.Assert(t, len(names) > len(pools), "%s: no Name tags found", stack)
		for name := range names {
			suffix, ok := strings.CutPrefix(name, parsed.ClusterName+"-")
			if pools[name] || !ok {
				continue
			}
			assert.Check(t, config.IsStackResourceName(suffix), "%s: %q is a Name of the stack that a pool could take",
				stack, name)
		}
	}
}

package main

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra/config"
)

// upgradeCases are the stacks whose state an upgrade must keep: the example stacks, and the dev stack with a warm
// pool on its first pool (the warm pool's launch hook is a resource of its own).
var upgradeCases = map[string]func(values map[string]any){
	"dev":  nil,
	"prod": nil,
	"dev-warm": func(values map[string]any) {
		mockcloud.Pool(values, 0)["warmPool"] = map[string]any{"size": 1, "state": "Stopped"}
	},
}

// TestUpgradeKeepsEveryResource: every resource a stack of a landed release holds in its state is still declared,
// under its URN or through an alias, so that `pulumi up` after an upgrade updates it in place instead of deleting it
// and creating a new one (a renamed node pool group would terminate its nodes; a renamed route would collide with
// the old one). testdata/upgrade/NAME.urns lists the URNs of the landed plans, one a line. `go test -update` adds
// the URNs of the current plan and never removes one: a resource dropped on purpose is taken out of the list by
// hand, with a line in docs/operations.md's upgrade notes.
func TestUpgradeKeepsEveryResource(t *testing.T) {
	for _, name := range slices.Sorted(maps.Keys(upgradeCases)) {
		t.Run(name, func(t *testing.T) {
			stack, _, _ := strings.Cut(name, "-")
			values, err := config.ReadStackFile("Pulumi." + stack + ".yaml")
			assert.NilError(t, err)
			if mutate := upgradeCases[name]; mutate != nil {
				mutate(values)
			}
			cfg, err := mockcloud.ConfigFromMap(values)
			assert.NilError(t, err)
			res, err := plan.RunConfig(stack, cfg)
			assert.NilError(t, err)
			accepted := res.Cloud.AcceptedURNs()

			path := filepath.Join("testdata", "upgrade", name+".urns")
			landed := readURNs(t, path)
			for _, urn := range landed {
				if _, ok := accepted[urn]; !ok {
					t.Errorf("%s: no resource of the new plan takes over %s (give the renamed resource an alias)",
						path, urn)
				}
			}
			if golden.FlagUpdate() {
				current := map[string]bool{}
				for _, r := range res.Cloud.Resources() {
					if !r.Read {
						current[r.URN] = true
					}
				}
				for _, urn := range landed {
					current[urn] = true
				}
				assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				assert.NilError(t, os.WriteFile(path,
					[]byte(strings.Join(slices.Sorted(maps.Keys(current)), "\n")+"\n"), 0o644))
			}
		})
	}
}

// readURNs reads a URN list; a missing file is an empty list only while it is being written.
func readURNs(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) && golden.FlagUpdate() {
		return nil
	}
	assert.NilError(t, err)
	return strings.Fields(string(raw))
}

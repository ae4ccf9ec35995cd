package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

const module = "github.com/dynk8s/dynk8s"

// importRules are the package boundaries: each package (the key) must not depend, directly or through another
// package, on any import path with one of the listed prefixes. Pure packages stay testable without the engine, and
// the in-cluster component never needs the AWS SDK.
var importRules = map[string][]string{
	// The schema depends on no renderer: the facts both need live in internal/kube, the endpoint type in
	// internal/endpoint.
	module + "/infra/config": {"github.com/pulumi/", module + "/cloudinit", module + "/infra/addons"},
	module + "/cloudinit":    {"github.com/pulumi/", module + "/infra"},
	module + "/wireguard":    {"github.com/pulumi/", module + "/"},
	module + "/infra/addons": {"github.com/pulumi/pulumi-aws/", module + "/infra/"},
	// The tools for a real cluster read stack files with infra/config, never through the offline plan (cmd/plan/...:
	// the mock engine and the plan's report) or the Pulumi SDK; explain sizes its template nodes from the offline
	// catalog itself (internal/ec2catalog).
	module + "/cmd/timeline": {module + "/cmd/plan/", "github.com/pulumi/"},
	module + "/cmd/explain":  {module + "/cmd/plan/", "github.com/pulumi/"},
	module + "/cmd/check":    {module + "/cmd/plan/", "github.com/pulumi/"},
	// cmd/status is the one such tool that runs the program, and only for the idle bill: cmd/plan/plan prices what
	// the program declares under the mock engine (offline, well under a second). It never takes the automation API
	// (a real engine).
	module + "/cmd/status": {"github.com/pulumi/pulumi/sdk/v3/go/auto"},
	// The pipeline's gate reads a preview's JSON alone, nothing of the stack.
	module + "/cmd/previewgate/previewgate": {module + "/"},
	// The reference generator reads the config types' source; it needs the config package only for its namespace.
	module + "/infra/config/configdoc": {"github.com/pulumi/", module + "/infra/addons"},
	// The node agent is one small static binary: its wing (node/), the leaves and the AWS SDK, nothing of the stack.
	module + "/node/nodeconfig":      {"github.com/pulumi/", module + "/"},
	module + "/node/cmd/dynk8s-node": {"github.com/pulumi/", module + "/", "k8s.io/"},
	// The controller is the cluster wing's one binary: client-go, the AWS SDK, its wing (cluster/) and the leaves,
	// nothing of the stack.
	module + "/cluster/cmd/dynk8s-controller": {"github.com/pulumi/", module + "/"},
}

// exempt are allowed although a rule's prefix matches them: infra/addons takes the config types, the node agent
// its own, the WireGuard renderer the endpoint type (and the DNS-name rule it parses by).
var exempt = map[string][]string{
	module + "/infra/addons":         {module + "/infra/config"},
	module + "/wireguard":            {module + "/internal/endpoint", module + "/internal/kube"},
	module + "/node/nodeconfig":      {module + "/internal/names", module + "/internal/endpoint", module + "/internal/kube"},
	module + "/node/cmd/dynk8s-node": {module + "/node", module + "/internal/names", module + "/internal/endpoint", module + "/internal/kube"},
	module + "/cluster/cmd/dynk8s-controller": {module + "/cluster", module + "/internal/names",
		module + "/internal/endpoint", module + "/internal/kube"},
}

// leaves are the facts shared across the house (internal/): they depend on no Pulumi and on nothing of the module
// but each other (the endpoint grammar takes internal/kube's DNS-name rule).
var leaves = []string{
	module + "/internal/kube",
	module + "/internal/endpoint",
	module + "/internal/names",
	module + "/internal/ec2catalog",
}

// TestImportRules reads every package's transitive imports with `go list -deps` and checks them against
// importRules.
func TestImportRules(t *testing.T) {
	deps := packageDeps(t)
	for pkg, forbidden := range importRules {
		list, ok := deps[pkg]
		if !assert.Check(t, ok, "package %s is gone: update importRules", pkg) {
			continue
		}
		for _, prefix := range forbidden {
			var bad []string
			for _, dep := range list {
				if strings.HasPrefix(dep, prefix) && !exemptDep(pkg, dep) {
					bad = append(bad, dep)
				}
			}
			if len(bad) > 0 {
				t.Errorf("%s must not depend on %s*, but depends on %d such packages: %s", pkg, prefix, len(bad),
					strings.Join(bad[:min(len(bad), 3)], ", "))
			}
		}
	}
}

func exemptDep(pkg, dep string) bool {
	for _, e := range exempt[pkg] {
		if dep == e || strings.HasPrefix(dep, e+"/") {
			return true
		}
	}
	return false
}

// packageDeps maps each package of the module to its transitive imports (without tests).
func packageDeps(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", "./...").Output()
	assert.NilError(t, err, "go list")
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		deps[fields[0]] = fields[1:]
	}
	return deps
}

// TestInternalIsTheGroundFloor: every package under internal/, a leaf or a test kit, depends on nothing of the module
// but the leaves: no arrow runs from internal/ back up to infra, cloudinit, node/ or a command. The leaves depend on
// no Pulumi either.
func TestInternalIsTheGroundFloor(t *testing.T) {
	deps := packageDeps(t)
	for _, leaf := range leaves {
		_, ok := deps[leaf]
		assert.Check(t, ok, "leaf %s is gone: update leaves", leaf)
	}
	for pkg, list := range deps {
		if !strings.HasPrefix(pkg, module+"/internal/") {
			continue
		}
		var bad []string
		for _, dep := range list {
			if strings.HasPrefix(dep, module+"/") && !slices.Contains(leaves, dep) {
				bad = append(bad, dep)
			}
			if slices.Contains(leaves, pkg) && strings.HasPrefix(dep, "github.com/pulumi/") {
				bad = append(bad, dep)
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s is on internal/'s floor, but depends on %d packages above it: %s", pkg, len(bad),
				strings.Join(bad[:min(len(bad), 3)], ", "))
		}
	}
}

// TestContributingNamesEveryPackage: CONTRIBUTING.md's layout table names every package of the module (as `path` or
// `path/`), so the house it draws is the tree.
func TestContributingNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile("CONTRIBUTING.md")
	assert.NilError(t, err)
	doc := string(b)
	for pkg := range packageDeps(t) {
		path := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		if path == "" {
			path = "main.go"
		}
		assert.Check(t, strings.Contains(doc, "`"+path+"`") || strings.Contains(doc, "`"+path+"/`"),
			"CONTRIBUTING.md's layout table does not name %s", path)
	}
}

//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra/config"
)

// e2eKubeVersion is the Kubernetes release the e2e runs the dev stack at: the release of the tools hack/tools.sh
// builds (KUBE_VERSION: kube-apiserver, kubeadm, kubelet) and of the Cluster Autoscaler it builds
// (AUTOSCALER_VERSION, of the same minor). The example stacks pin a supported release, which the tools cannot
// follow by a version bump alone: the autoscaler of another minor builds only from that minor's source. So the e2e
// takes Pulumi.dev.yaml as it is but for kubernetes.version; TestE2EStackRunsTheToolsRelease keeps the two in step.
const e2eKubeVersion = "1.34.4"

// devStackValues is the dev stack file's config map as the e2e runs it (Pulumi.dev.yaml with kubernetes.version at
// e2eKubeVersion), for a test to change.
func devStackValues(t *testing.T) map[string]any {
	t.Helper()
	values, err := config.ReadStackFile(filepath.Join("..", "Pulumi.dev.yaml"))
	assert.NilError(t, err, "read dev stack")
	k8s, ok := values["dynk8s:kubernetes"].(map[string]any)
	if !ok {
		t.Fatal("Pulumi.dev.yaml has no dynk8s:kubernetes object")
	}
	k8s["version"] = e2eKubeVersion
	return values
}

// devConfig is the dev stack's validated config as the e2e runs it (devStackValues), so the tests run what an
// operator would deploy, at the tools' Kubernetes release.
func devConfig(t *testing.T) *config.Config {
	t.Helper()
	sc, err := mockcloud.ConfigFromMap(devStackValues(t))
	assert.NilError(t, err, "dev stack config")
	cfg, err := config.ParseValues(sc.Values)
	assert.NilError(t, err, "dev stack config")
	return cfg
}

// devStackFile writes devStackValues as a stack file, for the commands that read one (-config); its path is
// absolute.
func devStackFile(t *testing.T) string {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{"config": devStackValues(t)})
	assert.NilError(t, err)
	path := filepath.Join(t.TempDir(), "Pulumi.dev.yaml")
	assert.NilError(t, os.WriteFile(path, b, 0o644))
	return path
}

// TestE2EStackRunsTheToolsRelease checks e2eKubeVersion against hack/tools.sh: the stack the e2e deploys names the
// Kubernetes release of the binaries it runs, and its autoscaler minor (which config derives from that release) is
// the one the tools build.
func TestE2EStackRunsTheToolsRelease(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "hack", "tools.sh"))
	assert.NilError(t, err)
	read := func(name string) string {
		m := regexp.MustCompile(`(?m)^readonly ` + name + `=v?([0-9.]+)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("hack/tools.sh sets no %s", name)
		}
		return string(m[1])
	}
	assert.Equal(t, e2eKubeVersion, read("KUBE_VERSION"), "the e2e stack's kubernetes.version")
	cfg := devConfig(t)
	assert.Equal(t, cfg.Derived.AutoscalerVersion.String(), read("AUTOSCALER_VERSION"),
		"the autoscaler the e2e stack runs")

	// The file the commands are given reads back as the same config values.
	fromFile, err := mockcloud.LoadStackFile(devStackFile(t))
	assert.NilError(t, err)
	fromMap, err := mockcloud.ConfigFromMap(devStackValues(t))
	assert.NilError(t, err)
	assert.DeepEqual(t, fromFile.Values, fromMap.Values)
}

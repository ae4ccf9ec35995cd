package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// The agent's hash pins it in user data, and the controller's the controller's Deployment, so the build must give the
// same bytes wherever it runs: this one builds both twice, once from this checkout with the shared build cache and once from a copy of its sources under another
// path with an empty build cache and a caller environment that would change the bytes if the script let it
// through, and compares the binaries' sha256.
func TestAgentBuildIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent twice, once from an empty build cache")
	}
	first := t.TempDir()
	runBuild(t, ".", first, nil)

	copied := filepath.Join(t.TempDir(), "elsewhere", "dynk8s")
	copyAgentSources(t, copied)
	second := t.TempDir()
	runBuild(t, copied, second, []string{
		"GOCACHE=" + t.TempDir(), "GOFLAGS=-mod=mod -race", "GOAMD64=v3", "CGO_ENABLED=1", "GOEXPERIMENT=loopvar",
	})

	pin := regexp.MustCompile(`(?m)^readonly AGENT_GO=(go[0-9.]+)$`).FindStringSubmatch(readFile(t, "hack/build-agent.sh"))
	assert.Assert(t, pin != nil, "hack/build-agent.sh names no AGENT_GO")
	for _, name := range []string{"dynk8s-node-linux-amd64", "dynk8s-node-linux-arm64",
		"dynk8s-controller-linux-amd64", "dynk8s-controller-linux-arm64"} {
		a, b := sha256File(t, filepath.Join(first, name)), sha256File(t, filepath.Join(second, name))
		t.Logf("%s: %s", name, a)
		assert.Check(t, is.Equal(a, b), "%s differs between the two builds", name)
		info, err := buildinfo.ReadFile(filepath.Join(first, name))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(info.GoVersion, pin[1]), "%s: built by another Go release than the pinned one", name)
		for _, s := range info.Settings {
			assert.Check(t, !strings.HasPrefix(s.Key, "vcs"), "%s carries VCS state: %s=%s", name, s.Key, s.Value)
			if s.Key == "CGO_ENABLED" {
				assert.Check(t, is.Equal(s.Value, "0"), "%s is not static", name)
			}
		}
	}
}

// runBuild runs hack/build-agent.sh in dir into out, with env added to the test's environment.
func runBuild(t *testing.T, dir, out string, env []string) {
	t.Helper()
	cmd := exec.Command("hack/build-agent.sh", out)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	assert.NilError(t, err, "hack/build-agent.sh in %s:\n%s", dir, b)
}

// copyAgentSources copies go.mod, go.sum, the build script and the directory of every package of this module the
// agent or the controller imports to dst.
func copyAgentSources(t *testing.T, dst string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}",
		"./node/cmd/dynk8s-node", "./cluster/cmd/dynk8s-controller")
	cmd.Env = append(os.Environ(), "GOOS=linux", "CGO_ENABLED=0")
	out, err := cmd.Output()
	assert.NilError(t, err)
	root, err := os.Getwd()
	assert.NilError(t, err)
	files := []string{"go.mod", "go.sum", "hack/build-agent.sh"}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		assert.NilError(t, err)
		err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			r, err := filepath.Rel(root, path)
			files = append(files, r)
			return err
		})
		assert.NilError(t, err, "copying %s", rel)
	}
	for _, f := range files {
		info, err := os.Stat(f)
		assert.NilError(t, err)
		assert.NilError(t, os.MkdirAll(filepath.Join(dst, filepath.Dir(f)), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(dst, f), []byte(readFile(t, f)), info.Mode().Perm()))
	}
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(readFile(t, path)))
	return hex.EncodeToString(sum[:])
}

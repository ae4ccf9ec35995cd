package cloudinit

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
)

// renderedUserData is every cloud-config this package renders in the tests' fixtures.
func renderedUserData(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for name, in := range map[string]pool{"node-general": generalPool(), "node-spot-arm64": spotPool()} {
		ud, err := in.userData()
		assert.NilError(t, err)
		out[name] = ud
	}
	for name, ud := range renderedGatewayUserData(t) {
		out[name] = ud
	}
	return out
}

// cloud-init's own schema validator (the Debian cloud-init package) accepts every rendered cloud-config.
func TestCloudInitSchema(t *testing.T) {
	t.Parallel()
	ci := realtools.Require(t, "cloud-init")
	dir := t.TempDir()
	for name, ud := range renderedUserData(t) {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(dir, name+".yaml")
			assert.NilError(t, os.WriteFile(f, ud, 0o600))
			out, err := exec.Command(ci, "schema", "--config-file", f).CombinedOutput()
			assert.NilError(t, err, "cloud-init schema: %s", out)
			assert.Check(t, is.Contains(string(out), "Valid cloud-config"))
		})
	}
}

// The validator really rejects what it should, so a pass above means something.
func TestCloudInitSchemaRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ci := realtools.Require(t, "cloud-init")
	f := filepath.Join(t.TempDir(), "bad.yaml")
	assert.NilError(t, os.WriteFile(f, []byte(header+"write_files:\n- path: /x\n  permissions: 0600\n"), 0o600))
	out, err := exec.Command(ci, "schema", "--config-file", f).CombinedOutput()
	assert.Assert(t, err != nil, "cloud-init schema accepted an integer permissions: %s", out)
}

// Every embedded script passes shellcheck with no finding, both as committed and as stripped into user data
// (which is what runs on the node).
func TestShellcheck(t *testing.T) {
	t.Parallel()
	sc := realtools.Require(t, "shellcheck")
	for _, variant := range []struct {
		name string
		conv func(string) string
	}{{"source", func(s string) string { return s }}, {"user-data", forUserData}} {
		t.Run(variant.name, func(t *testing.T) {
			dir := t.TempDir()
			var files []string
			for name, body := range embeddedScripts() {
				f := filepath.Join(dir, name)
				assert.NilError(t, os.WriteFile(f, []byte(variant.conv(body)), 0o755))
				files = append(files, f)
			}
			args := append([]string{"-x", "-P", dir, "--norc"}, files...)
			out, err := exec.Command(sc, args...).CombinedOutput()
			assert.NilError(t, err, "shellcheck findings:\n%s", out)
		})
	}
}

// Scripts go into YAML literal blocks only when they have no tabs or trailing blanks; otherwise the marshaller
// falls back to one long double-quoted line that nobody can read in the console or the golden files.
func TestScriptsRenderAsLiteralBlocks(t *testing.T) {
	t.Parallel()
	for name, body := range embeddedScripts() {
		for i, line := range strings.Split(body, "\n") {
			assert.Check(t, !strings.Contains(line, "\t"), "%s:%d has a tab", name, i+1)
			assert.Check(t, line == strings.TrimRight(line, " "), "%s:%d has trailing blanks", name, i+1)
		}
		assert.Check(t, strings.HasPrefix(body, "#!/usr/bin/env bash\n") || strings.HasPrefix(body, "# shellcheck shell=bash\n"), name)
	}
	for name, ud := range renderedUserData(t) {
		assert.Check(t, !regexp.MustCompile(`content: "[^"]`).Match(ud), "%s: a file rendered as a quoted string", name)
	}
}

func TestForUserDataKeepsShebangAndCode(t *testing.T) {
	t.Parallel()
	in := "#!/usr/bin/env bash\n# why\nset -e\n  # indented why\necho '#not a comment'\n"
	assert.Equal(t, forUserData(in), "#!/usr/bin/env bash\nset -e\necho '#not a comment'\n")
}

// bash itself parses the stripped scripts.
func TestStrippedScriptsParse(t *testing.T) {
	t.Parallel()
	bash := realtools.Require(t, "bash")
	for name, body := range embeddedScripts() {
		cmd := exec.Command(bash, "-n")
		cmd.Stdin = strings.NewReader(forUserData(body))
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, "%s: %s", name, out)
	}
}

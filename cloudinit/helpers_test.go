package cloudinit

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/internal/testkit/scriptstub"
)

// stubScripts is user data as its golden file holds it: each embedded script as its name, carried as
// testdata/scripts.golden says (TestScriptsGolden).
func stubScripts(t *testing.T, userData []byte) string {
	t.Helper()
	m := scriptstub.Manifest{}
	s, err := scriptstub.Stub(string(userData), "scripts", m)
	assert.NilError(t, err)
	want := scriptsManifest()
	for name, carried := range m {
		assert.Check(t, carried == want[name], "%s: carried as %s, not as the embedded script's user-data form", name, carried)
	}
	return s
}

// scriptsManifest is what user data carries of each embedded script (forUserData's form).
func scriptsManifest() scriptstub.Manifest {
	m := scriptstub.Manifest{}
	for name, script := range embeddedScripts() {
		carried := forUserData(script)
		m[name] = fmt.Sprintf("sha256:%x %d lines", sha256.Sum256([]byte(carried)), strings.Count(carried, "\n"))
	}
	return m
}

// TestScriptsGolden pins every embedded script as user data carries it, once: the goldens name the scripts only, so
// an edit of one script is one line here (and one in each stack's userdata/scripts.txt).
func TestScriptsGolden(t *testing.T) {
	t.Parallel()
	golden.Assert(t, scriptsManifest().String(), "scripts.golden")
}

// parseCloudConfig reads rendered user data back into the renderer's types, refusing unknown fields, so a key the
// renderer did not mean to write (or a typo cloud-init's schema would let through) fails the test.
func parseCloudConfig(t *testing.T, userData []byte) cloudConfig {
	t.Helper()
	s := string(userData)
	if !strings.HasPrefix(s, header) {
		t.Fatalf("user data does not start with %q", header)
	}
	var cc cloudConfig
	if err := yaml.UnmarshalStrict(userData, &cc); err != nil {
		t.Fatalf("user data does not parse back: %v", err)
	}
	return cc
}

func fileByPath(t *testing.T, cc cloudConfig, path string) writeFile {
	t.Helper()
	for _, f := range cc.WriteFiles {
		if f.Path == path {
			return f
		}
	}
	t.Fatalf("no write_files entry for %s", path)
	return writeFile{}
}

// materialize writes the user data's files under root, with their modes, as cloud-init would on the node.
func materialize(t *testing.T, userData []byte, root string) {
	t.Helper()
	if err := WriteFiles(userData, root); err != nil {
		t.Fatal(err)
	}
}

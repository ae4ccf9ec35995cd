package scriptstub

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func scriptsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/bash\n# a comment the renderer drops\nset -eu\necho hi\n"
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "hello.sh"), []byte(script), 0o644))
	return dir
}

func TestStubReplacesAnEmbeddedScript(t *testing.T) {
	ud := "#cloud-config\nwrite_files:\n- content: |\n    #!/bin/bash\n    set -eu\n    echo hi\n" +
		"  path: /usr/local/libexec/x/hello.sh\n- content: |\n    keep me\n  path: /etc/x.conf\n"
	m := Manifest{}
	got, err := Stub(ud, scriptsDir(t), m)
	assert.NilError(t, err)
	assert.Equal(t, got, "#cloud-config\nwrite_files:\n- content: <script hello.sh>\n"+
		"  path: /usr/local/libexec/x/hello.sh\n- content: |\n    keep me\n  path: /etc/x.conf\n")
	assert.Equal(t, m.String(), "hello.sh sha256:26e6e62baf543bbf62867956a804f0a00236bef2f2ebd4446ec0a17529d26cd5 3 lines\n")
}

// TestStubKeepsOneManifest: the same script carried differently by two user datas of one manifest is an error, since
// the manifest's one line could not say which.
func TestStubKeepsOneManifest(t *testing.T) {
	m := Manifest{}
	whole := "#cloud-config\nwrite_files:\n- content: |\n    #!/bin/bash\n    set -eu\n    echo hi\n  path: /x/hello.sh\n"
	_, err := Stub(whole, scriptsDir(t), m)
	assert.NilError(t, err)
	_, err = Stub(whole, scriptsDir(t), m)
	assert.NilError(t, err)
	less := "#cloud-config\nwrite_files:\n- content: |\n    #!/bin/bash\n    echo hi\n  path: /y/hello.sh\n"
	_, err = Stub(less, scriptsDir(t), m)
	assert.ErrorContains(t, err, "in another user data of the same manifest")
}

// TestStubShowsAnythingElseWhole: a file named like a script but not made of its lines is an error, not a stub.
func TestStubShowsAnythingElseWhole(t *testing.T) {
	ud := "#cloud-config\nwrite_files:\n- content: |\n    echo generated\n  path: /usr/local/libexec/x/hello.sh\n"
	_, err := Stub(ud, scriptsDir(t), Manifest{})
	assert.ErrorContains(t, err, "is not the script hello.sh")
}

// TestStubRefusesWhatItWouldReformat: user data that does not marshal back to itself would change beyond its scripts.
func TestStubRefusesWhatItWouldReformat(t *testing.T) {
	_, err := Stub("#cloud-config\nwrite_files: [{path: /a, content: b}]\n", scriptsDir(t), Manifest{})
	assert.ErrorContains(t, err, "does not marshal back to itself")
}

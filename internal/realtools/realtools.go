// Package realtools runs the real validators the tests check rendered artifacts with: wg (wireguard-tools),
// shellcheck and cloud-init. A missing tool skips the test, unless DYNK8S_REQUIRE_TOOLS is set (as `make test` and
// CI do), where it fails the run instead of quietly dropping the check.
package realtools

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireEnv is the environment variable that turns a missing tool into a failure.
const RequireEnv = "DYNK8S_REQUIRE_TOOLS"

// Require returns the path of a real tool, or skips (or fails, see RequireEnv) the test without it.
func Require(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, fmt.Sprintf("%s on PATH (%v)", name, err))
	}
	return path
}

// Missing skips the test for lack of what it needs, or fails it when RequireEnv is set.
func Missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("%s is set but this test lacks %s", RequireEnv, what)
	}
	t.Skipf("lacks %s (set %s=1 to make this a failure)", what, RequireEnv)
}

// WGSetconf feeds a wg-quick file through wg-quick's own strip and wg's own parser and returns wg's stderr.
// Without a WireGuard kernel module `wg setconf` always exits 1, but only after parsing: a good file fails at the
// netlink call ("Protocol not supported"), a bad one at parsing ("Configuration parsing error").
func WGSetconf(t testing.TB, conf []byte) string {
	t.Helper()
	Require(t, "wg")
	Require(t, "wg-quick")
	// wg-quick names the interface after the file and warns about a world-readable one.
	path := filepath.Join(t.TempDir(), "wgtest.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", `wg setconf wgtest <(wg-quick strip "$1")`, "bash", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		// With no WireGuard in the kernel there is no success path; a zero exit means the premise changed.
		t.Fatal("wg setconf unexpectedly succeeded; is a WireGuard module loaded?")
	}
	return stderr.String()
}

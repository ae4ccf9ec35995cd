// Package realtools runs the real validators the tests check rendered artifacts with: wg (wireguard-tools),
// shellcheck and cloud-init; and it gives the scripts under test a PATH of their own (ClosedPath). A missing tool skips the test, unless DYNK8S_REQUIRE_TOOLS is set (as `make test` and
// CI do), where it fails the run instead of quietly dropping the check.
package realtools

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
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

// Shell lists the commands the scripts under test may run for real from the host: the shells and text utilities of
// Debian's Essential packages (bash, dash, coreutils, grep, sed, findutils, gzip, util-linux), which every Debian
// system has (Debian Policy 3.8, "Essential packages"). Anything else a script runs or checks for is either a
// stand-in its test writes or a tool `make tools` installs and the test names (see ClosedPath).
var Shell = []string{
	"bash", "sh",
	// coreutils
	"base64", "basename", "cat", "chmod", "cp", "cut", "date", "dirname", "env", "head", "ln", "ls", "mkdir",
	"mkfifo", "mktemp", "mv", "od", "printf", "readlink", "rm", "seq", "sha256sum", "sleep", "sort", "stat", "tail", "tee",
	"timeout", "touch", "tr", "true", "false", "uname", "uniq", "wc",
	"grep", "sed",
}

// ClosedPath returns a directory to use as a script's whole PATH: it holds a forwarder to each of the Shell commands
// and the named tools (each resolved like Require, so a missing one skips the test or, with RequireEnv, fails it),
// and the caller writes its stand-ins beside them. Forwarders are small scripts that exec the real command, not
// links, so a test that writes a stand-in over one (even with os.WriteFile) replaces the forwarder, never the host's
// command. With nothing of the host's PATH behind it, a command the test did not provide is "not
// found" on every machine alike, and CheckNoMissingCommand turns that into a failure, instead of a test that passes
// only where the host happens to have the command (iptables, nft, ip, mount, the aws CLI...).
func ClosedPath(t testing.TB, tools ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range append(slices.Clone(Shell), tools...) {
		path := resolve(t, name)
		forward := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\"\n", shellQuote(path))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(forward), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// WriteStub writes an executable stand-in into a ClosedPath directory, in place of the forwarder to a real command
// of that name if there is one. It removes what is there first, so that not even a link another helper left can be
// written through into the host's command.
func WriteStub(t testing.TB, dir, name, script string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// resolve finds the executable behind a tool's name. A version manager's shim (pyenv's python3, say) is a script
// that needs the host's PATH, so an interpreter is asked for its own path instead.
func resolve(t testing.TB, name string) string {
	t.Helper()
	path := Require(t, name)
	if name == "python3" {
		out, err := exec.Command(path, "-c", "import sys; print(sys.executable)").Output()
		if err != nil {
			t.Fatalf("python3 cannot tell its own path: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	return path
}

// notFound matches what bash ("x: command not found") and dash ("x: not found") print for a command that is not on
// PATH.
var notFound = regexp.MustCompile(`(?m)^.*: (command )?not found$`)

// CheckNoMissingCommand fails the test when a script's output shows that it ran a command its ClosedPath lacks.
func CheckNoMissingCommand(t testing.TB, output string) {
	t.Helper()
	if m := notFound.FindAllString(output, -1); len(m) > 0 {
		t.Errorf("the script ran commands this test provides neither as a stand-in nor as a real tool "+
			"(add a stub, or a tool that `make tools` installs to realtools.ClosedPath):\n%s", strings.Join(m, "\n"))
	}
}

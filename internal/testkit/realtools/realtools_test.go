package realtools

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what the check reports instead of failing the test.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Errorf(format string, _ ...any) {
	r.errors = append(r.errors, format)
}

// A closed PATH runs the shell utilities and the stand-ins beside them, and nothing of the host's: a command the
// test did not provide is "not found" however the host is set up, and the check reports it, for bash and for dash.
func TestClosedPath(t *testing.T) {
	// A command only the host has: on the test process's PATH, so ClosedPath sees it, but not asked for.
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "dynk8s-host-only"), []byte("#!/bin/sh\necho host\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", host+string(os.PathListSeparator)+os.Getenv("PATH"))
	dir := ClosedPath(t)
	WriteStub(t, dir, "iptables", "#!/bin/sh\necho stand-in\n")
	for _, shell := range []string{"bash", "sh"} {
		run := func(script string) string {
			cmd := exec.Command(shell, "-c", script)
			cmd.Env = []string{"PATH=" + dir}
			out, _ := cmd.CombinedOutput()
			return string(out)
		}
		if out := run("iptables; date +%Y >/dev/null; sed -n 1p </dev/null"); strings.TrimSpace(out) != "stand-in" {
			t.Errorf("%s: the stand-in and the shell utilities should run: %q", shell, out)
		}
		out := run("dynk8s-host-only")
		r := &recorder{TB: t}
		CheckNoMissingCommand(r, out)
		if len(r.errors) != 1 {
			t.Errorf("%s: a host command missing from the closed PATH ran or was not reported: %q", shell, out)
		}
		r = &recorder{TB: t}
		CheckNoMissingCommand(r, run("command -v dynk8s-no-such-command || echo absent"))
		if len(r.errors) != 0 {
			t.Errorf("%s: a script's own look-up (command -v) is not a missing command", shell)
		}
	}
}

// Writing a stand-in over a ClosedPath command, whether with WriteStub or a plain os.WriteFile, replaces the
// directory's entry, never the host's command behind it.
func TestStandInsNeverReachTheHostsCommand(t *testing.T) {
	host := t.TempDir()
	hostCmd := filepath.Join(host, "dynk8s-real")
	if err := os.WriteFile(hostCmd, []byte("#!/bin/sh\necho real\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", host+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, write := range []func(dir string){
		func(dir string) { WriteStub(t, dir, "dynk8s-real", "#!/bin/sh\necho stub\n") },
		func(dir string) {
			if err := os.WriteFile(filepath.Join(dir, "dynk8s-real"), []byte("#!/bin/sh\necho stub\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		},
	} {
		dir := ClosedPath(t, "dynk8s-real")
		run := func() ([]byte, error) {
			cmd := exec.Command(filepath.Join(dir, "dynk8s-real"))
			cmd.Env = []string{"PATH=" + dir}
			return cmd.Output()
		}
		if out, err := run(); err != nil || string(out) != "real\n" {
			t.Fatalf("the forwarder does not run the real command: %q %v", out, err)
		}
		write(dir)
		if b, err := os.ReadFile(hostCmd); err != nil || string(b) != "#!/bin/sh\necho real\n" {
			t.Fatalf("a stand-in was written into the host's command: %q %v", b, err)
		}
		if out, err := run(); err != nil || string(out) != "stub\n" {
			t.Fatalf("the stand-in does not run: %q %v", out, err)
		}
	}
}

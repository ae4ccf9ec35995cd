// Package system is the agent's seam to the machine: the commands it runs (Host), the files under the node's root
// (Files), one deadline with retries (Clock), the log (Logger) and the boot's timeline, and the configuration files
// with their test hooks.
package system

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Baked is the baked image's marker (/etc/dynk8s/baked.json).
func (f Files) Baked() string { return f.Etc("dynk8s/baked.json") }

// KubeletPKI is the kubelet's certificate directory: its --cert-dir default, which kubeadm keeps
// (cmd/kubelet/app/options/options.go at v1.34.4, CertDirectory "/var/lib/kubelet/pki").
func (f Files) KubeletPKI() string { return f.Root + "/var/lib/kubelet/pki" }

// KubeletKey is where the kubelet's TLS bootstrap keeps the private key of its client certificate request until
// the certificate is issued, and takes a valid key it finds there instead of making one
// (pkg/kubelet/certificate/bootstrap/bootstrap.go at v1.34.4, LoadClientCert: tmpPrivateKeyFile and
// keyutil.LoadOrGenerateKeyFile).
func (f Files) KubeletKey() string { return f.KubeletPKI() + "/kubelet-client.key.tmp" }

// Host runs the commands that change the node (dnf, systemctl, kubeadm, ...): the one seam between the boot's
// logic and the machine, so the table tests record command lines instead.
type Host interface {
	// Run runs name with args, its output to the unit's (quiet: discarded), killed at timeout (0: none).
	Run(ctx context.Context, timeout time.Duration, quiet bool, name string, args ...string) error
	// Output runs a query (rpm -q) and returns its standard output, even in a dry run: it changes nothing.
	Output(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error)
	// Has says whether name is on PATH.
	Has(name string) bool
}

// ExitError is a command that ran and failed, with its exit status.
type ExitError struct {
	Name string
	Code int
	// Tail is the end of what a command run by Run wrote (both streams, at most TailSize bytes), where its own
	// reason is: dnf prints it last.
	Tail string
}

// TailSize is how much of a failed command's output its ExitError keeps.
const TailSize = 8 << 10

func (e *ExitError) Error() string { return fmt.Sprintf("%s exited %d", e.Name, e.Code) }

// RealHost runs commands for real, stdout and stderr to the agent's stderr (the journal); dryRun only logs them.
type RealHost struct {
	Out    io.Writer
	DryRun bool
	Log    *Logger
}

// Run runs name with args, or with DryRun logs it.
func (h RealHost) Run(ctx context.Context, timeout time.Duration, quiet bool, name string, args ...string) error {
	if h.DryRun {
		h.Log.Printf("dry run: would run %s %s", name, strings.Join(args, " "))
		return nil
	}
	ctx, cmd, cancel := command(ctx, timeout, name, args)
	defer cancel()
	var tail tailBuffer
	if !quiet {
		// One writer for both streams: exec copies them through one pipe, in the order the command wrote.
		var out io.Writer = &tail
		if h.Out != nil {
			out = io.MultiWriter(h.Out, &tail)
		}
		cmd.Stdout, cmd.Stderr = out, out
	}
	err := commandError(ctx, cmd.Run(), name, timeout)
	if ee := (*ExitError)(nil); errors.As(err, &ee) {
		ee.Tail = string(tail)
	}
	return err
}

// tailBuffer keeps the last TailSize bytes written to it.
type tailBuffer []byte

func (b *tailBuffer) Write(p []byte) (int, error) {
	*b = append(*b, p...)
	if over := len(*b) - TailSize; over > 0 {
		*b = append((*b)[:0], (*b)[over:]...)
	}
	return len(p), nil
}

// Output runs a query and returns its standard output, in a dry run too (it changes nothing); a command that ran
// and failed gives its output and an *ExitError (rpm -q says "not installed" so), with its standard error.
func (h RealHost) Output(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cmd, cancel := command(ctx, timeout, name, args)
	defer cancel()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err = commandError(ctx, err, name, timeout); err != nil {
		if ee := (*ExitError)(nil); errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
	}
	return string(out), err
}

// command is name with args under ctx and, as timeout(1) -k does, SIGTERM at timeout (0: none) and SIGKILL 10 s
// later; the context it returns is the one the timeout ends.
func command(ctx context.Context, timeout time.Duration, name string, args []string) (context.Context, *exec.Cmd,
	context.CancelFunc) {
	cancel := context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	return ctx, cmd, cancel
}

// commandError is how a command ended: nil, its timeout, an *ExitError, or why it did not run.
func commandError(ctx context.Context, err error, name string, timeout time.Duration) error {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%s timed out after %s", name, timeout)
	case errors.As(err, &ee):
		return &ExitError{Name: name, Code: ee.ExitCode()}
	default:
		return fmt.Errorf("%s: %w", name, err)
	}
}

// Has says whether name is on PATH.
func (h RealHost) Has(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

// Files is where the node's state lives: under root in tests (DYNK8S_ROOT), / on a node; proc is /proc
// (DYNK8S_PROC in tests).
type Files struct {
	Root, Proc string
}

// Etc is /etc/p under the root.
func (f Files) Etc(p string) string { return f.Root + "/etc/" + p }

// Run is /run/dynk8s/p under the root, the agent's state of this boot.
func (f Files) Run(p string) string { return f.Root + "/run/dynk8s/" + p }

// State is /var/lib/dynk8s/p under the root, the agent's state kept across boots and stops.
func (f Files) State(p string) string { return f.Root + "/var/lib/dynk8s/" + p }

// Exists says whether p is there.
func (f Files) Exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// WriteFileAtomic writes b to path through a rename, so a reader sees the old file or the whole new one.
func WriteFileAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path+".new", b, mode); err != nil {
		return err
	}
	return os.Rename(path+".new", path)
}

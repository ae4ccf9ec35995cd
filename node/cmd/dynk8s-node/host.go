package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// host runs the commands that change the node (dnf, systemctl, kubeadm, ...): the one seam between the boot's
// logic and the machine, so the table tests record command lines instead.
type host interface {
	// run runs name with args, its output to the unit's (quiet: discarded), killed at timeout (0: none).
	run(ctx context.Context, timeout time.Duration, quiet bool, name string, args ...string) error
	// output runs a query (rpm -q) and returns its standard output, even in a dry run: it changes nothing.
	output(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error)
	// has says whether name is on PATH.
	has(name string) bool
}

// exitError is a command that ran and failed, with its exit status.
type exitError struct {
	name string
	code int
}

func (e *exitError) Error() string { return fmt.Sprintf("%s exited %d", e.name, e.code) }

// realHost runs commands for real, stdout and stderr to the agent's stderr (the journal); dryRun only logs them.
type realHost struct {
	out    io.Writer
	dryRun bool
	log    *logger
}

func (h realHost) run(ctx context.Context, timeout time.Duration, quiet bool, name string, args ...string) error {
	if h.dryRun {
		h.log.Printf("dry run: would run %s %s", name, strings.Join(args, " "))
		return nil
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, name, args...)
	// As timeout(1) -k: SIGTERM at the timeout, SIGKILL 10 s later.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if !quiet {
		cmd.Stdout, cmd.Stderr = h.out, h.out
	}
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%s timed out after %s", name, timeout)
	case errors.As(err, &ee):
		return &exitError{name: name, code: ee.ExitCode()}
	default:
		return fmt.Errorf("%s: %w", name, err)
	}
}

// output runs a query and returns its standard output, in a dry run too (it changes nothing); a command that ran
// and failed gives its output and an *exitError (rpm -q says "not installed" so), with its standard error.
func (h realHost) output(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), nil
	case ctx.Err() != nil:
		return string(out), fmt.Errorf("%s timed out after %s", name, timeout)
	case errors.As(err, &ee):
		return string(out), fmt.Errorf("%w: %s", &exitError{name: name, code: ee.ExitCode()}, strings.TrimSpace(stderr.String()))
	default:
		return string(out), fmt.Errorf("%s: %w", name, err)
	}
}

func (h realHost) has(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

// files is where the node's state lives: under root in tests (DYNK8S_ROOT), / on a node; proc is /proc
// (DYNK8S_PROC in tests).
type files struct {
	root, proc string
}

func (f files) etc(p string) string { return f.root + "/etc/" + p }
func (f files) run(p string) string { return f.root + "/run/dynk8s/" + p }

func (f files) exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

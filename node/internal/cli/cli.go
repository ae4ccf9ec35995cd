// Package cli is the node agent's frame: one Command type, one dispatch over the command table, the flags every
// command shares, and one way a run fails (one FAILED line, to the journal and the kernel log, exit 1).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Command is one of the agent's commands, a row of the command table.
type Command struct {
	// Name is the command's word (dynk8s-node NAME); Tag is its log tag (journalctl -t TAG), kept stable for the
	// operators' greps (docs/troubleshooting.md).
	Name, Tag string
	// Config is the default path of the command's configuration under the root; "": the command takes no --config.
	Config string
	// DryRun and Verbose are the help texts of --dry-run and -v; "": the command has no such flag.
	DryRun, Verbose string
	// Strings are the command's own string flags, by name, with their help.
	Strings map[string]string
	// Run is the command. An error it returns is the run's one reason, unless it is Reported.
	Run func(ctx context.Context, env *Env) error
}

// Env is what a command runs with: its parsed flags, where the node's files are, and a logger under its tag.
type Env struct {
	Files system.Files
	Log   *system.Logger
	// Out is the command's standard error, which its unit sends to the journal.
	Out io.Writer
	// Config, DryRun and Verbose are the shared flags' values.
	Config          string
	DryRun, Verbose bool
	strings         map[string]*string
}

// String is the value of the command's own string flag name.
func (e *Env) String(name string) string {
	if p := e.strings[name]; p != nil {
		return *p
	}
	return ""
}

// LogConfig logs the configuration the command read, with -v.
func (e *Env) LogConfig(cfg interface{ Encode() ([]byte, error) }) {
	if e.Verbose {
		b, _ := cfg.Encode()
		e.Log.Printf("config %s:\n%s", e.Config, b)
	}
}

// NodeConfig reads the node's configuration at --config strictly, with the test hooks' deadlines, and logs it with -v.
func (e *Env) NodeConfig() (nodeconfig.Node, error) {
	cfg, err := system.LoadConfig(e.Config)
	if err != nil {
		return cfg, err
	}
	e.LogConfig(cfg)
	return cfg, nil
}

// Host runs the commands that change the machine, for real or, with --dry-run, logged only.
func (e *Env) Host() system.RealHost {
	return system.RealHost{Out: e.Out, DryRun: e.DryRun, Log: e.Log}
}

// errReported is an error whose reason the command has logged already.
type errReported struct{ error }

// Reported marks err as logged by the command itself (the boot logs its reason and then completes its lifecycle
// action): the dispatch exits 1 without a second FAILED line.
func Reported(err error) error { return errReported{err} }

// UsageError is a command line the command cannot run: the dispatch prints it and exits 2.
type UsageError string

func (e UsageError) Error() string { return string(e) }

// Files is where the node's state lives: / on an instance; the test hooks DYNK8S_ROOT (a prefix of /etc, /run,
// /var and /dev) and DYNK8S_PROC (for /proc).
func Files() system.Files {
	f := system.Files{Root: os.Getenv("DYNK8S_ROOT"), Proc: os.Getenv("DYNK8S_PROC")}
	if f.Proc == "" {
		f.Proc = "/proc"
	}
	return f
}

// Main runs the command args name, and is the process's exit status: 0, 1 for a failed run, 2 for a command line
// it cannot run.
func Main(ctx context.Context, commands []Command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage(commands))
		return 2
	}
	if args[0] == "version" {
		fmt.Fprintln(stdout, system.Version)
		return 0
	}
	var cmd *Command
	for i := range commands {
		if commands[i].Name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "dynk8s-node: unknown command %q\n%s\n", args[0], usage(commands))
		return 2
	}
	env := &Env{Files: Files(), Out: stderr, strings: map[string]*string{}}
	flags := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	flags.SetOutput(stderr)
	if cmd.Config != "" {
		flags.StringVar(&env.Config, "config", env.Files.Root+cmd.Config, "the configuration")
	}
	if cmd.DryRun != "" {
		flags.BoolVar(&env.DryRun, "dry-run", false, cmd.DryRun)
	}
	if cmd.Verbose != "" {
		flags.BoolVar(&env.Verbose, "v", false, cmd.Verbose)
	}
	for name, help := range cmd.Strings {
		env.strings[name] = flags.String(name, "", help)
	}
	if err := flags.Parse(args[1:]); err != nil {
		return 2
	}
	env.Log = system.NewLogger(cmd.Tag, stderr, env.Files.Root)
	err := cmd.Run(ctx, env)
	var ue UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "usage: dynk8s-node %s %s\n", cmd.Name, ue)
		return 2
	case errors.As(err, &errReported{}):
		return 1
	default:
		return system.Failed(env.Log, err)
	}
}

// usage is one line per command, with its flags.
func usage(commands []Command) string {
	lines := []string{"usage:"}
	for _, c := range commands {
		line := "  dynk8s-node " + c.Name
		if c.Config != "" {
			line += " [--config FILE]"
		}
		if c.DryRun != "" {
			line += " [--dry-run]"
		}
		if c.Verbose != "" {
			line += " [-v]"
		}
		for name := range c.Strings {
			line += " --" + name + " VALUE"
		}
		lines = append(lines, line)
	}
	return strings.Join(append(lines, "  dynk8s-node version"), "\n")
}

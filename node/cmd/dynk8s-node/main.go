// Command dynk8s-node is the node agent, one static binary that cloud-init's units run: on a pool's instance, with
// the node's configuration (/etc/dynk8s/node.json, node/nodeconfig), the boot (join), the wake-up of the stack's
// WireGuard gateway (wake-gateway), the routes toward on-prem (onprem-routes) and the lockdown of the instance
// metadata service (imds-lock); on the gateway, with its configuration (/etc/dynk8s/gateway.json), its key,
// packages and idle check (gateway.go); in an image build, the prepare step and what follows it (prepare.go).
//
//	dynk8s-node join|wake-gateway|onprem-routes|imds-lock [--config FILE] [--dry-run] [-v]
//	dynk8s-node gateway-key|gateway-packages|gateway-idle [--config FILE] [--dry-run] [-v]
//	dynk8s-node prepare [--config FILE] [-v]     (an image build's first step, docs/baked-images.md)
//	dynk8s-node clean-identity [--dry-run]       (and its last)
//	dynk8s-node check-image --config-sha256 HEX  (its validate step)
//	dynk8s-node version
//
// --dry-run reads what the boot reads (IMDS, the join token, Auto Scaling's descriptions) and logs what it would
// change instead of changing it: for an operator on a node. Test hooks (environment): DYNK8S_ROOT prefixes /etc,
// /run, /var and /dev, DYNK8S_PROC replaces /proc, DYNK8S_IMDS_ENDPOINT and DYNK8S_<SERVICE>_ENDPOINT (SSM,
// AUTOSCALING, EC2) replace AWS's, and DYNK8S_DEADLINE_SECONDS, DYNK8S_BACKOFF_INITIAL_MS, DYNK8S_BACKOFF_MAX_MS,
// DYNK8S_WAKE_SETTLE_SECONDS and DYNK8S_WAKE_INTERVAL_SECONDS replace the config's deadlines.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "devel"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: dynk8s-node join|wake-gateway|onprem-routes|imds-lock [--config FILE] [--dry-run] [-v] | "+
			"gateway-key|gateway-packages|gateway-idle [--config FILE] [--dry-run] [-v] | "+
			"prepare [--config FILE] [-v] | clean-identity [--dry-run] | check-image --config-sha256 HEX | version")
		return 2
	}
	cmd, args := args[0], args[1:]
	if cmd == "version" {
		fmt.Fprintln(stdout, version)
		return 0
	}
	if image, ok := imageCommands[cmd]; ok {
		return image(ctx, args, stderr)
	}
	if _, ok := gatewayCommands[cmd]; ok {
		return runGateway(ctx, cmd, args, stderr)
	}
	tag, ok := map[string]string{"join": "dynk8s-join", "wake-gateway": "dynk8s-wake-gateway",
		"onprem-routes": "dynk8s-onprem-routes", "imds-lock": "dynk8s-imds-lock"}[cmd]
	if !ok {
		fmt.Fprintf(stderr, "dynk8s-node: unknown command %q\n", cmd)
		return 2
	}
	f := files{root: os.Getenv("DYNK8S_ROOT"), proc: os.Getenv("DYNK8S_PROC")}
	if f.proc == "" {
		f.proc = "/proc"
	}
	flags := flag.NewFlagSet(cmd, flag.ContinueOnError)
	flags.SetOutput(stderr)
	config := flags.String("config", f.root+nodeconfig.Path, "the node's configuration")
	dryRun := flags.Bool("dry-run", false, "read, but change nothing: log what it would do")
	verbose := flags.Bool("v", false, "log the configuration and, with --dry-run, the JoinConfiguration (token hidden)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	log := newLogger(tag, stderr, f.root)
	if cmd == "join" && alreadyJoined(f) {
		log.Printf("already joined (%s exists); nothing to do", f.etc("kubernetes/kubelet.conf"))
		return 0
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return failed(log, err)
	}
	if *verbose {
		b, _ := cfg.Encode()
		log.Printf("config %s:\n%s", *config, b)
	}
	d := cfg.Deadlines
	switch cmd {
	case "onprem-routes":
		clock := newClock(d.Routes.D(), d.BackoffInitial.D(), d.BackoffMax.D())
		if err := onPremRoutes(ctx, cfg, ipRoutes{dryRun: *dryRun, log: log}, clock, log); err != nil {
			return failed(log, err)
		}
		return 0
	case "imds-lock":
		h := realHost{out: stderr, dryRun: *dryRun, log: log}
		if err := lockMetadata(ctx, cfg, localUser(f.etc("passwd")), h, f, log); err != nil {
			return failed(log, err)
		}
		return 0
	}
	cloud := newCloud()
	switch cmd {
	case "wake-gateway":
		w := &waker{cloud: cloud, log: log, dryRun: *dryRun, settle: d.WakeSettle.D(), interval: d.WakeInterval.D(),
			clock: newClock(d.Wake.D(), d.BackoffInitial.D(), d.BackoffMax.D())}
		if w.wake(ctx, cfg.GatewayInstanceID) != nil {
			return 1
		}
		return 0
	default:
		j := &joiner{cfg: cfg, cloud: cloud, host: realHost{out: stderr, dryRun: *dryRun, log: log}, files: f,
			log: log, clock: newClock(d.Join.D(), d.BackoffInitial.D(), d.BackoffMax.D()), tl: newTimeline(time.Now),
			dryRun: *dryRun, verbose: *verbose}
		if j.waiting(ctx) {
			return 0
		}
		if j.run(ctx) != nil {
			return 1
		}
		return 0
	}
}

// failed logs a run's one reason, to the journal and the kernel log (the serial console), and is its exit status.
func failed(log *logger, err error) int {
	log.Printf("FAILED: %v", err)
	log.Kernel(3, "FAILED: "+err.Error())
	return 1
}

// loadConfig reads the node's configuration strictly, with the test hooks' deadlines.
func loadConfig(path string) (nodeconfig.Node, error) {
	cfg, err := readConfig(path, nodeconfig.Decode)
	if err != nil {
		return cfg, err
	}
	d := &cfg.Deadlines
	return cfg, applyDeadlineHooks([]deadlineHook{
		{"DYNK8S_DEADLINE_SECONDS", []*nodeconfig.Duration{&d.Join, &d.Wake, &d.Routes}, time.Second},
		{"DYNK8S_BACKOFF_INITIAL_MS", []*nodeconfig.Duration{&d.BackoffInitial}, time.Millisecond},
		{"DYNK8S_BACKOFF_MAX_MS", []*nodeconfig.Duration{&d.BackoffMax}, time.Millisecond},
		{"DYNK8S_WAKE_SETTLE_SECONDS", []*nodeconfig.Duration{&d.WakeSettle}, time.Second},
		{"DYNK8S_WAKE_INTERVAL_SECONDS", []*nodeconfig.Duration{&d.WakeInterval}, time.Second},
	})
}

// readConfig opens a configuration file and decodes it with decode (strict), naming the file in any error.
func readConfig[T any](path string, decode func(io.Reader) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, fmt.Errorf("config %s is missing or unreadable: %w", path, err)
	}
	defer f.Close()
	cfg, err := decode(f)
	if err != nil {
		return zero, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// deadlineHook is a test hook: an environment variable whose whole number, in unit, replaces the deadlines into.
type deadlineHook struct {
	env  string
	into []*nodeconfig.Duration
	unit time.Duration
}

// applyDeadlineHooks applies the hooks whose variable is set.
func applyDeadlineHooks(hooks []deadlineHook) error {
	for _, h := range hooks {
		v := os.Getenv(h.env)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errors.New(h.env + "=" + v + " is not a whole number")
		}
		for _, into := range h.into {
			*into = nodeconfig.Duration(time.Duration(n) * h.unit)
		}
	}
	return nil
}

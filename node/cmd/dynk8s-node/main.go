package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/boot"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/gateway"
	"github.com/dynk8s/dynk8s/node/internal/hostsetup"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

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
		fmt.Fprintln(stdout, system.Version)
		return 0
	}
	if image, ok := imageCommands[cmd]; ok {
		return image(ctx, args, stderr)
	}
	if _, ok := gateway.Tags[cmd]; ok {
		return runGateway(ctx, cmd, args, stderr)
	}
	tag, ok := map[string]string{"join": "dynk8s-join", "wake-gateway": "dynk8s-wake-gateway",
		"onprem-routes": "dynk8s-onprem-routes", "imds-lock": "dynk8s-imds-lock"}[cmd]
	if !ok {
		fmt.Fprintf(stderr, "dynk8s-node: unknown command %q\n", cmd)
		return 2
	}
	f := system.Files{Root: os.Getenv("DYNK8S_ROOT"), Proc: os.Getenv("DYNK8S_PROC")}
	if f.Proc == "" {
		f.Proc = "/proc"
	}
	flags := flag.NewFlagSet(cmd, flag.ContinueOnError)
	flags.SetOutput(stderr)
	config := flags.String("config", f.Root+nodeconfig.Path, "the node's configuration")
	dryRun := flags.Bool("dry-run", false, "read, but change nothing: log what it would do")
	verbose := flags.Bool("v", false, "log the configuration and, with --dry-run, the JoinConfiguration (token hidden)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	log := system.NewLogger(tag, stderr, f.Root)
	if cmd == "join" && boot.AlreadyJoined(f) {
		log.Printf("already joined (%s exists); nothing to do", f.Etc("kubernetes/kubelet.conf"))
		return 0
	}
	cfg, err := system.LoadConfig(*config)
	if err != nil {
		return system.Failed(log, err)
	}
	if *verbose {
		b, _ := cfg.Encode()
		log.Printf("config %s:\n%s", *config, b)
	}
	d := cfg.Deadlines
	switch cmd {
	case "onprem-routes":
		clock := system.NewClock(d.Routes.D(), d.BackoffInitial.D(), d.BackoffMax.D())
		if err := hostsetup.OnPremRoutes(ctx, cfg, hostsetup.IpRoutes{DryRun: *dryRun, Log: log}, clock, log); err != nil {
			return system.Failed(log, err)
		}
		return 0
	case "imds-lock":
		h := system.RealHost{Out: stderr, DryRun: *dryRun, Log: log}
		if err := hostsetup.LockMetadata(ctx, cfg, hostsetup.LocalUser(f.Etc("passwd")), h, f, log); err != nil {
			return system.Failed(log, err)
		}
		return 0
	}
	cloud := cloud.New()
	switch cmd {
	case "wake-gateway":
		w := &boot.Waker{Cloud: cloud, Log: log, DryRun: *dryRun, Settle: d.WakeSettle.D(), Interval: d.WakeInterval.D(),
			Clock: system.NewClock(d.Wake.D(), d.BackoffInitial.D(), d.BackoffMax.D())}
		if w.Wake(ctx, cfg.GatewayInstanceID) != nil {
			return 1
		}
		return 0
	default:
		j := &boot.Joiner{Cfg: cfg, Cloud: cloud, Host: system.RealHost{Out: stderr, DryRun: *dryRun, Log: log}, Files: f,
			Log: log, Clock: system.NewClock(d.Join.D(), d.BackoffInitial.D(), d.BackoffMax.D()), Tl: system.NewTimeline(time.Now),
			DryRun: *dryRun, Verbose: *verbose}
		if j.Waiting(ctx) {
			return 0
		}
		if j.Run(ctx) != nil {
			return 1
		}
		return 0
	}
}

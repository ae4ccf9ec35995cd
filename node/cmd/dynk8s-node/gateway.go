package main

import (
	"context"
	"flag"
	"io"
	"os"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/gateway"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The WireGuard gateway's commands, run by its units with the gateway's configuration (/etc/dynk8s/gateway.json,
// nodeconfig.Gateway):
//
//	dynk8s-node gateway-key [--config FILE] [--dry-run] [-v]       wg-quick@wg0's ExecStartPre: the key from SSM
//	dynk8s-node gateway-packages [--config FILE] [--dry-run] [-v]  install wireguard-tools and nftables, start wg0
//	dynk8s-node gateway-idle [--config FILE] [--dry-run] [-v]      the idle check, once a minute: stop when idle
//
// Each logs under the tag its script had, and on failure logs one reason (to the kernel log too) and exits 1.

// runGateway is main's run for the gateway's commands.
func runGateway(ctx context.Context, cmd string, args []string, stderr io.Writer) int {
	f := system.Files{Root: os.Getenv("DYNK8S_ROOT")}
	flags := flag.NewFlagSet(cmd, flag.ContinueOnError)
	flags.SetOutput(stderr)
	config := flags.String("config", f.Root+nodeconfig.GatewayPath, "the gateway's configuration")
	dryRun := flags.Bool("dry-run", false, "read, but change nothing: log what it would do")
	verbose := flags.Bool("v", false, "log the configuration")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	log := system.NewLogger(gateway.Tags[cmd], stderr, f.Root)
	g := &gateway.GatewayRun{Cloud: cloud.New(), Host: system.RealHost{Out: stderr, DryRun: *dryRun, Log: log}, Files: f, Log: log,
		Now: time.Now, DryRun: *dryRun}
	err := func() error {
		cfg, err := gateway.LoadGatewayConfig(*config)
		if err != nil {
			return err
		}
		if *verbose {
			b, _ := cfg.Encode()
			log.Printf("config %s:\n%s", *config, b)
		}
		g.Cfg = cfg
		switch cmd {
		case "gateway-key":
			return g.Key(ctx)
		case "gateway-packages":
			return g.Packages(ctx)
		default:
			return g.Idle(ctx)
		}
	}()
	if err != nil {
		return system.Failed(log, err)
	}
	return 0
}

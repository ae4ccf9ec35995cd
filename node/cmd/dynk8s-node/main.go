// Command dynk8s-node is the node agent, one static binary that cloud-init's units run: on a pool's instance, with the
// node's configuration (/etc/dynk8s/node.json, node/nodeconfig), the boot (join), the wake-up of the stack's WireGuard
// gateway (wake-gateway), the routes toward on-prem (onprem-routes) and the lockdown of the instance metadata service
// (imds-lock); on the gateway, with its configuration (/etc/dynk8s/gateway.json), its key, packages and idle check, and
// the on-prem peer's address kept across its stops (wg-quick's hooks); on a bake instance (cmd/bake), the bake: the
// prepare step and what follows it. The commands are the table below, which node/internal/cli runs.
//
//	dynk8s-node join [--config FILE] [--dry-run] [-v] [--skip PHASE,...]
//	dynk8s-node wake-gateway|onprem-routes|imds-lock [--config FILE] [--dry-run] [-v]
//	dynk8s-node gateway-key|gateway-packages|gateway-idle [--config FILE] [--dry-run] [-v]
//	dynk8s-node gateway-save-peer|gateway-dial-peer --interface IFACE [--dry-run]
//	dynk8s-node bake [--config FILE] [-v]        (a bake instance's: prepare, clean-identity, check, power off)
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
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/dynk8s/dynk8s/node/internal/boot"
	"github.com/dynk8s/dynk8s/node/internal/cli"
	"github.com/dynk8s/dynk8s/node/internal/gateway"
	"github.com/dynk8s/dynk8s/node/internal/hostsetup"
	"github.com/dynk8s/dynk8s/node/internal/image"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

const (
	dryRun    = "read, but change nothing: log what it would do"
	logConfig = "log the configuration"
)

// peerFlags are the flags of the gateway's peer commands, which wg-quick's hooks run.
var peerFlags = map[string]string{"interface": "the WireGuard interface (wg-quick's %i)"}

// commands is the agent: each command's log tag is its unit's (the gateway key's is the tag its first
// implementation logged under, kept for the operators' greps).
var commands = []cli.Command{
	{Name: "join", Tag: "dynk8s-join", Config: nodeconfig.Path, DryRun: dryRun,
		Verbose: "log the configuration and, with --dry-run, the JoinConfiguration (token hidden)",
		Strings: map[string]string{"skip": "phases to leave out, comma-separated (" + strings.Join(boot.Phases, ", ") +
			"): for an operator on a node"},
		Run: boot.Join},
	{Name: "wake-gateway", Tag: "dynk8s-wake-gateway", Config: nodeconfig.Path, DryRun: dryRun, Verbose: logConfig,
		Run: boot.WakeGateway},
	{Name: "onprem-routes", Tag: "dynk8s-onprem-routes", Config: nodeconfig.Path, DryRun: dryRun, Verbose: logConfig,
		Run: hostsetup.Routes},
	{Name: "imds-lock", Tag: "dynk8s-imds-lock", Config: nodeconfig.Path, DryRun: dryRun, Verbose: logConfig,
		Run: hostsetup.LockIMDS},
	{Name: "gateway-key", Tag: "dynk8s-wg-key", Config: nodeconfig.GatewayPath, DryRun: dryRun, Verbose: logConfig,
		Run: gateway.Key},
	{Name: "gateway-packages", Tag: "dynk8s-gateway-packages", Config: nodeconfig.GatewayPath, DryRun: dryRun,
		Verbose: logConfig, Run: gateway.Packages},
	{Name: "gateway-idle", Tag: "dynk8s-gateway-idle", Config: nodeconfig.GatewayPath, DryRun: dryRun,
		Verbose: logConfig, Run: gateway.Idle},
	{Name: "gateway-save-peer", Tag: "dynk8s-gateway-peer", DryRun: dryRun, Strings: peerFlags, Run: gateway.SavePeer},
	{Name: "gateway-dial-peer", Tag: "dynk8s-gateway-peer", DryRun: dryRun, Strings: peerFlags, Run: gateway.DialPeer},
	{Name: "bake", Tag: "dynk8s-bake", Config: nodeconfig.BakePath, Verbose: logConfig, Run: boot.Bake},
	{Name: "prepare", Tag: "dynk8s-prepare", Config: nodeconfig.Path, Verbose: logConfig, Run: boot.Prepare},
	{Name: "clean-identity", Tag: "dynk8s-clean-identity", DryRun: "list what it would remove, and remove nothing",
		Run: image.Clean},
	{Name: "check-image", Tag: "dynk8s-check-image",
		Strings: map[string]string{"config-sha256": "the sha256 of the node.json the image must be baked from"},
		Run:     image.Check},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := cli.Main(ctx, commands, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

package gateway

import (
	"context"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/cli"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
)

// The WireGuard gateway's commands, run by its units with the gateway's configuration (/etc/dynk8s/gateway.json,
// nodeconfig.Gateway): Key is wg-quick@wg0's ExecStartPre (the key from SSM), Packages installs wireguard-tools and
// nftables and starts wg0, Idle is the idle check, once a minute (stop when idle).
var (
	Key      = command((*gatewayRun).Key)
	Packages = command((*gatewayRun).Packages)
	Idle     = command((*gatewayRun).Idle)
)

func command(step func(*gatewayRun, context.Context) error) func(context.Context, *cli.Env) error {
	return func(ctx context.Context, env *cli.Env) error {
		cfg, err := loadGatewayConfig(env.Config)
		if err != nil {
			return err
		}
		env.LogConfig(cfg)
		g := &gatewayRun{cfg: cfg, cloud: cloud.New(), host: env.Host(), files: env.Files, log: env.Log, now: time.Now,
			dryRun: env.DryRun}
		return step(g, ctx)
	}
}

package hostsetup

import (
	"context"

	"github.com/dynk8s/dynk8s/node/internal/cli"
	"github.com/dynk8s/dynk8s/node/internal/system"
)

// Routes is `dynk8s-node onprem-routes`: the routes toward on-prem, via the VPC's router, capped at the tunnel's MTU.
func Routes(ctx context.Context, env *cli.Env) error {
	cfg, err := env.NodeConfig()
	if err != nil {
		return err
	}
	d := cfg.Deadlines
	clock := system.NewClock(d.Routes.D(), d.BackoffInitial.D(), d.BackoffMax.D())
	return onPremRoutes(ctx, cfg, ipRoutes{dryRun: env.DryRun, log: env.Log}, clock, env.Log)
}

// LockIMDS is `dynk8s-node imds-lock`: the instance metadata lockdown, which the kubelet's drop-in requires.
func LockIMDS(ctx context.Context, env *cli.Env) error {
	cfg, err := env.NodeConfig()
	if err != nil {
		return err
	}
	return lockMetadata(ctx, cfg, localUser(env.Files.Etc("passwd")), env.Host(), env.Files, env.Log)
}

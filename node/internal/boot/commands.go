package boot

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/cli"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/system"
)

// Join is `dynk8s-node join`, the boot: dynk8s-join.service runs it at every boot until the node has joined, and
// the warm pool's timer again and again while the instance waits there (each run waiting up to WarmPollWindow).
func Join(ctx context.Context, env *cli.Env) error {
	if alreadyJoined(env.Files) {
		env.Log.Printf("already joined (%s exists); nothing to do", env.Files.Etc("kubernetes/kubelet.conf"))
		return nil
	}
	skip, err := skipped(env.String("skip"))
	if err != nil {
		return err
	}
	cfg, err := env.NodeConfig()
	if err != nil {
		return err
	}
	d := cfg.Deadlines
	j := newJoiner(&bootEnv{skip: skip, cfg: cfg, cloud: cloud.New(), host: env.Host(), files: env.Files, log: env.Log,
		clock: system.NewClock(d.Join.D(), d.BackoffInitial.D(), d.BackoffMax.D()), tl: system.NewTimeline(time.Now),
		dryRun: env.DryRun, verbose: env.Verbose})
	if j.waiting(ctx, WarmPollWindow, WarmPollEvery) {
		return nil
	}
	if err := j.Run(ctx); err != nil {
		return cli.Reported(err)
	}
	return nil
}

// skipped is --skip's phases ("a,b"), each one of Phases.
func skipped(list string) (map[string]bool, error) {
	skip := map[string]bool{}
	for _, p := range strings.Split(list, ",") {
		switch {
		case p == "":
		case !slices.Contains(Phases, p):
			return nil, cli.UsageError(fmt.Sprintf("--skip %s: no phase %q (the phases: %s)", list, p,
				strings.Join(Phases, ", ")))
		default:
			skip[p] = true
		}
	}
	return skip, nil
}

// WakeGateway is `dynk8s-node wake-gateway`: the start of the stack's gateway, if it sleeps. The join runs the same
// beside its prepare; the unit is for an operator.
func WakeGateway(ctx context.Context, env *cli.Env) error {
	cfg, err := env.NodeConfig()
	if err != nil {
		return err
	}
	d := cfg.Deadlines
	w := &waker{cloud: cloud.New(), log: env.Log, dryRun: env.DryRun, settle: d.WakeSettle.D(), interval: d.WakeInterval.D(),
		clock: system.NewClock(d.Wake.D(), d.BackoffInitial.D(), d.BackoffMax.D())}
	if err := w.wake(ctx, cfg.GatewayInstanceID); err != nil {
		return cli.Reported(err)
	}
	return nil
}

// Bake is `dynk8s-node bake`: a bake instance's one unit (cloudinit.Bake), the prepare, clean-identity and the
// image's check, then the power-off that tells cmd/bake to take the image (docs/baked-images.md).
func Bake(ctx context.Context, env *cli.Env) error {
	return bakeImage(ctx, env, env.Host())
}

// Prepare is `dynk8s-node prepare`: an image build's first step (docs/baked-images.md, "The contract with the image
// build"), the boot's prepare phases on a build instance, then the baked marker.
func Prepare(ctx context.Context, env *cli.Env) error {
	return prepareImage(ctx, env.Files, env.Log, env.Out, env.Config, env.Verbose)
}

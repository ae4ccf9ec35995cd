package boot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/cli"
	"github.com/dynk8s/dynk8s/node/internal/image"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

func prepareImage(ctx context.Context, f system.Files, log *system.Logger, out io.Writer, config string, verbose bool) error {
	raw, err := os.ReadFile(config)
	if err != nil {
		return fmt.Errorf("config %s is missing or unreadable: %w", config, err)
	}
	cfg, err := system.LoadConfig(config)
	if err != nil {
		return err
	}
	if verbose {
		log.Printf("config %s:\n%s", config, raw)
	}
	return bakeFrom(ctx, f, log, system.RealHost{Out: out, Log: log}, cfg, raw)
}

// bakeFrom runs the prepare phases of cfg and leaves the baked marker, naming raw (the configuration's bytes) by
// its sha256.
func bakeFrom(ctx context.Context, f system.Files, log *system.Logger, host system.Host, cfg nodeconfig.Node, raw []byte) error {
	d := cfg.Deadlines
	j := newJoiner(&bootEnv{cfg: cfg, host: host, files: f, log: log,
		clock: system.NewClock(d.Join.D(), d.BackoffInitial.D(), d.BackoffMax.D()), tl: system.NewTimeline(time.Now)})
	j.baking = true
	sum := sha256.Sum256(raw)
	err := j.bake(ctx, hex.EncodeToString(sum[:]))
	j.finish()
	return err
}

// bakeImage is `dynk8s-node bake` on a bake instance (cmd/bake launched it with cloudinit.Bake's user data): the
// prepare phases of the pool's bake.json and the marker, then the instance's identity removed, the image checked as
// a pool's boot will find it, and the instance powered off, which tells cmd/bake to image it. A failure leaves the
// instance running, its one reason on the console.
func bakeImage(ctx context.Context, env *cli.Env, host system.Host) error {
	raw, err := os.ReadFile(env.Config)
	if err != nil {
		return fmt.Errorf("config %s is missing or unreadable: %w", env.Config, err)
	}
	b, err := nodeconfig.DecodeBake(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("config %s: %w", env.Config, err)
	}
	if env.Verbose {
		env.Log.Printf("config %s:\n%s", env.Config, raw)
	}
	if err := bakeFrom(ctx, env.Files, env.Log, host, b.Node(), raw); err != nil {
		return err
	}
	if err := image.CleanIdentity(env.Files, env.Log, false); err != nil {
		return err
	}
	sum := sha256.Sum256(raw)
	if err := image.CheckImage(env.Files, hex.EncodeToString(sum[:])); err != nil {
		return fmt.Errorf("the image fails its check: %w", err)
	}
	env.Log.Printf("the image of pool %s is baked and its identity removed: powering off for the image to be taken",
		b.PoolName)
	env.Log.Kernel(5, "baked: powering off for the image to be taken")
	// --no-block: this unit is still running, and a poweroff job waits for nothing it would stop.
	if err := host.Run(ctx, time.Minute, false, "systemctl", "--no-block", "poweroff"); err != nil {
		return fmt.Errorf("could not power off: %w", err)
	}
	return nil
}

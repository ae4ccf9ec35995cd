package boot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/system"
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
	d := cfg.Deadlines
	j := newJoiner(&bootEnv{cfg: cfg, host: system.RealHost{Out: out, Log: log}, files: f, log: log,
		clock: system.NewClock(d.Join.D(), d.BackoffInitial.D(), d.BackoffMax.D()), tl: system.NewTimeline(time.Now)})
	j.baking = true
	sum := sha256.Sum256(raw)
	err = j.bake(ctx, hex.EncodeToString(sum[:]))
	j.finish()
	return err
}

// Package gateway is what the agent does on the WireGuard gateway: its private key from SSM, its packages, and the
// idle check that stops it when no pool instance has needed the tunnel for a while.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// gatewayRun is one run of a gateway command.
type gatewayRun struct {
	cfg    nodeconfig.Gateway
	cloud  *cloud.Cloud
	host   system.Host
	files  system.Files
	log    *system.Logger
	clock  *system.Clock
	now    func() time.Time
	dryRun bool
}

// loadGatewayConfig reads the gateway's configuration strictly, with the test hooks' deadlines:
// DYNK8S_DEADLINE_SECONDS is one value for every command's deadline.
func loadGatewayConfig(path string) (nodeconfig.Gateway, error) {
	cfg, err := system.ReadConfig(path, nodeconfig.DecodeGateway)
	if err != nil {
		return cfg, err
	}
	d := &cfg.Deadlines
	return cfg, system.ApplyDeadlineHooks([]system.DeadlineHook{
		system.Hook("DYNK8S_DEADLINE_SECONDS", time.Second, &d.Key, &d.KeyOnDisk, &d.Packages, &d.Idle),
		system.Hook("DYNK8S_BACKOFF_INITIAL_MS", time.Millisecond, &d.BackoffInitial),
		system.Hook("DYNK8S_BACKOFF_MAX_MS", time.Millisecond, &d.BackoffMax),
	})
}

func (g *gatewayRun) newClock(deadline time.Duration) {
	d := g.cfg.Deadlines
	g.clock = system.NewClock(deadline, d.BackoffInitial.D(), d.BackoffMax.D())
}

// connect reads the region and the partition's domain from IMDS and builds the signed clients, once.
func (g *gatewayRun) connect(ctx context.Context) error {
	if g.cloud.SSM != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, g.clock.Timeout(10*time.Second))
	defer cancel()
	region, err := g.cloud.IMDS.Get(ctx, "placement/region")
	if err != nil {
		return err
	}
	domain, err := g.cloud.IMDS.Get(ctx, "services/domain")
	if err != nil {
		return err
	}
	g.cloud.Connect(g.cloud, region, domain)
	return nil
}

// Key puts the gateway's WireGuard private key from SSM into the key file (0600). The key stays on disk so that a
// reboot or an EC2 auto-recovery while SSM is unreachable still brings the tunnel up: with a key there, SSM gets a
// short try (deadlines.keyOnDisk) and the key on disk is kept. When SSM answers, its value wins, so a rotated key
// needs only a restart of the tunnel.
func (g *gatewayRun) Key(ctx context.Context) error {
	path := g.files.Root + g.cfg.KeyFile
	onDisk, _ := os.ReadFile(path)
	if len(onDisk) > 0 {
		g.newClock(g.cfg.Deadlines.KeyOnDisk.D())
	} else {
		g.newClock(g.cfg.Deadlines.Key.D())
	}
	param := g.cfg.KeyParameter
	var key string
	var last error
	err := g.clock.Retry(ctx, g.log, "read the WireGuard key from SSM parameter "+param, func(ctx context.Context) error {
		last = g.readKey(ctx, &key)
		return last
	})
	switch {
	case err != nil && len(onDisk) > 0:
		g.log.Printf("SSM unreachable (%v); keeping the key already in %s", last, path)
		return nil
	case err != nil:
		return fmt.Errorf("no WireGuard key: SSM parameter %s could not be read (%w) and %s is absent", param, last, path)
	case !names.IsWireGuardKey(key):
		return fmt.Errorf("SSM parameter %s does not hold a WireGuard key (32 bytes, base64)", param)
	case strings.TrimRight(string(onDisk), "\n") == key:
		g.log.Printf("key in %s is current", path)
		return nil
	case g.dryRun:
		g.log.Printf("dry run: would write the key from SSM to %s", path)
		return nil
	}
	if err := writePrivate(path, []byte(key+"\n")); err != nil {
		return fmt.Errorf("write the key to %s: %w", path, err)
	}
	g.log.Printf("wrote the key from SSM to %s", path)
	return nil
}

// readKey is one attempt at the key: IMDS for the region, then SSM GetParameter, decrypted.
func (g *gatewayRun) readKey(ctx context.Context, key *string) error {
	if err := g.connect(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, g.clock.Timeout(10*time.Second))
	defer cancel()
	out, err := g.cloud.SSM.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(g.cfg.KeyParameter),
		WithDecryption: aws.Bool(true)})
	if err != nil {
		g.cloud.Forget(err)
		return cloud.APIError("SSM GetParameter "+g.cfg.KeyParameter, err)
	}
	if out.Parameter == nil || out.Parameter.Value == nil {
		return errors.New("SSM answer has no Parameter.Value")
	}
	*key = *out.Parameter.Value
	return nil
}

// writePrivate replaces path with content, readable by root only, through a new file and a rename, so that a
// reader never sees half a file.
func writePrivate(path string, content []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, content, 0o600); err != nil {
		return err
	}
	// WriteFile keeps the mode of a file already there.
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Packages installs the gateway's packages where rpm does not find them and then starts the tunnel; run at every
// boot, so after the first it only checks. cloud-init's own package step runs once per instance: a mirror hiccup
// then would leave a gateway that never brings its tunnel up. A failed install is retried under the deadline; past
// it the command fails and systemd starts it again (Restart=on-failure).
func (g *gatewayRun) Packages(ctx context.Context) error {
	g.newClock(g.cfg.Deadlines.Packages.D())
	var missing []string
	for _, p := range g.cfg.Packages {
		// A query, run in a dry run too: what the dry run would install is what is missing.
		if _, err := g.host.Output(ctx, 30*time.Second, "rpm", "-q", "--whatprovides", p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		g.log.Printf("%s already installed", strings.Join(g.cfg.Packages, " "))
	} else {
		// The first attempt reads only the release repository's metadata (the image is the release's GA image,
		// whose packages it matches); the next ones every enabled repository, updates included.
		var repos []string
		for _, r := range g.cfg.SystemRepos {
			repos = append(repos, "--repo="+r)
		}
		what := strings.Join(missing, " ")
		if err := g.clock.Retry(ctx, g.log, "install "+what, func(ctx context.Context) error {
			args := append(append([]string{"install", "-y", "--setopt=install_weak_deps=False"}, repos...), missing...)
			repos = nil
			return system.DNFError("install", g.host.Run(ctx, g.clock.Timeout(0), false, "dnf", args...))
		}); err != nil {
			return err
		}
		g.log.Printf("installed %s", what)
	}
	// enable reloads the manager after it made its links and before --now starts the unit (systemd
	// src/systemctl/systemctl-enable.c, unless --no-reload), which loads the package's template and the user data's
	// drop-ins: no daemon-reload of its own before it (0.3-0.5 s of every gateway boot, the tunnel's wake-up's).
	// --no-block: the tunnel's own start (its key from SSM) has its own timeout and retries.
	if g.host.Run(ctx, time.Minute, false, "systemctl", "enable", "--now", "--no-block", g.cfg.TunnelUnit) != nil {
		return fmt.Errorf("could not enable and start %s", g.cfg.TunnelUnit)
	}
	return nil
}

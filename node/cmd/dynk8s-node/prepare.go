package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The image build's subcommands (docs/baked-images.md, "The contract with the image build"): prepare runs the
// boot's prepare phases on a build instance and writes the baked marker; clean-identity then removes what made it
// one instance rather than an image.
var imageCommands = map[string]func(ctx context.Context, args []string, stderr io.Writer) int{
	"prepare":        runPrepare,
	"clean-identity": runCleanIdentity,
	"check-image":    runCheckImage,
}

// envFiles is where the node's state lives, with the test hooks (DYNK8S_ROOT, DYNK8S_PROC).
func envFiles() files {
	f := files{root: os.Getenv("DYNK8S_ROOT"), proc: os.Getenv("DYNK8S_PROC")}
	if f.proc == "" {
		f.proc = "/proc"
	}
	return f
}

// runPrepare is `dynk8s-node prepare [--config FILE] [-v]`.
func runPrepare(ctx context.Context, args []string, stderr io.Writer) int {
	f := envFiles()
	flags := flag.NewFlagSet("prepare", flag.ContinueOnError)
	flags.SetOutput(stderr)
	config := flags.String("config", f.root+nodeconfig.Path, "the pool's node configuration")
	verbose := flags.Bool("v", false, "log the configuration")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	log := newLogger("dynk8s-prepare", stderr, f.root)
	if err := prepareImage(ctx, f, log, stderr, *config, *verbose); err != nil {
		return failed(log, err)
	}
	return 0
}

func prepareImage(ctx context.Context, f files, log *logger, out io.Writer, config string, verbose bool) error {
	raw, err := os.ReadFile(config)
	if err != nil {
		return fmt.Errorf("config %s is missing or unreadable: %w", config, err)
	}
	cfg, err := loadConfig(config)
	if err != nil {
		return err
	}
	if verbose {
		log.Printf("config %s:\n%s", config, raw)
	}
	d := cfg.Deadlines
	j := &joiner{cfg: cfg, host: realHost{out: out, log: log}, files: f, log: log,
		clock: newClock(d.Join.D(), d.BackoffInitial.D(), d.BackoffMax.D()), tl: newTimeline(time.Now), baking: true}
	sum := sha256.Sum256(raw)
	err = j.bake(ctx, hex.EncodeToString(sum[:]))
	j.finish()
	return err
}

// bake runs the prepare phases to the end (the pre-pull included), leaves the kubelet to the node's join, and
// writes the marker of what it installed. configSHA256 is node.json's.
func (j *joiner) bake(ctx context.Context, configSHA256 string) error {
	j.out.mode, j.out.result = "bake", "failed"
	j.log.Printf("baking an image from pool %s's configuration: %s", j.cfg.PoolName, strings.Join(j.cfg.Packages, " "))
	if err := j.prepare(ctx); err != nil {
		return err
	}
	j.waitPrepull()
	m, err := j.bakedMarkerOf(ctx, configSHA256)
	if err != nil {
		return err
	}
	// Left enabled, the kubelet would start on every boot of the image before cloud-init has written its metadata
	// lockdown drop-in (and crash-loop until the join); the node's crio phase enables it, and kubeadm join starts it
	// after the lockdown, as on a stock boot.
	if j.host.run(ctx, time.Minute, false, "systemctl", "disable", "kubelet.service") != nil {
		return errors.New("could not disable kubelet.service")
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(j.files.baked(), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("could not write the marker: %w", err)
	}
	j.out.result = "baked"
	nevras := make([]string, len(m.Installed))
	for i, p := range m.Installed {
		nevras[i] = p.NEVRA
	}
	j.log.Printf("baked: %s says %s, cri-o %s, %d of %d images pulled", j.files.baked(), strings.Join(nevras, " "),
		m.CRIO, len(m.Images), len(j.cfg.PrePullImages))
	return nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path+".new", b, mode); err != nil {
		return err
	}
	return os.Rename(path+".new", path)
}

// identityGlobs are what clean-identity removes (under DYNK8S_ROOT), identityKeep what it leaves among them. They
// are the effects of `cloud-init clean --logs --machine-id` (canonical/cloud-init, cloudinit/cmd/clean.py: all of
// cloud_dir but its seed, the logs, machine-id), done here so that they do not depend on the image's cloud-init,
// and what else one instance leaves that the next must not share: systemd's random seed, the journal, the SSH host
// keys, the agent's state and the build's configuration, and dnf's caches (size only).
var (
	identityGlobs = []string{
		"/var/lib/cloud/*", "/var/log/cloud-init.log", "/var/log/cloud-init-output.log",
		"/var/lib/systemd/random-seed", "/var/log/journal/*", "/etc/ssh/ssh_host_*",
		"/var/lib/dynk8s", "/run/dynk8s", "/etc/dynk8s/*",
		"/var/cache/dnf/*", "/var/cache/libdnf5/*",
	}
	identityKeep = []string{"/var/lib/cloud/seed", "/etc/dynk8s/baked.json"}
)

// runCleanIdentity is `dynk8s-node clean-identity [--dry-run]`.
func runCleanIdentity(_ context.Context, args []string, stderr io.Writer) int {
	f := envFiles()
	flags := flag.NewFlagSet("clean-identity", flag.ContinueOnError)
	flags.SetOutput(stderr)
	dryRun := flags.Bool("dry-run", false, "list what it would remove, and remove nothing")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	log := newLogger("dynk8s-clean-identity", stderr, f.root)
	if err := cleanIdentity(f, log, *dryRun); err != nil {
		log.Printf("FAILED: %v", err)
		return 1
	}
	return 0
}

func cleanIdentity(f files, log *logger, dryRun bool) error {
	// On a node this would remove the node's identity: only an image build, after prepare, runs it.
	if !f.exists(f.baked()) {
		return fmt.Errorf("no baked marker %s: clean-identity is an image build's last step, after dynk8s-node prepare",
			f.baked())
	}
	var paths []string
	for _, g := range identityGlobs {
		m, err := filepath.Glob(f.root + g)
		if err != nil {
			return err
		}
		for _, p := range m {
			if !slices.Contains(identityKeep, strings.TrimPrefix(p, f.root)) {
				paths = append(paths, p)
			}
		}
	}
	dbus := f.root + "/var/lib/dbus/machine-id"
	if st, err := os.Lstat(dbus); err == nil && st.Mode().IsRegular() {
		paths = append(paths, dbus) // a copy, not systemd's symlink to /etc/machine-id
	}
	machineID := f.etc("machine-id")
	if dryRun {
		for _, p := range paths {
			log.Printf("dry run: would remove %s", p)
		}
		log.Printf("dry run: would set %s to 'uninitialized'", machineID)
		return nil
	}
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("could not remove %s: %w", p, err)
		}
	}
	// "uninitialized": the next boot is a first boot, and systemd writes the instance's own machine ID
	// (machine-id(5), "First Boot Semantics").
	if err := writeFileAtomic(machineID, []byte("uninitialized\n"), 0o444); err != nil {
		return fmt.Errorf("could not reset %s: %w", machineID, err)
	}
	log.Printf("removed the build instance's identity and state (%d paths: %s); %s is 'uninitialized'", len(paths),
		strings.Join(paths, " "), machineID)
	return nil
}

// runCheckImage is `dynk8s-node check-image --config-sha256 HEX`: an image build's validate step, after
// clean-identity. The image passes when its marker is one this agent reads, baked from the node.json whose sha256 is
// HEX, and the instance's identity is gone (machine-id "uninitialized", which systemd replaces at the first boot).
func runCheckImage(_ context.Context, args []string, stderr io.Writer) int {
	f := envFiles()
	flags := flag.NewFlagSet("check-image", flag.ContinueOnError)
	flags.SetOutput(stderr)
	want := flags.String("config-sha256", "", "the sha256 of the node.json the image must be baked from")
	if err := flags.Parse(args); err != nil || *want == "" {
		fmt.Fprintln(stderr, "usage: dynk8s-node check-image --config-sha256 HEX")
		return 2
	}
	log := newLogger("dynk8s-check-image", stderr, f.root)
	if err := checkImage(f, *want); err != nil {
		log.Printf("FAILED: %v", err)
		return 1
	}
	log.Printf("the image is baked from node.json %s, its identity removed", *want)
	return 0
}

func checkImage(f files, configSHA256 string) error {
	m, err := readMarker(f)
	if err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("no baked marker %s: dynk8s-node prepare did not finish", f.baked())
	}
	if m.Config.SHA256 != configSHA256 {
		return fmt.Errorf("baked from node.json %s, not %s", m.Config.SHA256, configSHA256)
	}
	id, err := os.ReadFile(f.etc("machine-id"))
	if err != nil || strings.TrimSpace(string(id)) != "uninitialized" {
		return fmt.Errorf("%s is not \"uninitialized\": the instance's identity is still in the image (clean-identity)",
			f.etc("machine-id"))
	}
	return nil
}

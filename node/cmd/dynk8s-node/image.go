package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/dynk8s/dynk8s/node/internal/boot"
	"github.com/dynk8s/dynk8s/node/internal/image"
	"github.com/dynk8s/dynk8s/node/internal/system"
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
func envFiles() system.Files {
	f := system.Files{Root: os.Getenv("DYNK8S_ROOT"), Proc: os.Getenv("DYNK8S_PROC")}
	if f.Proc == "" {
		f.Proc = "/proc"
	}
	return f
}

// runPrepare is `dynk8s-node prepare [--config FILE] [-v]`.
func runPrepare(ctx context.Context, args []string, stderr io.Writer) int {
	f := envFiles()
	flags := flag.NewFlagSet("prepare", flag.ContinueOnError)
	flags.SetOutput(stderr)
	config := flags.String("config", f.Root+nodeconfig.Path, "the pool's node configuration")
	verbose := flags.Bool("v", false, "log the configuration")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	log := system.NewLogger("dynk8s-prepare", stderr, f.Root)
	if err := boot.PrepareImage(ctx, f, log, stderr, *config, *verbose); err != nil {
		return system.Failed(log, err)
	}
	return 0
}

// runCleanIdentity is `dynk8s-node clean-identity [--dry-run]`.
func runCleanIdentity(_ context.Context, args []string, stderr io.Writer) int {
	f := envFiles()
	flags := flag.NewFlagSet("clean-identity", flag.ContinueOnError)
	flags.SetOutput(stderr)
	dryRun := flags.Bool("dry-run", false, "list what it would remove, and remove nothing")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	log := system.NewLogger("dynk8s-clean-identity", stderr, f.Root)
	if err := image.CleanIdentity(f, log, *dryRun); err != nil {
		log.Printf("FAILED: %v", err)
		return 1
	}
	return 0
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
	log := system.NewLogger("dynk8s-check-image", stderr, f.Root)
	if err := image.CheckImage(f, *want); err != nil {
		log.Printf("FAILED: %v", err)
		return 1
	}
	log.Printf("the image is baked from node.json %s, its identity removed", *want)
	return 0
}

// Command bake builds the images of a stack's baked pools (nodePools[i].image: baked) before `pulumi up`: per pool,
// unless the image for the current config exists, one instance of the pool's Fedora image prepares itself with the
// pool's own node agent and powers off, and the stopped instance becomes the image the program looks up by tag
// (docs/baked-images.md). It runs with the operator's AWS credentials, against a stack that is up (its subnets,
// security group, bake instance profile and agent bucket), and keeps each pool's newest -keep images.
//
//	go run ./cmd/bake -stack dev               # every baked pool of Pulumi.dev.yaml
//	go run ./cmd/bake -stack dev -pool arm64   # one pool
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dynk8s/dynk8s/cmd/bake/bake"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := bake.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

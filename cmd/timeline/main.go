// Command timeline measures a scale-up on a real cluster: with the operator's kubeconfig it creates one pending pod
// aimed at a node pool (the pool's label, tolerations for its taints, optionally one github.com/fuse device),
// watches the autoscaler's events, the pool's nodes and the pod, prints each phase with the seconds since the pod
// was created and since the phase before, deletes the pod however it ends (Ctrl-C included), and exits 1 when the
// pod does not run within -limit.
//
//	go run ./cmd/timeline -pool builders-x86 -limit 60s
//	go run ./cmd/timeline -stack prod -pool arm-spot -fuse
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dynk8s/dynk8s/cmd/timeline/timeline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := timeline.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

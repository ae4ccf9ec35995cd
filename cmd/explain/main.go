// Command explain says why a pod would or would not make the Cluster Autoscaler add a node, and where: for each
// node pool of a stack, whether a new node of that pool would run the pod and every reason if not, and which pool
// the stack's expander would raise (docs/explain.md).
//
//	go run ./cmd/explain -stack dev agent.yaml   # pod manifests
//	go run ./cmd/explain -pending               # the cluster's pending pods, with the autoscaler's events
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dynk8s/dynk8s/cmd/explain/explain"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := explain.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Command status is one screen of a running stack, read with the operator's own credentials and read-only calls:
// per pool its Auto Scaling group's desired, in-service, booting and warm instances, its Nodes and their readiness,
// and its last scale-up; the gateway's state; the tunnel's last handshake (on the on-prem peer, as root); the join
// token's age and the rotator's last write; the controller's leadership; the stack's in-cluster workloads; the idle
// bill and what the stack bills per hour now. It lists what needs the operator, and exits 1 when anything does or
// could not be read.
//
//	go run ./cmd/status -stack dev
//	sudo go run ./cmd/status -stack prod -o json   # on the on-prem peer, with the tunnel
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dynk8s/dynk8s/cmd/status/status"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := status.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

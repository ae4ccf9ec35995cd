// Command check is the preflight of the on-prem side, read-only: what the README's on-prem steps ask of the
// cluster (the kubeadm roles the stack binds its join token group to, podCidr and serviceCidr against
// kube-system/kubeadm-config, the CNI's encapsulation, masquerading and MTU where its configuration says them, a
// Ready node for the in-cluster parts) and, on the on-prem peer as root, of the host (the VPC routed into the
// tunnel's interface, that interface's MTU, the CNI devices' MTU, the last handshake). Each failure says what to
// change; it exits 1 when one check fails.
//
//	go run ./cmd/check -stack dev
//	sudo go run ./cmd/check -stack dev                    # on the on-prem peer: its routes and MTUs too
//	go run ./cmd/check -stack dev -peer 192.168.10.2      # on another on-prem host: its route to the peer
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dynk8s/dynk8s/cmd/check/check"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := check.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

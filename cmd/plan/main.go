// Command plan shows what a dynk8s stack declares without any cloud account: it runs the real program under the
// Pulumi mock engine, with deterministic stand-ins for cloud lookups (a plausible Fedora image per architecture,
// random values derived from resource names, a fixed cluster CA), and prints the resources, or writes the rendered
// artifacts. The real run is `pulumi preview` / `pulumi up`.
//
//	go run ./cmd/plan -stack dev                 # a table of what the stack declares
//	go run ./cmd/plan -stack dev -json           # the same as one JSON object (secrets shown as "[secret]")
//	go run ./cmd/plan -stack dev -out build/dev  # also write user data, manifests and the on-prem WireGuard config
package main

import (
	"os"

	"github.com/dynk8s/dynk8s/cmd/plan/plan"
)

func main() {
	os.Exit(plan.Main(os.Args[1:], os.Stdout, os.Stderr))
}

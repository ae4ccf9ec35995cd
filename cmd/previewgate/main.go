// Command previewgate reads what `pulumi preview --json` prints and stops a deployment that would cut the tunnel:
// one that replaces or deletes the WireGuard gateway instance, its address or keys, or the network the routes to it
// live in. Each of those means minutes without the on-prem API server for every node (the gateway is replaced
// delete-first, so a failed create leaves the routes pointing at nothing), which the nodes' builds do not survive
// for long. Such a plan passes only with -allow, given when the operator chose it for this run.
//
//	pulumi preview --stack prod --json > preview.json
//	previewgate preview.json            # exit 1 when the tunnel would go down, naming why
//	previewgate -allow preview.json     # the same report, exit 0
//
// It prints every step that changes something, so the pipeline's log shows the plan it judged.
package main

import (
	"os"

	"github.com/dynk8s/dynk8s/cmd/previewgate/previewgate"
)

func main() {
	os.Exit(previewgate.Main(os.Args[1:], os.Stdout, os.Stderr))
}

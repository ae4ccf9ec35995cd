// Package previewgate is cmd/previewgate: the pipeline's check of what `pulumi preview --json` prints, which stops a
// deployment that would cut the tunnel.
package previewgate

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/pulumi/pulumi/sdk/v3/go/common/apitype"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
)

// Main is cmd/previewgate: it reads the preview named in args and returns the exit status: 0 when the tunnel stays
// up (or -allow lets the plan pass), 1 when the plan cuts it, 2 on bad usage or a file that is not a preview.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("previewgate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	allow := fs.Bool("allow", false, "let a plan that cuts the tunnel pass (report it, exit 0)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: previewgate [-allow] PREVIEW.json (the output of pulumi preview --json)")
		return 2
	}
	raw, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "previewgate: %v\n", err)
		return 2
	}
	steps, err := parse(raw)
	if err != nil {
		fmt.Fprintf(stderr, "previewgate: %s: %v\n", fs.Arg(0), err)
		return 2
	}
	cuts := 0
	for _, s := range steps {
		if s.Op == apitype.OpSame {
			continue
		}
		mark := ""
		if cutsTunnel(s) {
			cuts++
			mark = "  <- cuts the tunnel"
		}
		fmt.Fprintf(stdout, "%-18s %s%s\n", s.Op, s.URN, mark)
	}
	switch {
	case cuts == 0:
		fmt.Fprintln(stdout, "previewgate: the tunnel stays up")
		return 0
	case *allow:
		fmt.Fprintf(stdout, "previewgate: %d step(s) cut the tunnel; allowed for this run\n", cuts)
		return 0
	}
	fmt.Fprintf(stderr, "previewgate: %d step(s) replace or delete the gateway or the network its routes live in: "+
		"the nodes lose the on-prem API server meanwhile (minutes; for good if the new gateway fails to come up). "+
		"Run it while no build runs, and allow it for that run\n", cuts)
	return 1
}

// step is one step of `pulumi preview --json` (its PreviewDigest's steps: op and urn are all the gate reads).
type step struct {
	Op  apitype.OpType `json:"op"`
	URN resource.URN   `json:"urn"`
}

func parse(raw []byte) ([]step, error) {
	var digest struct {
		Steps []step `json:"steps"`
	}
	if err := json.Unmarshal(raw, &digest); err != nil {
		return nil, fmt.Errorf("not the JSON of pulumi preview --json: %w", err)
	}
	for i, s := range digest.Steps {
		if !s.URN.IsValid() {
			return nil, fmt.Errorf("step %d: %q is not a resource URN", i, s.URN)
		}
	}
	return digest.Steps, nil
}

// tunnelTypes are the resource types whose replacement or deletion takes the tunnel down: the gateway instance (the
// routes' target), its Elastic IP (the on-prem peer dials it), its key pair's random bytes (the on-prem peer holds
// the public key), and the network the routes and the gateway's fixed address live in.
var tunnelTypes = []string{
	"aws:ec2/instance:Instance",
	"aws:ec2/eip:Eip",
	"random:index/randomBytes:RandomBytes",
	"aws:ec2/vpc:Vpc",
	"aws:ec2/subnet:Subnet",
	"aws:ec2/routeTable:RouteTable",
	"aws:ec2/routeTableAssociation:RouteTableAssociation",
	"aws:ec2/route:Route",
	"aws:ec2/internetGateway:InternetGateway",
}

// destructive are the steps that end a live resource: a replacement in any of its forms, or a deletion.
var destructive = []apitype.OpType{
	apitype.OpReplace, apitype.OpCreateReplacement, apitype.OpDeleteReplaced, apitype.OpDelete,
}

func cutsTunnel(s step) bool {
	return slices.Contains(destructive, s.Op) && slices.Contains(tunnelTypes, string(s.URN.Type()))
}

// Command dynk8s is the Pulumi program: it lets an on-prem Kubernetes cluster grow into AWS EC2 when pods are
// pending and shrink back to zero when they are not. Run it with `pulumi preview` / `pulumi up`; see README.md.
package main

import (
	"os"

	"github.com/dynk8s/dynk8s/infra"
)

func main() {
	os.Exit(infra.Main(os.Stderr))
}

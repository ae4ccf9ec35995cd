// Command dynk8s is the Pulumi program: it lets an on-prem Kubernetes cluster grow into AWS EC2 when pods are
// pending and shrink back to zero when they are not. Run it with `pulumi preview` / `pulumi up`; see README.md.
package main

import (
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra"
)

func main() {
	pulumi.Run(program)
}

// program is the composition root: read and validate the config (a bad config declares nothing), declare the
// stack, export its outputs.
func program(ctx *pulumi.Context) error {
	cfg, err := infra.LoadConfig(ctx)
	if err != nil {
		return err
	}
	stack, err := infra.NewStack(ctx, cfg)
	if err != nil {
		return err
	}
	for _, e := range stack.Exports() {
		ctx.Export(e.Name, e.Value)
	}
	return nil
}

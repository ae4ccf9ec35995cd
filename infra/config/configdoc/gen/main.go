// Command gen writes the configuration reference from infra/config's source: the `config:` block of Pulumi.yaml
// (below its marker line) and docs/configuration.md. infra/config runs it with go generate.
package main

import (
	"os"

	"github.com/dynk8s/dynk8s/infra/config/configdoc"
)

func main() {
	os.Exit(configdoc.Main(os.Args[1:], os.Stderr))
}

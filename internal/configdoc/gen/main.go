// Command gen writes the configuration reference from infra/config's source: the `config:` block of Pulumi.yaml
// (below its marker line) and docs/configuration.md. infra/config runs it with go generate.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/dynk8s/dynk8s/internal/configdoc"
)

func main() {
	pulumi := flag.String("pulumi", "Pulumi.yaml", "the project file whose config block to write")
	md := flag.String("md", "docs/configuration.md", "the reference page to write")
	flag.Parse()
	if err := run(*pulumi, *md); err != nil {
		fmt.Fprintln(os.Stderr, "configdoc:", err)
		os.Exit(1)
	}
}

func run(pulumiPath, mdPath string) error {
	l, err := configdoc.NewLoader(".")
	if err != nil {
		return err
	}
	project, err := os.ReadFile(pulumiPath)
	if err != nil {
		return err
	}
	pulumi, md, err := configdoc.Generate(l, string(project))
	if err != nil {
		return err
	}
	if err := os.WriteFile(pulumiPath, []byte(pulumi), 0o644); err != nil {
		return err
	}
	return os.WriteFile(mdPath, []byte(md), 0o644)
}

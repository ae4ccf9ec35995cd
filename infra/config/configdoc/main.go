package configdoc

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Main is the generator's command (infra/config/configdoc/gen, run by go generate ./infra/config): it writes
// Pulumi.yaml's config block and docs/configuration.md, and returns the exit status: 0, 1 on an error, 2 on bad
// usage.
func Main(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pulumi := fs.String("pulumi", "Pulumi.yaml", "the project file whose config block to write")
	md := fs.String("md", "docs/configuration.md", "the reference page to write")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := write(*pulumi, *md); err != nil {
		fmt.Fprintln(stderr, "configdoc:", err)
		return 1
	}
	return 0
}

func write(pulumiPath, mdPath string) error {
	l, err := NewLoader(".")
	if err != nil {
		return err
	}
	project, err := os.ReadFile(pulumiPath)
	if err != nil {
		return err
	}
	pulumi, md, err := Generate(l, string(project))
	if err != nil {
		return err
	}
	if err := os.WriteFile(pulumiPath, []byte(pulumi), 0o644); err != nil {
		return err
	}
	return os.WriteFile(mdPath, []byte(md), 0o644)
}

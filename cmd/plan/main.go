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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/mockcloud"
	"github.com/dynk8s/dynk8s/internal/plan"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stack := fs.String("stack", "dev", "stack name: reads Pulumi.<stack>.yaml")
	configFile := fs.String("config", "", "stack config file to read instead of Pulumi.<stack>.yaml")
	out := fs.String("out", "", "directory to write rendered artifacts to (userdata/, manifests/, wireguard/)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	agentDir := fs.String("agent", infra.AgentDir, "directory of the built node agent (make build); where it is not built, or \"\", the plan shows a stand-in")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "plan: unexpected arguments %q\n", fs.Args())
		return 2
	}
	file := *configFile
	if file == "" {
		file = "Pulumi." + *stack + ".yaml"
	}

	cfg, err := mockcloud.LoadStackFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "plan: reading stack config: %v\n", err)
		return 1
	}
	cfg.AgentDir = *agentDir
	result, err := plan.RunConfig(*stack, cfg)
	if err != nil {
		// A refused config is already one message listing every problem with its key path.
		if cfgErr := (*plan.ConfigError)(nil); errors.As(err, &cfgErr) {
			err = cfgErr
		} else {
			err = fmt.Errorf("plan: %w", err)
		}
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *out != "" {
		if err := result.WriteArtifacts(*out); err != nil {
			fmt.Fprintf(stderr, "plan: %v\n", err)
			return 1
		}
	}
	if *asJSON {
		err = result.WriteJSON(stdout)
	} else {
		err = result.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "plan: %v\n", err)
		return 1
	}
	if *out != "" && !*asJSON {
		fmt.Fprintf(stdout, "\nArtifacts written to %s\n", *out)
	}
	return 0
}

package plan

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
)

// Main is cmd/plan: it parses args, runs the stack's program under the mock engine and prints or writes what it
// declares, and returns the exit status: 0, 1 on a refused config or an error, 2 on bad usage.
func Main(args []string, stdout, stderr io.Writer) int {
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
	result, err := RunConfig(*stack, cfg)
	if err != nil {
		// A refused config is already one message listing every problem with its key path.
		if cfgErr := (*ConfigError)(nil); errors.As(err, &cfgErr) {
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

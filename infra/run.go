package infra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/pulumi/pulumi/sdk/v3/go/common/constant"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// How the program meets the engine. The engine starts the program with the whole stack config in PULUMI_CONFIG (a
// JSON object of fully qualified keys to values, which the Go SDK reads into the context); the program reads the key
// names from there, so that a key it does not read is refused rather than ignored. Its own errors reach the operator
// as one diagnostic of its own words: Run logs the error to the engine and Main exits with the status the Go language
// host takes for "the program has reported its error" (constant.ExitStatusLoggedError: the host bails without a
// message of its own), instead of pulumi.Run's "an unhandled error occurred: program failed:" framing.

// ErrReported marks an error the program has logged to the engine as its diagnostic.
var ErrReported = errors.New("reported to the engine")

// EngineConfigKeys are the names of the stack's config keys, from the PULUMI_CONFIG the engine sets
// (pulumi.EnvConfig; the Go SDK reads the values from the same variable).
func EngineConfigKeys() ([]string, error) {
	raw := os.Getenv(pulumi.EnvConfig)
	if raw == "" {
		return nil, nil
	}
	var values map[string]string
	if err := json.Unmarshal([]byte(raw), &values); err != nil {
		return nil, fmt.Errorf("reading the stack config the engine passed (%s): %w", pulumi.EnvConfig, err)
	}
	return slices.Sorted(maps.Keys(values)), nil
}

// AgentDirEnv names another directory than AgentDir for the engine's run to take the built node agent from.
const AgentDirEnv = "DYNK8S_AGENT_DIR"

// Run is the program as the engine runs it: Program with the engine's config keys and the agent `make build` built
// (AgentDir, or AgentDirEnv), its error reported (Report).
func Run(ctx *pulumi.Context) error {
	dir := os.Getenv(AgentDirEnv)
	if dir == "" {
		dir = AgentDir
	}
	keys, err := EngineConfigKeys()
	if err == nil {
		_, err = Program(ctx, keys, BuiltAgent(dir), ClusterOnPremNodes)
	}
	return Report(ctx, err)
}

// Report logs err to the engine as an error diagnostic of the stack, in the program's words and nothing else, and
// returns it marked ErrReported. A nil err is nil.
func Report(ctx *pulumi.Context, err error) error {
	if err == nil {
		return nil
	}
	if logErr := ctx.Log.Error(err.Error(), nil); logErr != nil {
		return errors.Join(err, fmt.Errorf("reporting the error to the engine: %w", logErr))
	}
	return fmt.Errorf("%w: %w", ErrReported, err)
}

// Main runs Run under the engine (opts as pulumi.RunErr takes them) and returns the process's exit status: 0;
// constant.ExitStatusLoggedError when the program reported its error; otherwise 1, with the error on stderr (the
// engine shows a program's stderr), for an error the SDK met outside the program's own code.
func Main(stderr io.Writer, opts ...pulumi.RunOption) int {
	var reported bool
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		err := Run(ctx)
		reported = errors.Is(err, ErrReported)
		return err
	}, opts...)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pulumi.ErrPlugins):
		// The engine asked which plugins the program needs: pulumi.Run answers that, and exits.
		pulumi.Run(Run)
		return 0
	case reported:
		// Also when the SDK's own wait for outstanding RPCs then failed: the diagnostic already says why.
		return constant.ExitStatusLoggedError
	}
	fmt.Fprintf(stderr, "error: %v\n", err)
	return 1
}

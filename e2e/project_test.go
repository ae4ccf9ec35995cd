//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra"
)

// TestProjectWithRealCLI runs the project as an operator does, with the real Pulumi CLI and a Go language host on
// a file backend: the CLI validates the stack files against the config declared in Pulumi.yaml, then runs the
// program. No AWS provider plugin can run here, so a good config gets as far as the program declaring its AWS
// resources and the engine failing to fetch that plugin; a bad config stops in the program with every problem and
// its key path, before anything is declared.
//
// The only language host that builds here (v3.65, see hack/tools.sh) predates runtime options being passed in the
// run request, so it cannot run the prebuilt binary: the test's copy of Pulumi.yaml points the project at the
// repository's source instead (runtime "go", main = the repository); everything else in it is as committed.
func TestProjectWithRealCLI(t *testing.T) {
	requireTool(t, "pulumi")
	requireTool(t, "pulumi-language-go")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	repo, err := filepath.Abs("..")
	assert.NilError(t, err)
	dir := t.TempDir()
	const binaryRuntime = "runtime:\n  name: go\n  options:\n    binary: build/dynk8s\n"
	for _, f := range []string{"Pulumi.yaml", "Pulumi.dev.yaml", "Pulumi.prod.yaml"} {
		b, err := os.ReadFile(filepath.Join(repo, f))
		assert.NilError(t, err)
		if f == "Pulumi.yaml" {
			if !bytes.Contains(b, []byte(binaryRuntime)) {
				t.Fatalf("Pulumi.yaml no longer runs the prebuilt binary; update this test")
			}
			b = bytes.Replace(b, []byte(binaryRuntime), []byte("runtime: go\nmain: "+repo+"\n"), 1)
		}
		assert.NilError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}

	// The program uploads the node agent `make build` builds; the project directory here has none, so the agent is
	// built for it.
	agentDir := filepath.Join(dir, "agent")
	build := exec.CommandContext(ctx, filepath.Join(repo, "hack", "build-agent.sh"), agentDir)
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	env := append(os.Environ(),
		infra.AgentDirEnv+"="+agentDir,
		"PULUMI_HOME="+filepath.Join(dir, ".pulumi-home"),
		"PULUMI_BACKEND_URL=file://"+filepath.Join(dir, "state"),
		"PULUMI_CONFIG_PASSPHRASE=e2e-passphrase",
		"PULUMI_SKIP_UPDATE_CHECK=true",
		// Without the on-prem cluster's kubeconfig the provider must not pick up this machine's.
		"KUBECONFIG="+filepath.Join(dir, "no-kubeconfig"),
	)
	assert.NilError(t, os.MkdirAll(filepath.Join(dir, "state"), 0o755))
	pulumi := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "pulumi", append([]string{"--non-interactive"}, args...)...)
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}

	for _, stack := range []string{"dev", "prod"} {
		t.Run(stack, func(t *testing.T) {
			if out, err := pulumi("stack", "init", stack); err != nil {
				t.Fatalf("stack init: %v\n%s", err, out)
			}
			start := time.Now()
			out, err := pulumi("preview", "--stack", stack)
			t.Logf("preview %s: %s", stack, time.Since(start).Round(time.Millisecond))
			if err == nil {
				t.Fatalf("preview succeeded without an AWS provider plugin; the premise changed:\n%s", out)
			}
			for _, bad := range []string{"validating stack config", "missing configuration values", "invalid dynk8s configuration"} {
				if strings.Contains(out, bad) {
					t.Fatalf("the %s stack was refused (%q):\n%s", stack, bad, out)
				}
			}
			// The program ran and declared AWS resources: the engine then needs the AWS provider.
			if !strings.Contains(out, "pulumi-resource-aws") {
				t.Fatalf("preview did not get as far as the AWS resources:\n%s", out)
			}
		})
	}

	t.Run("bad config", func(t *testing.T) {
		for _, kv := range [][2]string{{"dynk8s:nodePools[1].maxSize", "-1"}, {"dynk8s:wireguard.mtu", "100"}} {
			if out, err := pulumi("config", "set", "--stack", "dev", "--path", kv[0], "--", kv[1]); err != nil {
				t.Fatalf("config set %s: %v\n%s", kv[0], err, out)
			}
		}
		out, err := pulumi("preview", "--stack", "dev")
		if err == nil {
			t.Fatalf("preview of a bad config succeeded:\n%s", out)
		}
		for _, want := range []string{
			"invalid dynk8s configuration (2 problems); nothing was declared",
			"dynk8s:nodePools[1].maxSize: must be >= minSize (0), got -1",
			"dynk8s:wireguard.mtu: must be 1280..8920",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("preview output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "pulumi-resource-aws") || strings.Contains(out, "aws:") {
			t.Errorf("a refused config still declared AWS resources:\n%s", out)
		}
	})
}

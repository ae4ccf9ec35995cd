//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/dynk8s/dynk8s/cloudinit"
)

// The node agent (node/cmd/dynk8s-node), built once per test binary: the joins run it as the join unit does, and the
// node's box has it where the bootstrap installs it (the bootstrap's own download is cloudinit's TestFetchAgent).
var agentBuild struct {
	once      sync.Once
	path, out string
	err       error
}

// agentPath is where the bootstrap installs the agent on a node.
const agentPath = "/usr/local/bin/dynk8s-node"

func builtAgent(t *testing.T) string {
	t.Helper()
	agentBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "dynk8s-e2e-agent-")
		if err != nil {
			agentBuild.err = err
			return
		}
		agentBuild.path = filepath.Join(dir, "dynk8s-node")
		cmd := exec.Command("go", "build", "-trimpath", "-o", agentBuild.path, "github.com/dynk8s/dynk8s/node/cmd/dynk8s-node")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		agentBuild.out, agentBuild.err = string(out), err
	})
	if agentBuild.err != nil {
		t.Fatalf("go build ./node/cmd/dynk8s-node: %v\n%s", agentBuild.err, agentBuild.out)
	}
	return agentBuild.path
}

// hasBootstrap says whether userData installs the agent itself (dynk8s-agent.service).
func hasBootstrap(t *testing.T, userData []byte) bool {
	t.Helper()
	files, err := cloudinit.Files(userData)
	if err != nil {
		t.Fatalf("user data: %v", err)
	}
	return slices.ContainsFunc(files, func(f cloudinit.File) bool {
		return f.Path == "/etc/systemd/system/dynk8s-agent.service"
	})
}

// agentDir is a build directory (infra.AgentDir's layout) whose every architecture's agent is builtAgent, this
// machine's build: a plan run with it pins the binary a box binds in place, whatever the stack's architectures.
func agentDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		if err := os.Symlink(builtAgent(t), filepath.Join(dir, "dynk8s-node-linux-"+arch)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

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

// agentDir is a build directory (infra.AgentDir's layout) whose every architecture's agent is nodetest.BuiltAgent, this
// machine's build: a plan run with it pins the binary a box binds in place, whatever the stack's architectures.
func agentDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		if err := os.Symlink(nodetest.BuiltAgent(t), filepath.Join(dir, "dynk8s-node-linux-"+arch)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

package addons

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// TestCleanupJudgesOnlyItsRegion: the cleanup asks its own region's EC2, so a pool node whose
// provider ID names a zone of another region (another stack's node on the same cluster) is skipped, never asked
// about: that EC2 would not know the instance ("gone") and the cleanup would delete the Node of a live instance.
// Local Zones (<region>-<city>-<n><letter>) belong to their region.
func TestCleanupJudgesOnlyItsRegion(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour).Format(time.RFC3339)
	nodes := strings.Join([]string{
		"here|aws:///eu-central-1a/i-0aaa|Unknown|" + old,
		"local-zone|aws:///eu-central-1-ham-1a/i-0bbb|Unknown|" + old,
		"elsewhere|aws:///eu-west-1a/i-0ccc|Unknown|" + old,
		"longer-name|aws:///eu-central-10a/i-0ddd|Unknown|" + old,
	}, "\n") + "\n"
	dir, log := cleanupStubs(t, nodes, now, 0, "", nil)
	cmd := exec.Command("/bin/sh", filepath.Join(dir, "cleanup.sh"))
	cmd.Env = []string{"PATH=" + dir, "POOL_LABEL=" + kube.LabelPool, "NOT_READY_AFTER_SECONDS=600",
		"AWS_DEFAULT_REGION=eu-central-1"}
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "%s", out)
	calls, err := os.ReadFile(log)
	assert.NilError(t, err)
	var deleted, asked []string
	for _, line := range strings.Split(strings.TrimSpace(string(calls)), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "delete":
			deleted = append(deleted, f[2])
		case len(f) >= 5 && f[0] == "aws":
			asked = append(asked, f[4])
		}
	}
	assert.DeepEqual(t, deleted, []string{"here", "local-zone"})
	assert.DeepEqual(t, asked, []string{"i-0aaa", "i-0bbb"})
	assert.Check(t, is.Contains(string(out), "skip elsewhere: zone eu-west-1a is not in eu-central-1"))
	assert.Check(t, is.Contains(string(out), "skip longer-name: zone eu-central-10a is not in eu-central-1"))
}

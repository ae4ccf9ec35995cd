package cloudinit

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/internal/fakeimds"
)

// TestIMDSTokenOffTheCommandLine (security review L6): the IMDSv2 session token reaches curl on stdin as a header
// (curl -H @-), never on its argv, where any user of the host can read it in /proc for as long as the request runs
// (lib.sh's own rule for secrets). The idle check reads IMDS first, so its run shows every IMDS request.
func TestIMDSTokenOffTheCommandLine(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t)
	run := runIdle(t, ud, aws, stateLine(time.Hour, 42), nftCounters(40, 2), nil)
	assert.Equal(t, run.exitCode, 0)
	calls := run.file("calls")
	assert.Assert(t, strings.Contains(calls, "/latest/meta-data/") || strings.Contains(calls, "/latest/dynamic/"),
		"no IMDS read recorded: %s", calls)
	assert.Check(t, !strings.Contains(calls, fakeimds.SessionToken), "the IMDS token is on some command's argv")
}

package cloudinit

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestGatewayIdleFollowsNextToken (security review L3): EC2 may answer a filtered DescribeInstances with pages that
// hold no instance but a NextToken ("Pagination in the Amazon EC2 API": a page can be empty while more results
// follow). The idle check reads on until a page shows an instance or no token is left, so a running pool instance
// behind empty pages keeps the gateway up; an answer that never ends keeps it up too.
func TestGatewayIdleFollowsNextToken(t *testing.T) {
	t.Parallel()
	ud, aws := idleFixture(t, fakeInstance{ID: "i-0eeeeeeeeeeeeeee5", State: "running",
		Tags: map[string]string{"dynk8s:cluster": testClusterName, "dynk8s:pool": "builders-x86"}})
	aws.ec2.emptyPages = 2
	run := runIdle(t, ud, aws, stateLine(time.Hour, 7), nftCounters(5, 2), nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"), "powered off with a pool instance running")
	assert.Check(t, is.Contains(run.stderr, "staying up: pool instances i-0eeeeeeeeeeeeeee5 (running)"))
	assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"DescribeInstances", "DescribeInstances", "DescribeInstances"}))
	assert.Check(t, is.DeepEqual(aws.ec2.tokens, []string{"", "page-1", "page-2"}), "each page asks for the next")

	// Empty pages and no instance at the end: idle, as with one empty page.
	ud, aws = idleFixture(t)
	aws.ec2.emptyPages = 2
	run = runIdle(t, ud, aws, stateLine(16*time.Minute, 7), nftCounters(5, 2), nil)
	assert.Check(t, is.Contains(run.file("calls"), "systemctl poweroff\n"))

	// Pages without end: the question has no answer, and the gateway stays up.
	ud, aws = idleFixture(t)
	aws.ec2.emptyPages = 1000
	run = runIdle(t, ud, aws, stateLine(16*time.Minute, 7), nftCounters(5, 2),
		map[string]string{"DYNK8S_DEADLINE_SECONDS": "3"})
	assert.Check(t, run.exitCode != 0)
	assert.Check(t, !strings.Contains(run.file("calls"), "poweroff"))
	assert.Check(t, is.Contains(run.stderr, "still a NextToken after 20 pages); the gateway stays up"))
}

package system

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// A command Run ran and that failed keeps the end of what it wrote, both streams in the order written, at most
// TailSize bytes, and still writes all of it to the unit's output; a quiet one keeps nothing.
func TestRunKeepsTheTailOfAFailure(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	h := RealHost{Out: &out}
	err := h.Run(context.Background(), 0, false, "sh", "-c", `echo first; echo reason >&2; exit 3`)
	ee := (*ExitError)(nil)
	assert.Assert(t, errors.As(err, &ee), "%v", err)
	assert.Check(t, is.Equal(ee.Code, 3))
	assert.Check(t, is.Equal(ee.Tail, "first\nreason\n"))
	assert.Check(t, is.Equal(out.String(), "first\nreason\n"))

	out.Reset()
	err = h.Run(context.Background(), 0, false, "sh", "-c", `head -c 20000 /dev/zero | tr '\0' x; echo; echo last >&2; exit 1`)
	assert.Assert(t, errors.As(err, &ee))
	assert.Check(t, is.Len(ee.Tail, TailSize))
	assert.Check(t, strings.HasSuffix(ee.Tail, "x\nlast\n"))
	assert.Check(t, is.Len(out.String(), 20000+1+5))

	err = h.Run(context.Background(), 0, true, "sh", "-c", `echo hidden; exit 1`)
	assert.Assert(t, errors.As(err, &ee))
	assert.Check(t, is.Equal(ee.Tail, ""))
}

// DNFReason quotes dnf4's and dnf5's own lines (as the e2e saw them on each), not its hints.
func TestDNFReason(t *testing.T) {
	t.Parallel()
	for out, want := range map[string]string{
		"Updating and loading repositories:\nFailed to resolve the transaction:\nNo match for argument: kubelet-1.34.9\n" +
			"You can try to add to command line:\n  --skip-unavailable to skip unavailable packages\n": "No match for argument: kubelet-1.34.9",
		"No match for argument: kubelet-1.34.9\nError: Unable to find a match: kubelet-1.34.9\n": "No match for argument: " +
			"kubelet-1.34.9; Error: Unable to find a match: kubelet-1.34.9",
		"Failed to resolve the transaction:\nArgument 'cri-o-1.34.*' matches only excluded packages.\n": "Argument " +
			"'cri-o-1.34.*' matches only excluded packages.",
		"All matches were filtered out by exclude filtering for argument: cri-o-1.34.*\nError: Unable to find a match: " +
			"cri-o-1.34.*\n": "All matches were filtered out by exclude filtering for argument: cri-o-1.34.*; Error: Unable " +
			"to find a match: cri-o-1.34.*",
		"Error: Failed to download metadata for repo 'dynk8s-kubernetes': Cannot download repomd.xml: Curl error (37)\n": "Error: " +
			"Failed to download metadata for repo 'dynk8s-kubernetes': Cannot download repomd.xml: Curl error (37)",
		"Total 1.0 MiB/s\nError: something dnf never said before\n": "Error: something dnf never said before",
		"Complete!\n": "",
	} {
		assert.Check(t, is.Equal(DNFReason(out), want), "%q", out)
	}
}

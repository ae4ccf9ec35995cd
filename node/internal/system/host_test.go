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

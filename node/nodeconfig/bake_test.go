package nodeconfig

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// A bake's configuration is the node's prepare fields and a deadline, round-trips byte for byte, is read as strictly
// as node.json, and names what it lacks; the Node it gives the prepare code has the node's prepare fields, the bake's
// deadline as the join's, and nothing of the join.
func TestBake(t *testing.T) {
	n := testNode()
	b := n.Bake()
	raw, err := b.Encode()
	assert.NilError(t, err)
	for _, join := range []string{"apiServerEndpoint", "caCertHashes", "joinTokenParameter", "gateway", "labels"} {
		assert.Check(t, !strings.Contains(string(raw), join), "bake.json holds %s:\n%s", join, raw)
	}
	back, err := DecodeBake(strings.NewReader(string(raw)))
	assert.NilError(t, err)
	again, err := back.Encode()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(again), string(raw)))

	p := back.Node()
	assert.Check(t, is.DeepEqual(p.Packages, n.Packages))
	assert.Check(t, is.DeepEqual(p.PrePullImages, n.PrePullImages))
	assert.Check(t, is.Equal(p.CRISocket, n.CRISocket))
	assert.Check(t, is.Equal(p.Deadlines.Join.D(), BakeDeadline))
	assert.Check(t, is.Equal(p.Deadlines.BackoffMax, DefaultDeadlines.BackoffMax))
	assert.Check(t, p.APIServerEndpoint.IsZero() && len(p.Join.CACertHashes) == 0)

	_, err = DecodeBake(strings.NewReader(strings.Replace(string(raw), `"packages"`, `"Packages"`, 1)))
	assert.Check(t, is.ErrorContains(err, `unknown key "Packages"`))
	_, err = DecodeBake(strings.NewReader(`{"clusterName": "lab"}`))
	assert.Check(t, is.ErrorContains(err, "bake config: missing or invalid: criSocket, deadline (a positive duration), "+
		"packages, poolName"))
}

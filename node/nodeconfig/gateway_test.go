package nodeconfig

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func testGateway() Gateway {
	return Gateway{KeyParameter: "/dynk8s/homelab/gateway-private-key", KeyFile: "/etc/wireguard/wg0.key",
		Packages: []string{"nftables", "wireguard-tools"}, SystemRepos: []string{"fedora"},
		TunnelUnit: "wg-quick@wg0.service",
		Idle:       &GatewayIdle{ClusterName: "homelab", Stop: Duration(15 * time.Minute), NFTTable: "dynk8s_wg0_mss"},
		Deadlines:  DefaultGatewayDeadlines}
}

// What the renderer encodes, the agent decodes to the same value; each unit's timeout comes from its deadline.
func TestGatewayRoundTrip(t *testing.T) {
	for name, g := range map[string]Gateway{"idle": testGateway(), "always on": func() Gateway {
		g := testGateway()
		g.Idle = nil
		return g
	}()} {
		t.Run(name, func(t *testing.T) {
			b, err := g.Encode()
			assert.NilError(t, err)
			got, err := DecodeGateway(strings.NewReader(string(b)))
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(got, g))
			assert.Check(t, is.Equal(strings.Contains(string(b), `"idle": {`), g.Idle != nil), "%s", b)
		})
	}
	d := DefaultGatewayDeadlines
	assert.Check(t, is.Equal(d.KeyUnitTimeout(), 12*time.Minute))
	assert.Check(t, is.Equal(d.PackagesUnitTimeout(), 12*time.Minute))
	assert.Check(t, is.Equal(d.IdleUnitTimeout(), 55*time.Second))
}

// The gateway's decoder is as strict as the node's, nested objects behind a pointer included.
func TestDecodeGatewayIsStrict(t *testing.T) {
	good, err := testGateway().Encode()
	assert.NilError(t, err)
	for name, c := range map[string]struct {
		doc, want string
	}{
		"unknown key":    {strings.Replace(string(good), `"keyFile"`, `"keyfile"`, 1), `unknown key "keyfile"`},
		"nested pointer": {strings.Replace(string(good), `"nftTable"`, `"NFTTable"`, 1), `unknown key "idle.NFTTable"`},
		"second object":  {string(good) + "{}", "data after the JSON object"},
		"bad duration":   {strings.Replace(string(good), `"15m0s"`, `"15"`, 1), `missing unit in duration`},
		"missing values": {`{"idle": {}}`, "missing or invalid: deadlines.backoffInitial (a positive duration)"},
		"idle stop zero": {strings.Replace(string(good), `"15m0s"`, `"0s"`, 1), "idle.stop (a positive duration)"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeGateway(strings.NewReader(c.doc))
			assert.ErrorContains(t, err, c.want)
			assert.ErrorContains(t, err, "gateway config")
		})
	}
}

package infra_test

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
)

// gatewayRuleset is the nftables file the gateway's declared user data writes.
func gatewayRuleset(t *testing.T, values map[string]any) string {
	t.Helper()
	res := runStack(t, values)
	raw, err := cloudinit.Decode(in(find(t, res, "aws:ec2/instance:Instance", "gateway"), "userDataBase64").(string))
	assert.NilError(t, err)
	text := string(raw)
	start := strings.Index(text, "table inet dynk8s_wg0_mss {")
	assert.Assert(t, start >= 0, "no nftables table in the gateway's user data")
	return text[start:]
}

// TestGatewayForwardsWhatTheConfigSays: the default forwards everything toward on-prem; mode
// cluster renders the filter with the API server's ports (the endpoint's and kubeadm's 6443), the on-prem name
// servers of network.onPremDns and the operator's allow list.
func TestGatewayForwardsWhatTheConfigSays(t *testing.T) {
	assert.Check(t, !strings.Contains(gatewayRuleset(t, devConfig(t)), "filter_forward"), "filtered by default")

	c := devConfig(t)
	obj(c, "kubernetes")["apiServerEndpoint"] = "192.168.10.10:443"
	obj(c, "wireguard")["onPremForward"] = map[string]any{
		"mode":  "cluster",
		"allow": []any{map[string]any{"cidr": "192.168.10.20/32", "ports": "8080,50000"}},
	}
	nft := gatewayRuleset(t, c)
	for _, rule := range []string{
		"tcp dport { 179, 443, 6443 } accept",
		"ip daddr { 192.168.10.53 } udp dport 53 accept",
		"ip daddr 192.168.10.20/32 tcp dport { 8080, 50000 } accept",
		`counter drop comment "refused"`,
	} {
		assert.Check(t, is.Contains(nft, rule))
	}
}

package cloudinit

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
)

func testForward() *GatewayForward {
	return &GatewayForward{
		APIServerPorts: []int{6443},
		DNSServers:     []netip.Addr{netip.MustParseAddr("192.168.1.53")},
		Allow: []ForwardAllow{
			{CIDR: netip.MustParsePrefix("192.168.10.20/32"), Protocol: "tcp", Ports: "8080,50000"},
			{CIDR: netip.MustParsePrefix("192.168.20.0/24"), Protocol: "udp"},
			{CIDR: netip.MustParsePrefix("192.168.30.0/24"), Protocol: "all"},
		},
	}
}

func forwardRuleset(t *testing.T, f *GatewayForward) string {
	t.Helper()
	in := testGateway()
	in.Forward = f
	ud, err := Gateway(in)
	assert.NilError(t, err)
	return fileByPath(t, parseCloudConfig(t, ud), wgMSSPath).Content
}

// TestGatewayForwardFilter: with the filter on, the gateway's table drops new connections from
// the VPC into the tunnel except to the API server's port, the CNI's encapsulation, the on-prem name servers and the
// operator's list, and keeps replies; without it (the default) nothing is filtered.
func TestGatewayForwardFilter(t *testing.T) {
	nft := forwardRuleset(t, testForward())
	for _, rule := range []string{
		"type filter hook forward priority filter; policy accept;",
		`oifname != "wg0" accept`,
		"ct state established,related accept",
		"tcp dport { 179, 6443 } accept",
		"udp dport { 4789, 6081, 8472 } accept",
		"ip protocol { 4 } accept",
		"ip daddr { 192.168.1.53 } udp dport 53 accept",
		"ip daddr { 192.168.1.53 } tcp dport 53 accept",
		"ip daddr 192.168.10.20/32 tcp dport { 8080, 50000 } accept",
		"ip daddr 192.168.20.0/24 meta l4proto udp accept",
		"ip daddr 192.168.30.0/24 accept",
		`counter drop comment "refused"`,
		"type filter hook input priority filter; policy accept;",
		`counter drop comment "refused-to-gateway"`,
	} {
		assert.Check(t, is.Contains(nft, "    "+rule+"\n"))
	}
	// The drop is the forward chain's last rule: nothing after it could let a packet through.
	forward := nft[strings.Index(nft, "chain filter_forward"):strings.Index(nft, "chain filter_input")]
	assert.Check(t, strings.HasSuffix(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(forward), "}")),
		`counter drop comment "refused"`), forward)

	off := forwardRuleset(t, nil)
	assert.Check(t, !strings.Contains(off, "filter_forward") && !strings.Contains(off, "refused"),
		"no filter by default: %s", off)
}

// nft(8) in check mode accepts the filtered ruleset, including a reload over itself (wg-quick's PostUp at each
// start).
func TestGatewayForwardFilterParsesWithNft(t *testing.T) {
	t.Parallel()
	nft := realtools.Require(t, "nft")
	ruleset := forwardRuleset(t, testForward())
	f := filepath.Join(t.TempDir(), "forward.nft")
	assert.NilError(t, os.WriteFile(f, []byte(ruleset+ruleset), 0o600))
	out, err := exec.Command(nft, "-c", "-f", f).CombinedOutput()
	assert.NilError(t, err, "nft -c: %s\n%s", out, ruleset)
}

func TestGatewayForwardValidation(t *testing.T) {
	for name, f := range map[string]*GatewayForward{
		"no API server port": {},
		"port out of range":  {APIServerPorts: []int{70000}},
		"ports with all": {APIServerPorts: []int{6443}, Allow: []ForwardAllow{
			{CIDR: netip.MustParsePrefix("192.168.30.0/24"), Protocol: "all", Ports: "22"}}},
		"ports malformed": {APIServerPorts: []int{6443}, Allow: []ForwardAllow{
			{CIDR: netip.MustParsePrefix("192.168.30.0/24"), Protocol: "tcp", Ports: "22;reboot"}}},
		"unknown protocol": {APIServerPorts: []int{6443}, Allow: []ForwardAllow{
			{CIDR: netip.MustParsePrefix("192.168.30.0/24"), Protocol: "sctp"}}},
	} {
		in := testGateway()
		in.Forward = f
		_, err := Gateway(in)
		assert.Check(t, is.ErrorContains(err, "Forward"), name)
	}
}

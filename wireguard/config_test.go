package wireguard

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
)

// key parses a base64 key of the vectors.
func key(t *testing.T, s string) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.ParseKey(s)
	assert.NilError(t, err)
	return k
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func hostPort(t *testing.T, s string) *endpoint.HostPort {
	t.Helper()
	e, err := endpoint.Parse(s)
	assert.NilError(t, err)
	return &e
}

// fixture is a site-to-site shape like the stack's: the on-prem side dials out to the gateway, behind NAT.
func fixture(t *testing.T) Config {
	t.Helper()
	v := loadVectors(t)
	private, psk := key(t, v.Pairs[0].Private), key(t, v.Pairs[2].Private)
	return Config{
		Interface: Interface{
			PrivateKey: &private,
			Address:    prefixes("10.200.0.2/31", "fd00:200::2/127"),
			ListenPort: 51820,
			MTU:        1380,
			Table:      "off",
			PostUp: []string{
				"ip route add 10.0.0.0/16 dev %i",
				"iptables -t mangle -A FORWARD -o %i -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu",
			},
			PreDown: []string{"ip route del 10.0.0.0/16 dev %i"},
		},
		Peers: []Peer{
			{
				PublicKey:           key(t, v.Pairs[1].Public),
				PresharedKey:        &psk,
				AllowedIPs:          prefixes("10.0.0.0/16", "10.200.0.0/31"),
				Endpoint:            hostPort(t, "203.0.113.10:51820"),
				PersistentKeepalive: 25,
			},
			{
				PublicKey:  key(t, v.Pairs[3].Public),
				AllowedIPs: prefixes("fd00:200::/127"),
				Endpoint:   hostPort(t, "[2001:db8::1]:51821"),
			},
		},
	}
}

func TestMarshalGolden(t *testing.T) {
	out, err := fixture(t).Marshal()
	assert.NilError(t, err)
	golden.Assert(t, string(out), "config.golden")
}

func TestMarshalOmitsEmptyFields(t *testing.T) {
	v := loadVectors(t)
	private := key(t, v.Pairs[0].Private)
	out, err := Config{
		Interface: Interface{PrivateKey: &private},
		Peers:     []Peer{{PublicKey: key(t, v.Pairs[1].Public)}},
	}.Marshal()
	assert.NilError(t, err)
	want := "[Interface]\nPrivateKey = " + v.Pairs[0].Private + "\n\n[Peer]\nPublicKey = " + v.Pairs[1].Public + "\n"
	assert.Equal(t, string(out), want)
}

// The values are typed (keys, prefixes, the endpoint), so what is left to check is what the file's encoding needs.
func TestMarshalValidationNamesField(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"missing private key":  {func(c *Config) { c.Interface.PrivateKey = nil }, "Interface.PrivateKey: required"},
		"no address":           {func(c *Config) { c.Interface.Address[1] = netip.Prefix{} }, "Interface.Address[1]: is not an address"},
		"table":                {func(c *Config) { c.Interface.Table = "main table" }, "Interface.Table: "},
		"hook newline":         {func(c *Config) { c.Interface.PostUp[1] = "true\n[Peer]" }, "Interface.PostUp[1]: "},
		"empty hook":           {func(c *Config) { c.Interface.PreDown[0] = " " }, "Interface.PreDown[0]: empty command"},
		"missing public key":   {func(c *Config) { c.Peers[1].PublicKey = wgtypes.Key{} }, "Peers[1].PublicKey: required"},
		"duplicate peer":       {func(c *Config) { c.Peers[1].PublicKey = c.Peers[0].PublicKey }, "Peers[1].PublicKey: same key as Peers[0]"},
		"allowed ip none":      {func(c *Config) { c.Peers[0].AllowedIPs[0] = netip.Prefix{} }, "Peers[0].AllowedIPs[0]: is not a CIDR"},
		"allowed ip host bits": {func(c *Config) { c.Peers[0].AllowedIPs[0] = netip.MustParsePrefix("10.0.0.1/16") }, "Peers[0].AllowedIPs[0]: 10.0.0.1/16 has host bits set, want 10.0.0.0/16"},
		"empty endpoint":       {func(c *Config) { c.Peers[0].Endpoint = &endpoint.HostPort{} }, "Peers[0].Endpoint: is empty"},
	} {
		t.Run(name, func(t *testing.T) {
			c := fixture(t)
			tc.mutate(&c)
			out, err := c.Marshal()
			assert.ErrorContains(t, err, tc.want)
			assert.Check(t, is.Nil(out))
		})
	}
}

func TestMarshalReportsEveryProblem(t *testing.T) {
	c := fixture(t)
	c.Interface.Table = "a b"
	c.Peers[1].Endpoint = &endpoint.HostPort{}
	_, err := c.Marshal()
	assert.ErrorContains(t, err, "Interface.Table: ")
	assert.ErrorContains(t, err, "Peers[1].Endpoint: ")
}

func TestMarshalAcceptsHostnameEndpoint(t *testing.T) {
	c := fixture(t)
	c.Peers[0].Endpoint = hostPort(t, "gw-1.vpn.example.com:51820")
	out, err := c.Marshal()
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), "Endpoint = gw-1.vpn.example.com:51820\n"))
}

// TestRealParserAcceptsMarshalled feeds the output through wg-quick's own strip and wg's own parser. Without a
// WireGuard kernel module `wg setconf` always exits 1, but only after parsing: a good file fails at the netlink
// call ("Protocol not supported"), a bad one at parsing ("Configuration parsing error").
func TestRealParserAcceptsMarshalled(t *testing.T) {
	out, err := fixture(t).Marshal()
	assert.NilError(t, err)

	stderr := realtools.WGSetconf(t, out)
	assert.Check(t, is.Contains(stderr, "Protocol not supported"))
	assert.Check(t, !strings.Contains(stderr, "Configuration parsing error"), stderr)
}

func TestRealParserRejectsBrokenKey(t *testing.T) {
	c := fixture(t)
	out, err := c.Marshal()
	assert.NilError(t, err)
	// Break the file behind Marshal's back, to prove the check above would notice a bad file.
	broken := bytes.Replace(out, []byte(c.Peers[1].PublicKey.String()), []byte("notAKey"), 1)
	assert.Assert(t, !bytes.Equal(broken, out))

	stderr := realtools.WGSetconf(t, broken)
	assert.Check(t, is.Contains(stderr, "Configuration parsing error"))
	assert.Check(t, is.Contains(stderr, "Key is not the correct length or format"))
}

// TestKeyFromFile: a config whose PostUp loads the key from a file needs no PrivateKey line, and renders none.
func TestKeyFromFile(t *testing.T) {
	v := loadVectors(t)
	out, err := Config{
		Interface: Interface{PostUp: []string{"wg set %i private-key /etc/wireguard/wg0.key"}},
		Peers:     []Peer{{PublicKey: key(t, v.Pairs[1].Public)}},
	}.Marshal()
	assert.NilError(t, err)
	assert.Assert(t, !bytes.Contains(out, []byte("PrivateKey")))
	assert.Assert(t, bytes.Contains(out, []byte("PostUp = wg set %i private-key /etc/wireguard/wg0.key\n")))
}

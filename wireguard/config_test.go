package wireguard

import (
	"bytes"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/dynk8s/dynk8s/internal/realtools"
)

// fixture is a site-to-site shape like the stack's: the on-prem side dials out to the gateway, behind NAT.
func fixture(t *testing.T) Config {
	t.Helper()
	v := loadVectors(t)
	return Config{
		Interface: Interface{
			PrivateKey: v.Pairs[0].Private,
			Address:    []string{"10.200.0.2/31", "fd00:200::2/127"},
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
				PublicKey:           v.Pairs[1].Public,
				PresharedKey:        v.Pairs[2].Private,
				AllowedIPs:          []string{"10.0.0.0/16", "10.200.0.0/31"},
				Endpoint:            "203.0.113.10:51820",
				PersistentKeepalive: 25,
			},
			{
				PublicKey:  v.Pairs[3].Public,
				AllowedIPs: []string{"fd00:200::/127"},
				Endpoint:   "[2001:db8::1]:51821",
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
	out, err := Config{
		Interface: Interface{PrivateKey: v.Pairs[0].Private},
		Peers:     []Peer{{PublicKey: v.Pairs[1].Public}},
	}.Marshal()
	assert.NilError(t, err)
	want := "[Interface]\nPrivateKey = " + v.Pairs[0].Private + "\n\n[Peer]\nPublicKey = " + v.Pairs[1].Public + "\n"
	assert.Equal(t, string(out), want)
}

func TestMarshalValidationNamesField(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"missing private key":  {func(c *Config) { c.Interface.PrivateKey = "" }, "Interface.PrivateKey: required"},
		"bad private key":      {func(c *Config) { c.Interface.PrivateKey = "abc" }, "Interface.PrivateKey: key is 3 characters"},
		"bad address":          {func(c *Config) { c.Interface.Address[1] = "10.0.0.300/24" }, "Interface.Address[1]: "},
		"listen port":          {func(c *Config) { c.Interface.ListenPort = 70000 }, "Interface.ListenPort: 70000 is out of range 0..65535"},
		"mtu low":              {func(c *Config) { c.Interface.MTU = 1279 }, "Interface.MTU: 1279 is out of range 1280..8920"},
		"mtu high":             {func(c *Config) { c.Interface.MTU = 9001 }, "Interface.MTU: 9001 is out of range 1280..8920"},
		"table":                {func(c *Config) { c.Interface.Table = "main table" }, "Interface.Table: "},
		"hook newline":         {func(c *Config) { c.Interface.PostUp[1] = "true\n[Peer]" }, "Interface.PostUp[1]: "},
		"empty hook":           {func(c *Config) { c.Interface.PreDown[0] = " " }, "Interface.PreDown[0]: empty command"},
		"missing public key":   {func(c *Config) { c.Peers[1].PublicKey = "" }, "Peers[1].PublicKey: required"},
		"bad public key":       {func(c *Config) { c.Peers[0].PublicKey = "x" }, "Peers[0].PublicKey: key is 1 characters"},
		"duplicate peer":       {func(c *Config) { c.Peers[1].PublicKey = c.Peers[0].PublicKey }, "Peers[1].PublicKey: same key as Peers[0]"},
		"bad psk":              {func(c *Config) { c.Peers[0].PresharedKey = "!" }, "Peers[0].PresharedKey: "},
		"allowed ip no cidr":   {func(c *Config) { c.Peers[0].AllowedIPs[0] = "10.0.0.1" }, "Peers[0].AllowedIPs[0]: \"10.0.0.1\" is not a CIDR"},
		"allowed ip host bits": {func(c *Config) { c.Peers[0].AllowedIPs[0] = "10.0.0.1/16" }, "Peers[0].AllowedIPs[0]: \"10.0.0.1/16\" has host bits set, want 10.0.0.0/16"},
		"endpoint no port":     {func(c *Config) { c.Peers[0].Endpoint = "203.0.113.10" }, "Peers[0].Endpoint: \"203.0.113.10\" is not host:port"},
		"endpoint port zero":   {func(c *Config) { c.Peers[0].Endpoint = "gw.example.com:0" }, "Peers[0].Endpoint: \"gw.example.com:0\": port \"0\" is not in 1..65535"},
		"endpoint bad host":    {func(c *Config) { c.Peers[0].Endpoint = "a b:51820" }, "Peers[0].Endpoint: \"a b:51820\": host \"a b\" is neither"},
		"ipv6 no brackets":     {func(c *Config) { c.Peers[1].Endpoint = "2001:db8::1:51821" }, "Peers[1].Endpoint: "},
		"keepalive":            {func(c *Config) { c.Peers[0].PersistentKeepalive = 65536 }, "Peers[0].PersistentKeepalive: 65536 is out of range 0..65535"},
		"keepalive negative":   {func(c *Config) { c.Peers[0].PersistentKeepalive = -1 }, "Peers[0].PersistentKeepalive: -1 is out of range"},
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
	c.Interface.MTU = 100
	c.Peers[1].Endpoint = "nope"
	_, err := c.Marshal()
	assert.ErrorContains(t, err, "Interface.MTU: ")
	assert.ErrorContains(t, err, "Peers[1].Endpoint: ")
}

func TestMarshalAcceptsHostnameEndpoint(t *testing.T) {
	c := fixture(t)
	c.Peers[0].Endpoint = "gw-1.vpn.example.com:51820"
	_, err := c.Marshal()
	assert.NilError(t, err)
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
	broken := bytes.Replace(out, []byte(c.Peers[1].PublicKey), []byte("notAKey"), 1)
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
		Peers:     []Peer{{PublicKey: v.Pairs[1].Public}},
	}.Marshal()
	assert.NilError(t, err)
	assert.Assert(t, !bytes.Contains(out, []byte("PrivateKey")))
	assert.Assert(t, bytes.Contains(out, []byte("PostUp = wg set %i private-key /etc/wireguard/wg0.key\n")))
}

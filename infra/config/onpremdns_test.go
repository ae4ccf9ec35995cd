package config_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra/config"
)

// The dev stack's on-prem DNS is read as typed addresses and domains.
func TestOnPremDNSRead(t *testing.T) {
	cfg, err := parse(t, devConfig(t))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(cfg.Network.OnPremDNS.Servers, []netip.Addr{netip.MustParseAddr("192.168.10.53")},
		cmp.Comparer(func(a, b netip.Addr) bool { return a == b })))
	assert.Check(t, is.DeepEqual(cfg.Network.OnPremDNS.Domains, []string{"home.lan"}))

	c := devConfig(t)
	delete(obj(c, "network"), "onPremDns")
	cfg, err = parse(t, c)
	assert.NilError(t, err)
	assert.Check(t, is.Len(cfg.Network.OnPremDNS.Servers, 0), "none unless configured")
}

// Each mistake in network.onPremDns is one error at its key path.
func TestOnPremDNSValidation(t *testing.T) {
	dns := func(c map[string]any) map[string]any { return obj(c, "network")["onPremDns"].(map[string]any) }
	for _, tc := range []struct {
		name, path, msg string
		mutate          func(map[string]any)
	}{
		{"server outside the tunnel's ranges", "dynk8s:network.onPremDns.servers[0]", "not inside any of dynk8s:wireguard.onPremCidrs",
			func(c map[string]any) { dns(c)["servers"] = []any{"10.9.9.9"} }},
		{"server not an address", "dynk8s:network.onPremDns.servers[0]", "not an IP address",
			func(c map[string]any) { dns(c)["servers"] = []any{"ns1.home.lan"} }},
		{"server IPv6", "dynk8s:network.onPremDns.servers[0]", "only IPv4",
			func(c map[string]any) { dns(c)["servers"] = []any{"fd00::53"} }},
		{"server twice", "dynk8s:network.onPremDns.servers[1]", "listed twice",
			func(c map[string]any) { dns(c)["servers"] = []any{"192.168.10.53", "192.168.10.53"} }},
		{"four servers", "dynk8s:network.onPremDns.servers", "at most 3",
			func(c map[string]any) {
				dns(c)["servers"] = []any{"192.168.10.1", "192.168.10.2", "192.168.10.3", "192.168.10.4"}
			}},
		{"servers without domains", "dynk8s:network.onPremDns.domains", "is required with servers",
			func(c map[string]any) { delete(dns(c), "domains") }},
		{"domains without servers", "dynk8s:network.onPremDns.servers", "is required with domains",
			func(c map[string]any) { delete(dns(c), "servers") }},
		{"routing prefix", "dynk8s:network.onPremDns.domains[0]", "not a DNS domain",
			func(c map[string]any) { dns(c)["domains"] = []any{"~home.lan"} }},
		{"trailing dot", "dynk8s:network.onPremDns.domains[0]", "not a DNS domain",
			func(c map[string]any) { dns(c)["domains"] = []any{"home.lan."} }},
		{"domain twice", "dynk8s:network.onPremDns.domains[1]", "listed twice",
			func(c map[string]any) { dns(c)["domains"] = []any{"home.lan", "home.lan"} }},
		{"misspelt key", "dynk8s:network.onPremDns.server", "unknown key",
			func(c map[string]any) { dns(c)["server"] = []any{"192.168.10.53"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := devConfig(t)
			tc.mutate(c)
			cfg, err := parse(t, c)
			assert.Assert(t, cfg == nil)
			var cfgErr *config.Error
			assert.Assert(t, errors.As(err, &cfgErr), "want a *config.Error, got %v", err)
			assert.Equal(t, len(cfgErr.Errors), 1, "want exactly one problem, got:\n%v", err)
			assert.Equal(t, cfgErr.Errors[0].Path, tc.path)
			assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, tc.msg))
		})
	}
}

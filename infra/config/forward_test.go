package config_test

import (
	"net/netip"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra/config"
)

// TestOnPremForwardDefaultsToAll: without wireguard.onPremForward the gateway forwards everything (the default the
// docs/security.md states with its risk); mode cluster takes an allow list, each entry with tcp as its default protocol.
func TestOnPremForwardDefaultsToAll(t *testing.T) {
	cfg, err := parse(t, devConfig(t))
	assert.NilError(t, err)
	assert.Equal(t, cfg.WireGuard.OnPremForward.Mode, config.ForwardAll)

	c := devConfig(t)
	obj(c, "wireguard")["onPremForward"] = map[string]any{
		"mode":  "cluster",
		"allow": []any{map[string]any{"cidr": "192.168.10.20/32", "ports": "8080,50000"}},
	}
	cfg, err = parse(t, c)
	assert.NilError(t, err)
	allow := cfg.WireGuard.OnPremForward.Allow
	assert.Equal(t, len(allow), 1)
	assert.Equal(t, allow[0], config.ForwardAllow{
		CIDR: netip.MustParsePrefix("192.168.10.20/32"), Protocol: "tcp", Ports: "8080,50000",
	})
}

func TestOnPremForwardRefused(t *testing.T) {
	fp := "dynk8s:wireguard.onPremForward."
	for _, tc := range []struct {
		name, path, msg string
		forward         map[string]any
	}{
		{"unknown mode", fp + "mode", "must be all or cluster", map[string]any{"mode": "none"}},
		{"allow without the filter", fp + "allow", "has no effect with mode all",
			map[string]any{"allow": []any{map[string]any{"cidr": "192.168.10.0/24"}}}},
		{"allow outside the tunnel", fp + "allow[0].cidr", "not inside any of wireguard.onPremCidrs",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"cidr": "192.168.0.0/16"}}}},
		{"allow without a range", fp + "allow[0].cidr", "is required",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"ports": "22"}}}},
		{"unknown protocol", fp + "allow[0].protocol", "tcp, udp, all",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"cidr": "192.168.10.0/24", "protocol": "icmp"}}}},
		{"ports with all", fp + "allow[0].ports", "must be empty with protocol all",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"cidr": "192.168.10.0/24", "protocol": "all", "ports": "22"}}}},
		{"ports malformed", fp + "allow[0].ports", "must be ports and ranges",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"cidr": "192.168.10.0/24", "ports": "ssh"}}}},
		{"range backwards", fp + "allow[0].ports", "a range low-high",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"cidr": "192.168.10.0/24", "ports": "22,9000-8000"}}}},
		{"port zero", fp + "allow[0].ports", "1..65535",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"cidr": "192.168.10.0/24", "ports": "0"}}}},
		{"misspelt key", fp + "allow[0].port", "unknown key",
			map[string]any{"mode": "cluster", "allow": []any{map[string]any{"cidr": "192.168.10.0/24", "port": "22"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := devConfig(t)
			obj(c, "wireguard")["onPremForward"] = tc.forward
			refusedAt(t, c, tc.path, tc.msg)
		})
	}
}

package gateway

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// The peer commands' decisions on a device as wgctrl reads it. The gateway box (e2e) runs them on wireguard-go
// through the gateway's real wg-quick@wg0 stop and start.

func onPremPeer(t *testing.T, endpoint string) wgtypes.Peer {
	t.Helper()
	key, err := wgtypes.ParseKey(testOtherKey)
	assert.NilError(t, err)
	p := wgtypes.Peer{PublicKey: key, AllowedIPs: []net.IPNet{{IP: net.IPv4(192, 168, 0, 0), Mask: net.CIDRMask(16, 32)}}}
	if endpoint != "" {
		p.Endpoint = net.UDPAddrFromAddrPort(netip.MustParseAddrPort(endpoint))
	}
	return p
}

func TestPeerAddressIsWhereTheOnlyPeerWasHeardFrom(t *testing.T) {
	for _, tc := range []struct {
		name     string
		peers    []wgtypes.Peer
		want     string
		wantErr  string
		wantNone bool
	}{
		{name: "heard", peers: []wgtypes.Peer{onPremPeer(t, "198.51.100.7:40312")}, want: "198.51.100.7:40312"},
		{name: "heard over IPv6", peers: []wgtypes.Peer{onPremPeer(t, "[2001:db8::7]:40312")}, want: "[2001:db8::7]:40312"},
		{name: "heard, in the 16-byte form", peers: []wgtypes.Peer{func() wgtypes.Peer {
			p := onPremPeer(t, "")
			p.Endpoint = &net.UDPAddr{IP: net.ParseIP("198.51.100.7"), Port: 40312}
			return p
		}()}, want: "198.51.100.7:40312"},
		{name: "not heard this boot", peers: []wgtypes.Peer{onPremPeer(t, "")}, wantNone: true},
		{name: "no peer", wantErr: "wg0 has 0 peers, want the on-prem peer alone"},
		{name: "two peers", peers: []wgtypes.Peer{onPremPeer(t, "198.51.100.7:1"), onPremPeer(t, "198.51.100.8:1")},
			wantErr: "wg0 has 2 peers, want the on-prem peer alone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := peerAddress(&wgtypes.Device{Name: "wg0", Peers: tc.peers})
			if tc.wantErr != "" {
				assert.Error(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			if tc.wantNone {
				assert.Check(t, !got.IsValid(), "got %s", got)
				return
			}
			assert.Equal(t, got.String(), tc.want)
		})
	}
}

// The dial touches the peer's address and keepalive alone: its key, allowed IPs and everything else stay as wg-quick
// set them.
func TestDialConfigSetsTheAddressAndAKeepaliveOnly(t *testing.T) {
	peer := onPremPeer(t, "")
	addr := netip.MustParseAddrPort("198.51.100.7:40312")
	cfg, err := dialConfig(&wgtypes.Device{Name: "wg0", Peers: []wgtypes.Peer{peer}}, addr)
	assert.NilError(t, err)
	keepalive := 25 * time.Second
	assert.DeepEqual(t, cfg, wgtypes.Config{Peers: []wgtypes.PeerConfig{{
		PublicKey:                   peer.PublicKey,
		UpdateOnly:                  true,
		Endpoint:                    net.UDPAddrFromAddrPort(addr),
		PersistentKeepaliveInterval: &keepalive,
	}}})
	assert.Check(t, is.Nil(cfg.PrivateKey))
	assert.Check(t, !cfg.ReplacePeers)

	_, err = dialConfig(&wgtypes.Device{Name: "wg0"}, addr)
	assert.Error(t, err, "wg0 has 0 peers, want the on-prem peer alone")
}

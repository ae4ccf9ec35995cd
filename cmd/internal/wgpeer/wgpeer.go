// Package wgpeer finds the on-prem peer's side of the tunnel among this host's WireGuard interfaces, for the
// commands that run on the peer (status, check).
package wgpeer

import (
	"net"
	"net/netip"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Find returns the interface named name ("": any) and its peer whose allowed IPs hold the VPC's network address:
// the gateway, as the stack's on-prem config names it. ok is false when no interface has such a peer.
func Find(devices []*wgtypes.Device, vpc netip.Prefix, name string) (dev *wgtypes.Device, peer *wgtypes.Peer, ok bool) {
	addr := net.IP(vpc.Masked().Addr().AsSlice())
	for _, d := range devices {
		if name != "" && d.Name != name {
			continue
		}
		for i := range d.Peers {
			if slices.ContainsFunc(d.Peers[i].AllowedIPs, func(n net.IPNet) bool { return n.Contains(addr) }) {
				return d, &d.Peers[i], true
			}
		}
	}
	return nil, nil, false
}

package config

import (
	"fmt"
	"net/netip"
)

// Which IPv4 ranges and addresses a key may hold. Every range key is a network of the stack or the cluster, so none
// may touch a special-purpose block that no network can be (IANA IPv4 Special-Purpose Address Registry, RFC 6890):
// AWS or the kernel would refuse it late, at the route or the interface, or it would mean the host itself. The
// ranges the node security group admits on every port (wireguard.onPremCidrs and tunnelCidr) must moreover be
// private: RFC 1918, netip's IsPrivate, or RFC 6598's shared address space, which carrier-grade NAT and overlay
// networks use for the same purpose. Anything else is someone else's address space on the internet, and the nodes
// have public addresses: the group would admit that range on every port, not only the tunnel.

// unusableRanges are the special-purpose blocks no network of the stack can be, with what they are. netip's
// predicates (IsLoopback, IsLinkLocalUnicast, IsMulticast) judge one address; a range that merely contains such a
// block (96.0.0.0/3 holds 127.0.0.0/8) needs the blocks themselves.
var unusableRanges = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network" (RFC 791)`},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback (RFC 1122)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (RFC 3927; the instance metadata service lives there)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast (RFC 5771)"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (RFC 1112), with the broadcast address"},
}

// sharedAddressSpace is RFC 6598's 100.64.0.0/10; netip has no predicate for it.
var sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")

// unusable names the special-purpose block p overlaps, or "".
func unusable(p netip.Prefix) string {
	for _, u := range unusableRanges {
		if p.Overlaps(u.prefix) {
			return fmt.Sprintf("%s %s", u.prefix, u.what)
		}
	}
	return ""
}

// isPrivateRange reports whether all of p is private: inside RFC 1918 (its first and last address are: prefixes
// nest, so a range that holds a whole private block begins or ends outside it) or inside RFC 6598.
func isPrivateRange(p netip.Prefix) bool {
	if p.Bits() >= sharedAddressSpace.Bits() && sharedAddressSpace.Contains(p.Addr()) {
		return true
	}
	return p.Addr().IsPrivate() && lastAddr(p).IsPrivate()
}

// isPrivateAddr reports whether a is an RFC 1918 or RFC 6598 address.
func isPrivateAddr(a netip.Addr) bool { return a.IsPrivate() || sharedAddressSpace.Contains(a) }

// lastAddr is the last address of the IPv4 prefix p.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	hostBits := 32 - p.Bits()
	for i := 3; i >= 0 && hostBits > 0; i-- {
		n := min(hostBits, 8)
		a[i] |= byte(1<<n - 1)
		hostBits -= n
	}
	return netip.AddrFrom4(a)
}

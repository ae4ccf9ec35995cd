package cloudinit

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/dynk8s/dynk8s/internal/endpoint"
)

// GatewayForward limits what the gateway forwards from the VPC into the tunnel: new connections only to what the
// nodes need of on-prem, and to Allow. Replies to connections on-prem opened (the API server to a kubelet, a
// controller to a pod) always pass, as does everything the tunnel brings in.
type GatewayForward struct {
	// APIServerPorts are the API server's TCP ports as the nodes reach it: the endpoint's, and the port of the
	// in-cluster `kubernetes` Service's endpoints, which the nodes' CNI pods dial (required, at least one).
	APIServerPorts []int
	// DNSServers are the on-prem name servers the nodes ask (optional).
	DNSServers []netip.Addr
	// Allow are the operator's further destinations (optional).
	Allow []ForwardAllow
}

// ForwardAllow is one destination the filter lets new connections reach.
type ForwardAllow struct {
	CIDR     netip.Prefix
	Protocol string // tcp, udp or all
	Ports    string // "8080,50000" or "8000-8100"; empty: every port (always empty with all)
}

// The CNI's node-to-node traffic that crosses the tunnel between pool nodes and on-prem nodes: VXLAN on the IANA
// port (Calico's VXLAN mode) and on the Linux kernel's old default (Flannel's and Cilium's), Geneve (Cilium,
// OVN), IP-in-IP (Calico's IPIP mode) with the BGP sessions that mode needs between every pair of nodes.
var (
	cniUDPPorts = []int{4789, 6081, 8472}
	cniTCPPorts = []int{179}
	// cniProtocols are IP protocol numbers (IANA): 4 is IP-in-IP. By number, because nft resolves a protocol name
	// through /etc/protocols, which an image may lack (Debian's minimal roots do: nft then refuses "ipip").
	cniProtocols = []string{"4"}
)

func (f *GatewayForward) validate() error {
	var e errs
	if len(f.APIServerPorts) == 0 {
		e.add("Forward.APIServerPorts", fmt.Errorf("at least one port"))
	}
	for i, p := range f.APIServerPorts {
		if p < 1 || p > 65535 {
			e.add(fmt.Sprintf("Forward.APIServerPorts[%d]", i), fmt.Errorf("%d is not a TCP port", p))
		}
	}
	for i, a := range f.DNSServers {
		if !a.Is4() {
			e.add(fmt.Sprintf("Forward.DNSServers[%d]", i), fmt.Errorf("%s is not an IPv4 address", a))
		}
	}
	for i, a := range f.Allow {
		field := fmt.Sprintf("Forward.Allow[%d]", i)
		switch {
		case !a.CIDR.IsValid() || !a.CIDR.Addr().Is4():
			e.add(field, fmt.Errorf("%s is not an IPv4 range", a.CIDR))
		case !slices.Contains([]string{"tcp", "udp", "all"}, a.Protocol):
			e.add(field, fmt.Errorf("protocol %q is not tcp, udp or all", a.Protocol))
		case a.Ports != "" && (a.Protocol == "all" || !endpoint.IsPortList(a.Ports)):
			e.add(field, fmt.Errorf("ports %q: a list of ports and ranges, for tcp or udp only", a.Ports))
		}
	}
	return e.join("gateway forward filter")
}

// forwardChains renders the filter as two chains of the gateway's table (after its counters and clamp, which see
// every packet): forward drops what the VPC sends toward on-prem that no rule allows, counting and logging it (at
// most six lines a minute; the counters are anonymous, as the idle check sums the table's named ones); input drops what reaches the gateway itself from the tunnel, but replies and ICMP (it
// serves nothing there). An empty string when f is nil: everything is forwarded.
func forwardChains(f *GatewayForward, iface, refused string) string {
	if f == nil {
		return ""
	}
	var b strings.Builder
	rule := func(format string, args ...any) { fmt.Fprintf(&b, "    "+format+"\n", args...) }
	b.WriteString("  chain filter_forward {\n    type filter hook forward priority filter; policy accept;\n")
	rule("oifname != %q accept", iface)
	rule("ct state established,related accept")
	rule("meta l4proto icmp accept")
	tcp := append(slices.Clone(f.APIServerPorts), cniTCPPorts...)
	slices.Sort(tcp)
	rule("tcp dport %s accept", nftSet(slices.Compact(tcp)))
	rule("udp dport %s accept", nftSet(cniUDPPorts))
	rule("ip protocol %s accept", nftSet(cniProtocols))
	if len(f.DNSServers) > 0 {
		rule("ip daddr %s udp dport 53 accept", nftSet(f.DNSServers))
		rule("ip daddr %s tcp dport 53 accept", nftSet(f.DNSServers))
	}
	for _, a := range f.Allow {
		switch {
		case a.Protocol == "all":
			rule("ip daddr %s accept", a.CIDR)
		case a.Ports == "":
			rule("ip daddr %s meta l4proto %s accept", a.CIDR, a.Protocol)
		default:
			rule("ip daddr %s %s dport %s accept", a.CIDR, a.Protocol, nftSet(strings.Split(a.Ports, ",")))
		}
	}
	rule(`limit rate 6/minute burst 6 packets log prefix "dynk8s-gateway refused: " level info`)
	rule("counter drop comment %q", refused)
	b.WriteString("  }\n")
	b.WriteString("  chain filter_input {\n    type filter hook input priority filter; policy accept;\n")
	rule("iifname != %q accept", iface)
	rule("ct state established,related accept")
	rule("meta l4proto icmp accept")
	rule("counter drop comment %q", refused+"-to-gateway")
	b.WriteString("  }\n")
	return b.String()
}

// nftSet renders values as an nft anonymous set, in the order given: { 179, 6443 }.
func nftSet[T any](values []T) string {
	parts := make([]string, len(values))
	for i, v := range values {
		switch x := any(v).(type) {
		case int:
			parts[i] = strconv.Itoa(x)
		default:
			parts[i] = fmt.Sprint(x)
		}
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// Package endpoint is the host:port a dynk8s config names (the API server as reached through the tunnel, the on-prem
// WireGuard peer): parsed once, by the config reader, and handed to the renderers typed, so that they check nothing
// of its grammar again.
package endpoint

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// HostPort is a valid host:port whose host is an IP address or a DNS name; the zero value is none.
type HostPort struct {
	Host string
	Port uint16
}

// Parse parses host:port.
func Parse(s string) (HostPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return HostPort{}, fmt.Errorf("%q must be host:port (e.g. 192.168.10.10:6443, vpn.example.com:51820)", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return HostPort{}, fmt.Errorf("%q: port must be 1..65535", s)
	}
	if _, err := netip.ParseAddr(host); err != nil && !kube.IsDNSSubdomain(strings.ToLower(host)) {
		return HostPort{}, fmt.Errorf("%q: host must be an IP address or a DNS name", s)
	}
	return HostPort{Host: host, Port: uint16(n)}, nil
}

// MarshalText is String: a HostPort travels as host:port (in node.json, among others).
func (e HostPort) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText is Parse.
func (e *HostPort) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// MustParse is Parse for a literal known to be valid; it panics on any other.
func MustParse(s string) HostPort {
	e, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return e
}

// IsZero says there is no endpoint.
func (e HostPort) IsZero() bool { return e == HostPort{} }

// String is host:port, with an IPv6 host in brackets.
func (e HostPort) String() string { return net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port))) }

// Addr is the host as an IP address, when it is one.
func (e HostPort) Addr() (netip.Addr, bool) {
	a, err := netip.ParseAddr(e.Host)
	return a, err == nil
}

// portListRE is a list of ports and ranges, "80,443,8000-8100", as nft's set syntax takes it once the commas are
// spaced.
var portListRE = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)

// IsPortList reports whether s has the form of a list of ports and ranges (the config checks their bounds).
func IsPortList(s string) bool { return portListRE.MatchString(s) }

package config

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// Endpoint is a validated host:port whose host is an IP address or a DNS name.
type Endpoint struct {
	Host string
	Port uint16
}

// ParseEndpoint parses host:port.
func ParseEndpoint(s string) (Endpoint, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("%q must be host:port (e.g. 192.168.10.10:6443)", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return Endpoint{}, fmt.Errorf("%q: port must be 1..65535", s)
	}
	if _, err := netip.ParseAddr(host); err != nil && !kube.IsDNSSubdomain(strings.ToLower(host)) {
		return Endpoint{}, fmt.Errorf("%q: host must be an IP address or a DNS name", s)
	}
	return Endpoint{Host: host, Port: uint16(n)}, nil
}

// String is host:port, with an IPv6 host in brackets.
func (e Endpoint) String() string { return net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port))) }

// Addr is the host as an IP address, when it is one.
func (e Endpoint) Addr() (netip.Addr, bool) {
	a, err := netip.ParseAddr(e.Host)
	return a, err == nil
}

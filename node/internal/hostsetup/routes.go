// Package hostsetup is the node's host setup beside the boot: the routes toward on-prem at the tunnel's MTU, and
// the lockdown of the instance metadata service to root and the pool's listed users.
package hostsetup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The routes toward on-prem, capped at the tunnel's MTU: run at every boot by dynk8s-onprem-routes.service, before
// the join and the kubelet (routes do not persist). The instance's interface runs at MTU 9001 and the tunnel at
// wireguard.mtu, so a larger packet with don't-fragment set toward on-prem dies at the gateway. With the route's MTU,
// host TCP advertises an MSS that fits, and the CNI's tunnel devices (IPIP, VXLAN) fragment or tell their senders the
// path MTU. The routes go via the default route's gateway and device, as the VPC routes them anyway.

// routeTable is the node's IPv4 routing table: the seam the table tests fake.
type routeTable interface {
	// defaultRoute is the IPv4 default route's gateway and device; an error while there is none yet.
	defaultRoute(ctx context.Context) (gateway netip.Addr, dev string, err error)
	// replace sets the route to dst via gateway on dev with mtu, whatever was there.
	replace(ctx context.Context, dst netip.Prefix, gateway netip.Addr, dev string, mtu int) error
}

// onPremRoutes waits for the default route (DHCP may still be at it) until the routes deadline, then routes every
// on-prem range via it at the tunnel's MTU.
func onPremRoutes(ctx context.Context, cfg nodeconfig.Node, table routeTable, clock *system.Clock, log *system.Logger) error {
	var gw netip.Addr
	var dev string
	if err := clock.Retry(ctx, log, "find the default route", func(ctx context.Context) error {
		var err error
		gw, dev, err = table.defaultRoute(ctx)
		return err
	}); err != nil {
		return err
	}
	h := cfg.Host
	for _, dst := range h.OnPremCIDRs {
		if err := table.replace(ctx, dst, gw, dev, int(h.TunnelMTU)); err != nil {
			return fmt.Errorf("could not route %s via %s dev %s with MTU %d: %w", dst, gw, dev, h.TunnelMTU, err)
		}
	}
	log.Printf("routes to %s via %s dev %s capped at MTU %d", joinPrefixes(h.OnPremCIDRs), gw, dev, h.TunnelMTU)
	return nil
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " ")
}

// ipRoutes is the routing table through ip(8) of iproute2, which every image has: its JSON output (-j) is read by the
// agent, not by a shell.
type ipRoutes struct {
	dryRun bool
	log    *system.Logger
}

// ipRoute is one route of `ip -j route show` (iproute2's print_route in ip/iproute.c names the fields).
type ipRoute struct {
	Dst     string `json:"dst"`
	Gateway string `json:"gateway"`
	Dev     string `json:"dev"`
	Metric  int    `json:"metric"`
}

func (r ipRoutes) defaultRoute(ctx context.Context) (netip.Addr, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", "-j", "-4", "route", "show", "default")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return netip.Addr{}, "", fmt.Errorf("ip -j -4 route show default: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return parseDefaultRoute(out)
}

// parseDefaultRoute picks the default route with a gateway and the lowest metric, the one the kernel uses.
func parseDefaultRoute(out []byte) (netip.Addr, string, error) {
	var routes []ipRoute
	if err := json.Unmarshal(out, &routes); err != nil {
		return netip.Addr{}, "", fmt.Errorf("ip -j -4 route show default: %w", err)
	}
	routes = slices.DeleteFunc(routes, func(r ipRoute) bool { return r.Dst != "default" || r.Gateway == "" || r.Dev == "" })
	if len(routes) == 0 {
		return netip.Addr{}, "", errors.New("no IPv4 default route with a gateway yet")
	}
	best := slices.MinFunc(routes, func(a, b ipRoute) int { return a.Metric - b.Metric })
	gw, err := netip.ParseAddr(best.Gateway)
	if err != nil || !gw.Is4() {
		return netip.Addr{}, "", fmt.Errorf("the default route's gateway %q is not an IPv4 address", best.Gateway)
	}
	return gw, best.Dev, nil
}

func (r ipRoutes) replace(ctx context.Context, dst netip.Prefix, gw netip.Addr, dev string, mtu int) error {
	args := []string{"route", "replace", dst.String(), "via", gw.String(), "dev", dev, "mtu", strconv.Itoa(mtu)}
	if r.dryRun {
		r.log.Printf("dry run: would run ip %s", strings.Join(args, " "))
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

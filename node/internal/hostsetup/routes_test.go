package hostsetup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/node/internal/system"
)

// fakeRoutes has no default route for its first noRoute looks, then EC2's; it records what was routed.
type fakeRoutes struct {
	noRoute  int
	looks    int
	failing  string // a destination whose replace fails
	replaced []string
}

func (f *fakeRoutes) defaultRoute(context.Context) (netip.Addr, string, error) {
	f.looks++
	if f.looks <= f.noRoute {
		return parseDefaultRoute([]byte("[]"))
	}
	return parseDefaultRoute([]byte(`[{"dst":"default","gateway":"10.100.1.1","dev":"ens5","protocol":"dhcp","metric":100}]`))
}

func (f *fakeRoutes) replace(_ context.Context, dst netip.Prefix, gw netip.Addr, dev string, mtu int) error {
	if dst.String() == f.failing {
		return errors.New("exit status 2: Error: Nexthop has invalid gateway")
	}
	f.replaced = append(f.replaced, fmt.Sprintf("%s via %s dev %s mtu %d", dst, gw, dev, mtu))
	return nil
}

// The routes toward on-prem are capped at the tunnel's MTU, via the default route's gateway once DHCP has set it;
// without a default route by the deadline the unit fails with that one reason and routes nothing.
func TestOnPremRoutes(t *testing.T) {
	for name, c := range map[string]struct {
		routes  fakeRoutes
		want    []string
		log     string
		failure string
	}{
		"once the default route is there": {routes: fakeRoutes{noRoute: 2},
			want: []string{"192.168.0.0/16 via 10.100.1.1 dev ens5 mtu 1380", "172.16.0.0/12 via 10.100.1.1 dev ens5 mtu 1380"},
			log:  "find the default route: attempt 1 failed: no IPv4 default route with a gateway yet"},
		"no default route": {routes: fakeRoutes{noRoute: 1 << 30},
			failure: "find the default route: gave up after"},
		"a route ip refuses": {routes: fakeRoutes{failing: "172.16.0.0/12"},
			want:    []string{"192.168.0.0/16 via 10.100.1.1 dev ens5 mtu 1380"},
			failure: "could not route 172.16.0.0/12 via 10.100.1.1 dev ens5 with MTU 1380: exit status 2"},
	} {
		t.Run(name, func(t *testing.T) {
			r := newHostRig(t)
			r.cfg.Host.OnPremCIDRs = append(r.cfg.Host.OnPremCIDRs, netip.MustParsePrefix("172.16.0.0/12"))
			r.cfg.Host.TunnelMTU = 1380
			log := system.NewLogger("dynk8s-onprem-routes", r.log, r.root)
			err := onPremRoutes(context.Background(), r.cfg, &c.routes, system.NewClock(300*time.Millisecond, 20*time.Millisecond,
				50*time.Millisecond), log)
			assert.Check(t, is.DeepEqual(c.routes.replaced, c.want))
			if c.failure != "" {
				assert.ErrorContains(t, err, c.failure)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Contains(r.log.String(), c.log))
			assert.Check(t, is.Contains(r.log.String(), "routes to 192.168.0.0/16 172.16.0.0/12 via 10.100.1.1 dev ens5 capped at MTU 1380"))
		})
	}
}

// `ip -j -4 route show default` as iproute2 prints it: the route with a gateway and the lowest metric wins; a
// default route without a gateway (a point-to-point device) is no route to go via.
func TestParseDefaultRoute(t *testing.T) {
	for name, c := range map[string]struct{ out, gw, dev, err string }{
		"EC2": {out: `[{"dst":"default","gateway":"10.100.1.1","dev":"ens5","protocol":"dhcp","prefsrc":"10.100.1.23","metric":100,"flags":[]}]`,
			gw: "10.100.1.1", dev: "ens5"},
		"two, by metric": {out: `[{"dst":"default","gateway":"10.0.0.1","dev":"ens6","metric":200},` +
			`{"dst":"default","gateway":"10.100.1.1","dev":"ens5","metric":100}]`, gw: "10.100.1.1", dev: "ens5"},
		"none":       {out: `[]`, err: "no IPv4 default route with a gateway yet"},
		"no gateway": {out: `[{"dst":"default","dev":"wg0","scope":"link","flags":[]}]`, err: "no IPv4 default route with a gateway yet"},
		"not JSON":   {out: "default via 10.100.1.1 dev ens5", err: "ip -j -4 route show default: invalid character"},
		"IPv6 gateway": {out: `[{"dst":"default","gateway":"fe80::1","dev":"ens5"}]`,
			err: `the default route's gateway "fe80::1" is not an IPv4 address`},
	} {
		t.Run(name, func(t *testing.T) {
			gw, dev, err := parseDefaultRoute([]byte(c.out))
			if c.err != "" {
				assert.ErrorContains(t, err, c.err)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(gw.String()+" "+dev, c.gw+" "+c.dev))
		})
	}
}

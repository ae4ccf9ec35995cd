//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/endpoint"
)

// vpcRouter is the VPC's router for the boxes of one test: a network namespace of its own, where each box's
// interface has its other end, and which routes as the stack's route tables do: each box's address to its box, and
// the on-prem ranges to the gateway instance's address (the stack's routes to the gateway's network interface).
// The VPC's own DHCP, DNS and source/destination check are not modelled: each box's address is static, and the
// gateway forwards what it is sent.
type vpcRouter struct {
	name  string
	ports int
	// addrs are the boxes' addresses by the router port that leads to them.
	addrs map[string]netip.Addr
}

func newVPCRouter(t *testing.T, name string) *vpcRouter {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	// proxy_arp: the router answers a box's ARP for any address it routes elsewhere, as the VPC's fabric delivers
	// between instances of one subnet (the gateway's replies to a node in its subnet).
	run(t, "ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.proxy_arp=1")
	return &vpcRouter{name: name, addrs: map[string]netip.Addr{}}
}

// port names the router's end of the next box's interface.
func (r *vpcRouter) port() string {
	r.ports++
	return "vpc" + strconv.Itoa(r.ports)
}

// attach brings up the router's end of a box's interface, now in the router's namespace: the box's default
// gateway's address on it (the same .1 on every port whose box is in that /24, as a VPC's router answers at each
// subnet's first address) and the box's address routed to it.
func (r *vpcRouter) attach(t *testing.T, port, boxIP, gw string) {
	t.Helper()
	addr, err := netip.ParseAddr(boxIP)
	assert.NilError(t, err)
	for p, a := range r.addrs {
		if a == addr {
			t.Fatalf("router %s: %s is on port %s already", r.name, boxIP, p)
		}
	}
	r.addrs[port] = addr
	for _, args := range [][]string{
		{"addr", "add", gw + "/32", "dev", port},
		{"link", "set", port, "up"},
		{"route", "add", boxIP + "/32", "dev", port},
	} {
		run(t, "ip", append([]string{"-n", r.name}, args...)...)
	}
}

// routeVia routes dst to the box at boxIP (a route table's entry toward an instance's network interface).
func (r *vpcRouter) routeVia(t *testing.T, dst netip.Prefix, boxIP string) {
	t.Helper()
	for p, a := range r.addrs {
		if a.String() == boxIP {
			run(t, "ip", "-n", r.name, "route", "add", dst.String(), "via", boxIP, "dev", p)
			return
		}
	}
	t.Fatalf("router %s: no box at %s to route %s to", r.name, boxIP, dst)
}

// vpcWithGateway is the VPC of the burst: its router, the stack's gateway instance in moto (stopped when the burst
// begins, started by the first node's boot) with its box, the on-prem side beyond its tunnel, where the API server
// answers at the stack's kubernetes.apiServerEndpoint, and the temporary credentials of the node's role, which its
// instances' IMDS hands out.
type vpcWithGateway struct {
	router    *vpcRouter
	aws       *awsEnv
	gateway   *boxGateway
	gatewayID string
	// api is the API server's endpoint as the nodes reach it: on-prem, through the tunnel.
	api      endpoint.HostPort
	nodeRole awsKey
}

// newVPCWithGateway builds the VPC around moto a (started with s.instanceRoles and s.gateway replayed): the gateway is the dev stack's, with
// gateway.idleStop at its shortest (config.MinIdleStop), so that the burst sees it go back to sleep.
func newVPCWithGateway(ctx context.Context, t *testing.T, c cluster, cfg *config.Config, s stackAutoscaling,
	a *awsEnv) *vpcWithGateway {
	t.Helper()
	v := &vpcWithGateway{aws: a, api: cfg.Kubernetes.APIServerEndpoint, nodeRole: a.roles[s.nodeRole(t)]}
	v.router = newVPCRouter(t, "dynk8s-vpc-"+strconv.Itoa(os.Getpid()))
	v.gatewayID = a.ids[s.gateway.ID]
	if v.gatewayID == "" {
		t.Fatal("moto was not given the gateway instance (stackAutoscaling.replay.Gateway)")
	}
	p := renderTunnelEdited(t, false, func(t *testing.T, values map[string]any) {
		gw, ok := values["dynk8s:gateway"].(map[string]any)
		if !ok {
			t.Fatal("Pulumi.dev.yaml has no dynk8s:gateway object")
		}
		gw["idleStop"] = config.MinIdleStop.String()
	})
	if ip, _ := s.gateway.Inputs["privateIp"].(string); ip != p.gatewayIP.String() {
		t.Fatalf("the gateway instance's address %q is not the tunnel plan's %s", ip, p.gatewayIP)
	}
	gwRole := a.roles[s.gatewayRole(t)]
	// Woken at a scale-up, a gateway is never at its first boot: that was at `pulumi up`.
	v.gateway = newBoxGateway(ctx, t, p, "burst-gw", true, gatewayInstance{id: v.gatewayID, ec2: a.url,
		role: &gwRole, router: v.router, installed: true})
	for _, cidr := range p.onPremCIDRs {
		v.router.routeVia(t, cidr, p.gatewayIP.String())
	}
	v.gateway.tn.upOnPrem(ctx, t, false)

	api, err := netip.ParseAddr(v.api.Host)
	if err != nil || !slices.ContainsFunc(p.onPremCIDRs, func(c netip.Prefix) bool { return c.Contains(api) }) {
		t.Fatalf("the dev stack's apiServerEndpoint %s is no address in its onPremCidrs %v", v.api, p.onPremCIDRs)
	}
	if api != v.gateway.tn.lanIP {
		v.gateway.tn.onprem.must(ctx, t, "ip", "addr", "add", api.String()+"/32", "dev", "lo")
	}
	forwardIntoNetnsFile(t, "/run/netns/"+string(v.gateway.tn.onprem), v.api.String(),
		strings.TrimPrefix(c.Server, "https://"))
	return v
}

// renderNodeUserData renders the pool's user data as the stack does, endpoint included, with the gateway to wake.
func (v *vpcWithGateway) renderNodeUserData(ctx context.Context, t *testing.T, c cluster, cfg *config.Config,
	pool config.NodePool, param string) []byte {
	t.Helper()
	node, render := infra.NodeConfig(cfg, pool, []string{clusterInfoCAHash(ctx, t, c)}, param)
	node.GatewayInstanceID = v.gatewayID
	userData, err := cloudinit.Node(node, render)
	assert.NilError(t, err, "render user data")
	return userData
}

// serveClusterInfo makes kube-public/cluster-info name the API server at the on-prem endpoint, as a kubeadm
// cluster whose controlPlaneEndpoint it is would (kubeadm join uses that server after discovery), until the test
// ends. The control plane's certificate names that address (hack/start-kube.sh).
func (v *vpcWithGateway) serveClusterInfo(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	loopback := c.Server
	setClusterInfoServer(ctx, t, c, "https://"+v.api.String())
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		setClusterInfoServer(cctx, t, c, loopback)
	})
}

// setClusterInfoServer rewrites the server of cluster-info's kubeconfig and waits for the bootstrap signer to sign
// the new content for the box token (discovery verifies that signature).
func setClusterInfoServer(ctx context.Context, t *testing.T, c cluster, server string) {
	t.Helper()
	var cm map[string]any
	assert.NilError(t, c.getJSON(ctx, &cm, "configmap.v1.", "cluster-info", "-n", "kube-public"))
	data, _ := cm["data"].(map[string]any)
	kc, _ := data["kubeconfig"].(string)
	var doc map[string]any
	assert.NilError(t, yaml.Unmarshal([]byte(kc), &doc), "cluster-info's kubeconfig")
	clusters, _ := doc["clusters"].([]any)
	if len(clusters) != 1 {
		t.Fatalf("cluster-info's kubeconfig has %d clusters, want 1", len(clusters))
	}
	entry, _ := clusters[0].(map[string]any)
	cl, _ := entry["cluster"].(map[string]any)
	if cl["server"] == server {
		return
	}
	cl["server"] = server
	out, err := yaml.Marshal(doc)
	assert.NilError(t, err)
	sig := "jws-kubeconfig-" + boxTokenID
	before, _ := data[sig].(string)
	data["kubeconfig"] = string(out)
	kubectlJSON(ctx, t, c, "replace", map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{
		"name": "cluster-info", "namespace": "kube-public"}, "data": data})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		var now struct {
			Data map[string]string `json:"data"`
		}
		if err := c.getJSON(ctx, &now, "configmap.v1.", "cluster-info", "-n", "kube-public"); err == nil &&
			now.Data[sig] != "" && now.Data[sig] != before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster-info not signed again for token %s within 30 s of naming %s", boxTokenID, server)
		}
	}
}

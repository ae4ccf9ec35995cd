// Package check is cmd/check: the preflight of the on-prem side. It checks what the README's on-prem steps ask of
// the cluster (the kubeadm roles the stack binds to, the ranges kubeadm-config states, the CNI's encapsulation,
// masquerading and MTU where its config says them, a node for the in-cluster parts) and, on the on-prem peer, of
// the host (the VPC's route into the tunnel, the tunnel's and the CNI devices' MTU, the last handshake). Each
// failure says what to change.
package check

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/dynk8s/dynk8s/cmd/internal/wgpeer"
	"github.com/dynk8s/dynk8s/infra/config"
)

// Status is a check's outcome.
type Status string

const (
	// OK is a check whose step holds.
	OK Status = "ok"
	// Fail is a check whose step does not hold; Fix says what to change.
	Fail Status = "fail"
	// Warn is a check whose step does not hold in a way that works, at a cost Detail names.
	Warn Status = "warn"
	// Skip is a check that could not be made from here (Detail says why; nothing is wrong that check knows of).
	Skip Status = "skip"
)

// Result is one check.
type Result struct {
	Check  string `json:"check"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Report is every check, in the order they ran.
type Report struct {
	Stack   string   `json:"stack"`
	Results []Result `json:"results"`
}

// Failed says whether any check failed.
func (r Report) Failed() bool {
	for _, res := range r.Results {
		if res.Status == Fail {
			return true
		}
	}
	return false
}

// Route is the route a host takes to an address, as `ip route get` says it.
type Route struct {
	// Dev is the interface, Via the next hop ("" when on-link).
	Dev string `json:"dev"`
	Via string `json:"gateway,omitempty"`
}

// Host is this host's network: its routes and interfaces.
type Host interface {
	// RouteTo is the route to addr; an error when there is none (unreachable).
	RouteTo(ctx context.Context, addr netip.Addr) (Route, error)
	// MTU is the interface's MTU; ok is false when it does not exist.
	MTU(name string) (mtu int, ok bool, err error)
}

// WireGuard lists this host's WireGuard interfaces; wgctrl's client satisfies it.
type WireGuard interface {
	Devices() ([]*wgtypes.Device, error)
}

// Sources are what check reads: the cluster with the operator's kubeconfig, this host. A nil one leaves its
// checks skipped, with the error beside it as the reason.
type Sources struct {
	Kube           kubernetes.Interface
	Dynamic        dynamic.Interface
	KubeError      error
	Host           Host
	WireGuard      WireGuard
	WireGuardError error
}

// Input is what is checked against.
type Input struct {
	Stack  string
	Config *config.Config
	// Interface is the on-prem peer's WireGuard interface ("": the one whose peer routes the VPC).
	Interface string
	// Peer is the on-prem peer's address, to check a host that is not the peer routes the VPC to it (invalid:
	// not checked there).
	Peer netip.Addr
	Now  time.Time
}

// callTimeout bounds each read.
const callTimeout = 20 * time.Second

// Run runs every check.
func Run(ctx context.Context, src Sources, in Input) Report {
	r := &Report{Stack: in.Stack, Results: []Result{}}
	c := checker{ctx: ctx, src: src, in: in, r: r}
	c.cluster()
	c.host()
	return *r
}

type checker struct {
	ctx context.Context
	src Sources
	in  Input
	r   *Report
}

func (c *checker) add(name string, s Status, detail, fix string) {
	c.r.Results = append(c.r.Results, Result{Check: name, Status: s, Detail: detail, Fix: fix})
}

func (c *checker) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.ctx, callTimeout)
}

// The roles the stack binds its join token group to (infra/addons nodeBootstrapBindings; README step 4).
var kubeadmRoles = []struct{ kind, name string }{
	{"ClusterRole", "system:node-bootstrapper"},
	{"ClusterRole", "kubeadm:get-nodes"},
	{"Role", "kubeadm:nodes-kubeadm-config"},
	{"Role", "kubeadm:kubelet-config"},
}

// cluster runs the checks that read the cluster.
func (c *checker) cluster() {
	if c.src.Kube == nil {
		reason := "no cluster client"
		if c.src.KubeError != nil {
			reason = c.src.KubeError.Error()
		}
		c.add("cluster", Skip, "the cluster's checks did not run: "+reason,
			"give check the admin kubeconfig (-kubeconfig, $KUBECONFIG)")
		return
	}
	c.roles()
	c.ranges()
	c.onPremNodes()
	c.cni()
}

func (c *checker) roles() {
	rbac := c.src.Kube.RbacV1()
	for _, role := range kubeadmRoles {
		ctx, cancel := c.call()
		var err error
		name := role.kind + " " + role.name
		if role.kind == "ClusterRole" {
			_, err = rbac.ClusterRoles().Get(ctx, role.name, metav1.GetOptions{})
		} else {
			name = role.kind + " kube-system/" + role.name
			_, err = rbac.Roles(metav1.NamespaceSystem).Get(ctx, role.name, metav1.GetOptions{})
		}
		cancel()
		switch {
		case err == nil:
			c.add("kubeadm role", OK, name+" exists", "")
		case apierrors.IsNotFound(err):
			c.add("kubeadm role", Fail, name+" is missing: the stack binds its join token group to it, and a "+
				"pool node's kubeadm join needs it",
				"kubeadm init creates it (its bootstrap-token and upload-config phases): restore it, e.g. with "+
					"`kubeadm init phase bootstrap-token` and `kubeadm init phase upload-config all` on a control plane node")
		default:
			c.add("kubeadm role", Skip, name+": "+err.Error(), "")
		}
	}
}

func (c *checker) ranges() {
	ctx, cancel := c.call()
	defer cancel()
	cm, err := c.src.Kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kubeadm-config", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.add("cluster ranges", Fail, "kube-system/kubeadm-config is missing: pool nodes join with kubeadm, "+
			"which reads it", "dynk8s needs a cluster made with kubeadm init")
		return
	case err != nil:
		c.add("cluster ranges", Skip, "kube-system/kubeadm-config: "+err.Error(), "")
		return
	}
	cc, err := config.ParseClusterConfiguration(cm.Data["ClusterConfiguration"])
	if err != nil {
		c.add("cluster ranges", Fail, "kube-system/kubeadm-config: "+err.Error(), "")
		return
	}
	errs := c.in.Config.CheckClusterNetworking(cc)
	for _, e := range errs {
		c.add("cluster ranges", Fail, e.Error(), fmt.Sprintf("pulumi config set --path %s <the cluster's range>",
			e.Path))
	}
	if len(errs) == 0 {
		pods := cc.Networking.PodSubnet
		if pods == "" {
			pods = "not stated (not compared)"
		}
		c.add("cluster ranges", OK, fmt.Sprintf("kubeadm-config states pods %s, services %s; the stack has %s and %s",
			pods, cc.Networking.ServiceSubnet, c.in.Config.Kubernetes.PodCIDR, c.in.Config.Kubernetes.ServiceCIDR), "")
	}
}

func (c *checker) onPremNodes() {
	ctx, cancel := c.call()
	defer cancel()
	list, err := c.src.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: labelOnPrem})
	if err != nil {
		c.add("in-cluster parts' nodes", Skip, "Nodes: "+err.Error(), "")
		return
	}
	var ready []string
	for _, n := range list.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == "True" {
				ready = append(ready, n.Name)
			}
		}
	}
	switch {
	case len(ready) == 0:
		c.add("in-cluster parts' nodes", Fail, "no Ready Node is labelled "+labelOnPrem+": the autoscaler and the "+
			"controller run only there", "kubectl label node <name> "+labelOnPrem+"=true (two nodes, for the "+
			"controller's two replicas; README step 5)")
	case len(ready) == 1:
		c.add("in-cluster parts' nodes", OK, "one Ready Node is labelled "+labelOnPrem+" ("+ready[0]+"): the "+
			"controller's second replica stays Pending until another is", "")
	default:
		c.add("in-cluster parts' nodes", OK, fmt.Sprintf("%d Ready Nodes are labelled %s", len(ready), labelOnPrem), "")
	}
}

// host runs the checks of this host: the on-prem peer's, where it has the tunnel's interface.
func (c *checker) host() {
	cfg := c.in.Config
	vpc := cfg.Network.VPCCIDR
	var dev *wgtypes.Device
	var peer *wgtypes.Peer
	if c.src.WireGuard == nil {
		c.add("tunnel interface", Skip, fmt.Sprintf("no WireGuard on this host (%v)", c.src.WireGuardError),
			"run check on the on-prem peer, as root")
	} else {
		devices, err := c.src.WireGuard.Devices()
		switch {
		case errors.Is(err, os.ErrPermission):
			c.add("tunnel interface", Skip, "cannot read this host's WireGuard interfaces (not root)",
				"run check as root on the on-prem peer")
		case err != nil:
			c.add("tunnel interface", Skip, "WireGuard interfaces: "+err.Error(), "")
		default:
			var ok bool
			dev, peer, ok = wgpeer.Find(devices, vpc, c.in.Interface)
			if !ok {
				fix := "run check on the on-prem peer, or give -peer ADDR to check this host's route to it"
				if c.in.Interface != "" {
					fix = "the stack's onPremWireGuardConfig has the gateway's peer with AllowedIPs " + vpc.String() +
						": install it as " + c.in.Interface + " (README step 4)"
				}
				c.add("tunnel interface", Skip, "no WireGuard interface on this host has a peer for the VPC "+
					vpc.String(), fix)
			} else {
				c.add("tunnel interface", OK, fmt.Sprintf("%s has the gateway's peer (allowed IPs hold the VPC %s)",
					dev.Name, vpc), "")
			}
		}
	}
	if c.src.Host == nil {
		return
	}
	c.route(dev)
	if dev != nil {
		c.tunnelMTU(dev.Name)
		c.handshake(dev.Name, peer)
	}
	c.cniDevices()
}

// route checks the VPC's route: into the tunnel on the peer, to the peer elsewhere.
func (c *checker) route(dev *wgtypes.Device) {
	vpc := c.in.Config.Network.VPCCIDR
	probe := vpc.Masked().Addr().Next()
	ctx, cancel := c.call()
	rt, err := c.src.Host.RouteTo(ctx, probe)
	cancel()
	switch {
	case dev != nil && err != nil:
		c.add("VPC route", Fail, fmt.Sprintf("no route to the VPC (%s): %v", probe, err),
			fmt.Sprintf("ip route add %s dev %s (wg-quick adds it from the peer's AllowedIPs, unless its Table = off)", vpc, dev.Name))
	case dev != nil && rt.Dev != dev.Name:
		c.add("VPC route", Fail, fmt.Sprintf("the VPC (%s) is routed via %s, not into the tunnel's %s", probe,
			describe(rt), dev.Name),
			fmt.Sprintf("ip route replace %s dev %s (wg-quick adds it from the peer's AllowedIPs; look for a more "+
				"specific route, or Table = off in the wg-quick file)", vpc, dev.Name))
	case dev != nil:
		c.add("VPC route", OK, fmt.Sprintf("the VPC (%s) is routed into %s", vpc, dev.Name), "")
	case !c.in.Peer.IsValid():
		// Not the peer: a route elsewhere is right or wrong by where it leads, which this host cannot see.
	case err != nil:
		c.add("VPC route", Fail, fmt.Sprintf("no route to the VPC (%s): %v", probe, err),
			fmt.Sprintf("ip route add %s via %s (on this host, or on the on-prem router for every host; README step 1)",
				vpc, c.in.Peer))
	case rt.Via != c.in.Peer.String():
		c.add("VPC route", Fail, fmt.Sprintf("the VPC (%s) is routed via %s, not via the on-prem peer %s", probe,
			describe(rt), c.in.Peer),
			fmt.Sprintf("ip route add %s via %s (on this host, or on the on-prem router for every host; README step 1)",
				vpc, c.in.Peer))
	default:
		c.add("VPC route", OK, fmt.Sprintf("the VPC (%s) is routed via the on-prem peer %s", vpc, c.in.Peer), "")
	}
}

func describe(rt Route) string {
	if rt.Via == "" {
		return rt.Dev
	}
	return rt.Via + " on " + rt.Dev
}

// tunnelMTU checks the peer's interface has the stack's tunnel MTU: the gateway's side has it, and a larger one
// on-prem sends packets the gateway's side cannot take whole.
func (c *checker) tunnelMTU(name string) {
	want := c.in.Config.WireGuard.MTU
	mtu, ok, err := c.src.Host.MTU(name)
	switch {
	case err != nil || !ok:
		c.add("tunnel MTU", Skip, fmt.Sprintf("%s: MTU not read (%v)", name, err), "")
	case mtu != want:
		c.add("tunnel MTU", Fail, fmt.Sprintf("%s has MTU %d, the stack's tunnel %d (wireguard.mtu)", name, mtu, want),
			fmt.Sprintf("MTU = %d in the [Interface] of the wg-quick file (the stack's onPremWireGuardConfig has it), "+
				"or ip link set %s mtu %d", want, name, want))
	default:
		c.add("tunnel MTU", OK, fmt.Sprintf("%s has MTU %d, as wireguard.mtu", name, mtu), "")
	}
}

// rejectAfter is WireGuard's REJECT_AFTER_TIME (the WireGuard paper, section 6.1): no session outlives it.
const rejectAfter = 180 * time.Second

func (c *checker) handshake(name string, p *wgtypes.Peer) {
	switch {
	case p.LastHandshakeTime.IsZero():
		c.add("handshake", Skip, name+" has had no handshake with the gateway yet: it sleeps until a pool scales "+
			"up; check again during a burst (or with the gateway started)", "")
	case c.in.Now.Sub(p.LastHandshakeTime) < rejectAfter:
		c.add("handshake", OK, fmt.Sprintf("%s's last handshake was %s ago", name,
			c.in.Now.Sub(p.LastHandshakeTime).Truncate(time.Second)), "")
	default:
		c.add("handshake", Skip, fmt.Sprintf("%s's last handshake was %s ago: the tunnel is down now (a sleeping "+
			"gateway's is); check again during a burst", name, c.in.Now.Sub(p.LastHandshakeTime).Truncate(time.Second)), "")
	}
}

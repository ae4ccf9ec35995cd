package check

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dynk8s/dynk8s/internal/kube"
)

const labelOnPrem = kube.LabelOnPrem

// Encapsulation overheads on an IPv4 underlay, in bytes: what a CNI device's MTU must leave of the tunnel's
// (VXLAN and Geneve: outer IPv4 20, UDP 8, their header 8, inner Ethernet 14; IPIP: outer IPv4 20).
const (
	vxlanOverhead  = 50
	geneveOverhead = 50
	ipipOverhead   = 20
)

// cniDeviceOverheads are the devices the common CNIs create on a node, with the encapsulation each adds: a device's
// MTU plus that must fit the tunnel's.
var cniDeviceOverheads = []struct {
	name     string
	overhead int
}{
	{"flannel.1", vxlanOverhead},      // Flannel's VXLAN backend
	{"vxlan.calico", vxlanOverhead},   // Calico's VXLAN mode
	{"tunl0", ipipOverhead},           // Calico's IPIP mode (and any IPIP)
	{"cilium_vxlan", vxlanOverhead},   // Cilium's VXLAN tunnel
	{"cilium_geneve", geneveOverhead}, // Cilium's Geneve tunnel
}

// cni reads the CNI's configuration where the common CNIs keep it in the cluster: Flannel's net-conf.json, Calico's
// calico-config ConfigMap, IPPools and operator Installation, Cilium's cilium-config.
func (c *checker) cni() {
	found := c.flannel()
	found = c.calico() || found
	found = c.cilium() || found
	if !found {
		c.add("CNI", Skip, "no Flannel, Calico or Cilium configuration found in the cluster: check the README's "+
			"on-prem steps 2 and 3 (MTU, encapsulation, masquerading) by hand", "")
	}
}

// configMap is the ConfigMap's data, nil when it does not exist (or cannot be read: then a Skip says so).
func (c *checker) configMap(namespace, name string) map[string]string {
	ctx, cancel := c.call()
	defer cancel()
	cm, err := c.src.Kube.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		c.add("CNI", Skip, fmt.Sprintf("ConfigMap %s/%s: %v", namespace, name, err), "")
		return nil
	}
	if cm.Data == nil {
		return map[string]string{}
	}
	return cm.Data
}

func (c *checker) tunnelMTUFor(overhead int) int { return c.in.Config.WireGuard.MTU - overhead }

func (c *checker) flannel() bool {
	for _, ns := range []string{"kube-flannel", metav1.NamespaceSystem} {
		data := c.configMap(ns, "kube-flannel-cfg")
		if data == nil {
			continue
		}
		var conf struct {
			Backend struct {
				Type string `json:"Type"`
			} `json:"Backend"`
		}
		if err := json.Unmarshal([]byte(data["net-conf.json"]), &conf); err != nil {
			c.add("CNI encapsulation", Fail, fmt.Sprintf("Flannel: %s/kube-flannel-cfg net-conf.json: %v", ns, err), "")
			return true
		}
		switch typ := strings.ToLower(cmp.Or(conf.Backend.Type, "vxlan")); typ {
		case "vxlan", "wireguard", "ipip":
			c.add("CNI encapsulation", OK, "Flannel's backend is "+typ+": only node addresses cross the tunnel", "")
		default:
			c.add("CNI encapsulation", Fail, "Flannel's backend is "+typ+", which does not encapsulate: pod addresses "+
				"would cross the tunnel, and the gateway drops them", `set "Backend": {"Type": "vxlan"} in net-conf.json `+
				"("+ns+"/kube-flannel-cfg) and restart Flannel (README step 3)")
		}
		c.flannelMasquerade(ns)
		return true
	}
	return false
}

// flannelMasquerade checks Flannel's DaemonSet runs flanneld with --ip-masq.
func (c *checker) flannelMasquerade(ns string) {
	ctx, cancel := c.call()
	defer cancel()
	list, err := c.src.Kube.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		c.add("CNI masquerading", Skip, "Flannel's DaemonSet: "+err.Error(), "")
		return
	}
	for _, ds := range list.Items {
		for _, ctr := range ds.Spec.Template.Spec.Containers {
			args := append(slices.Clone(ctr.Command), ctr.Args...)
			if !slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "flanneld") }) {
				continue
			}
			if slices.Contains(args, "--ip-masq") || slices.Contains(args, "--ip-masq=true") {
				c.add("CNI masquerading", OK, "flanneld runs with --ip-masq ("+ns+"/"+ds.Name+")", "")
			} else {
				c.add("CNI masquerading", Fail, "flanneld runs without --ip-masq ("+ns+"/"+ds.Name+"): pod traffic "+
					"to addresses outside the cluster leaves with pod addresses, which the tunnel does not carry",
					"add --ip-masq to flanneld's args (README step 3)")
			}
			return
		}
	}
	c.add("CNI masquerading", Skip, "no flanneld container found in "+ns+"'s DaemonSets", "")
}

var (
	calicoIPPools      = schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "ippools"}
	calicoInstallation = schema.GroupVersionResource{Group: "operator.tigera.io", Version: "v1", Resource: "installations"}
)

func (c *checker) calico() bool {
	found := false
	if data := c.configMap(metav1.NamespaceSystem, "calico-config"); data != nil {
		found = true
		overhead := vxlanOverhead
		if data["calico_backend"] == "bird" {
			overhead = ipipOverhead // BGP with IPIP; a pool in VXLAN mode takes 50, checked below
		}
		c.mtuSetting("Calico", "veth_mtu in kube-system/calico-config", data["veth_mtu"], overhead)
	}
	if c.src.Dynamic == nil {
		return found
	}
	ctx, cancel := c.call()
	pools, err := c.src.Dynamic.Resource(calicoIPPools).List(ctx, metav1.ListOptions{})
	cancel()
	if err == nil {
		for _, p := range pools.Items {
			found = true
			ipip, _, _ := unstructured.NestedString(p.Object, "spec", "ipipMode")
			vxlan, _, _ := unstructured.NestedString(p.Object, "spec", "vxlanMode")
			nat, _, _ := unstructured.NestedBool(p.Object, "spec", "natOutgoing")
			c.calicoPool("IPPool "+p.GetName(), cmp.Or(ipip, "Never") != "Never" || cmp.Or(vxlan, "Never") != "Never", nat,
				"set the IPPool's vxlanMode (or ipipMode) to Always or CrossSubnet", "set the IPPool's natOutgoing: true")
		}
	}
	ctx, cancel = c.call()
	inst, err := c.src.Dynamic.Resource(calicoInstallation).Get(ctx, "default", metav1.GetOptions{})
	cancel()
	if err == nil {
		found = true
		mtu, _, _ := unstructured.NestedInt64(inst.Object, "spec", "calicoNetwork", "mtu")
		c.mtuSetting("Calico", "spec.calicoNetwork.mtu of the Installation default", strconv.FormatInt(mtu, 10), vxlanOverhead)
		pools, _, _ := unstructured.NestedSlice(inst.Object, "spec", "calicoNetwork", "ipPools")
		for i, p := range pools {
			pool, _ := p.(map[string]any)
			enc, _ := pool["encapsulation"].(string)
			nat, _ := pool["natOutgoing"].(string)
			c.calicoPool(fmt.Sprintf("the Installation's ipPools[%d]", i), cmp.Or(enc, "IPIP") != "None", cmp.Or(nat, "Enabled") == "Enabled",
				"set its encapsulation to VXLAN, VXLANCrossSubnet, IPIP or IPIPCrossSubnet", "set its natOutgoing: Enabled")
		}
	}
	return found
}

func (c *checker) calicoPool(what string, encapsulates, masquerades bool, fixEnc, fixNAT string) {
	if encapsulates {
		c.add("CNI encapsulation", OK, "Calico's "+what+" encapsulates", "")
	} else {
		c.add("CNI encapsulation", Fail, "Calico's "+what+" does not encapsulate: pod addresses would cross the "+
			"tunnel, and the gateway drops them", fixEnc+" (README step 3)")
	}
	if masquerades {
		c.add("CNI masquerading", OK, "Calico's "+what+" masquerades outgoing pod traffic", "")
	} else {
		c.add("CNI masquerading", Fail, "Calico's "+what+" does not masquerade outgoing pod traffic", fixNAT+" (README step 3)")
	}
}

func (c *checker) cilium() bool {
	data := c.configMap(metav1.NamespaceSystem, "cilium-config")
	if data == nil {
		return false
	}
	if data["routing-mode"] == "native" || data["tunnel"] == "disabled" || data["tunnel-protocol"] == "disabled" {
		c.add("CNI encapsulation", Fail, "Cilium routes natively (kube-system/cilium-config): pod addresses would "+
			"cross the tunnel, and the gateway drops them", "set routing-mode: tunnel (tunnel-protocol: vxlan or geneve) (README step 3)")
	} else {
		c.add("CNI encapsulation", OK, "Cilium runs in tunnel mode", "")
	}
	if data["enable-ipv4-masquerade"] == "false" {
		c.add("CNI masquerading", Fail, "Cilium does not masquerade (enable-ipv4-masquerade: false)",
			"set enable-ipv4-masquerade: true (README step 3)")
	} else {
		c.add("CNI masquerading", OK, "Cilium masquerades outgoing pod traffic", "")
	}
	c.mtuSetting("Cilium", "mtu in kube-system/cilium-config", data["mtu"], vxlanOverhead)
	return true
}

// mtuSetting checks a CNI's cluster-wide MTU: set (a detected one takes the EC2 nodes' 9001), and small enough
// that its encapsulation fits the tunnel.
func (c *checker) mtuSetting(cni, where, value string, overhead int) {
	limit := c.tunnelMTUFor(overhead)
	mtu, err := strconv.Atoi(strings.TrimSpace(value))
	switch {
	case err != nil || mtu == 0:
		c.add("CNI MTU", Fail, fmt.Sprintf("%s's MTU is detected (%s is %q): on EC2 nodes it would take the "+
			"interface's 9001", cni, where, value), fmt.Sprintf("set %s to %d or less: wireguard.mtu %d less the "+
			"encapsulation's %d (README step 2)", where, limit, c.in.Config.WireGuard.MTU, overhead))
	case mtu > limit:
		c.add("CNI MTU", Fail, fmt.Sprintf("%s's MTU is %d (%s): with its encapsulation's %d bytes it exceeds the "+
			"tunnel's %d", cni, mtu, where, overhead, c.in.Config.WireGuard.MTU),
			fmt.Sprintf("set %s to %d or less (README step 2)", where, limit))
	default:
		c.add("CNI MTU", OK, fmt.Sprintf("%s's MTU is %d (%s): it fits the tunnel's %d with %d bytes of "+
			"encapsulation", cni, mtu, where, c.in.Config.WireGuard.MTU, overhead), "")
	}
}

// cniDevices checks the MTU of the CNI devices on this host: with its encapsulation, what a device sends must
// fit the tunnel.
func (c *checker) cniDevices() {
	for _, d := range cniDeviceOverheads {
		mtu, ok, err := c.src.Host.MTU(d.name)
		if err != nil || !ok {
			continue
		}
		limit := c.tunnelMTUFor(d.overhead)
		if mtu > limit && d.name == "flannel.1" {
			// Flannel has no MTU setting: flanneld sets its device from the node's interface, less VXLAN's 50.
			c.add("CNI device MTU", Warn, fmt.Sprintf("flannel.1 on this host has MTU %d, which Flannel takes from the "+
				"node's interface (it has no MTU setting): with VXLAN's %d bytes its packets toward the VPC exceed "+
				"the tunnel's %d, and are fragmented on their way (slower, not lost)", mtu, d.overhead,
				c.in.Config.WireGuard.MTU), fmt.Sprintf("a CNI whose MTU can be set cluster-wide (Calico, Cilium) at "+
				"%d avoids it", limit))
			continue
		}
		if mtu > limit {
			c.add("CNI device MTU", Fail, fmt.Sprintf("%s on this host has MTU %d: with its encapsulation's %d bytes "+
				"it exceeds the tunnel's %d", d.name, mtu, d.overhead, c.in.Config.WireGuard.MTU),
				fmt.Sprintf("set the CNI's MTU to %d or less, cluster-wide (README step 2)", limit))
		} else {
			c.add("CNI device MTU", OK, fmt.Sprintf("%s on this host has MTU %d, within the tunnel's %d less %d",
				d.name, mtu, c.in.Config.WireGuard.MTU, d.overhead), "")
		}
	}
}

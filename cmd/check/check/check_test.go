package check

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func devConfig(t *testing.T) *config.Config {
	t.Helper()
	sc, err := config.LoadStackFile("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	cfg, err := config.ParseValues(sc.Values)
	assert.NilError(t, err)
	return cfg
}

// fakeHost answers routes by destination and MTUs by interface.
type fakeHost struct {
	route    Route
	routeErr error
	mtu      map[string]int
}

func (h *fakeHost) RouteTo(context.Context, netip.Addr) (Route, error) { return h.route, h.routeErr }

func (h *fakeHost) MTU(name string) (int, bool, error) {
	m, ok := h.mtu[name]
	return m, ok, nil
}

type fakeWireGuard struct {
	devices []*wgtypes.Device
	err     error
}

func (f fakeWireGuard) Devices() ([]*wgtypes.Device, error) { return f.devices, f.err }

// site is the on-prem side as check sees it; newSite is a healthy one: a kubeadm cluster with Flannel (VXLAN,
// --ip-masq), two on-prem nodes labelled, and this host the on-prem peer.
type site struct {
	kube    []runtime.Object
	dynamic []runtime.Object
	host    *fakeHost
	wg      *fakeWireGuard
	noKube  error
	peer    netip.Addr
}

func kubeadmConfig(pods, services string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kubeadm-config"},
		Data: map[string]string{"ClusterConfiguration": fmt.Sprintf("apiVersion: kubeadm.k8s.io/v1beta4\n"+
			"kind: ClusterConfiguration\nkubernetesVersion: v1.34.4\nnetworking:\n  podSubnet: %s\n  serviceSubnet: %s\n",
			pods, services)}}
}

func onPremNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelOnPrem: "true"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

func flannelConfig(backend string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-flannel", Name: "kube-flannel-cfg"},
		Data: map[string]string{"net-conf.json": `{"Network": "10.244.0.0/16", "Backend": {"Type": "` + backend + `"}}`}}
}

func flannelDaemonSet(args ...string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-flannel", Name: "kube-flannel-ds"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "kube-flannel", Command: []string{"/opt/bin/flanneld"}, Args: args}}}}}}
}

func peerDevice(handshake time.Duration) *wgtypes.Device {
	_, vpc, _ := net.ParseCIDR("10.200.0.0/16")
	p := wgtypes.Peer{AllowedIPs: []net.IPNet{*vpc}}
	if handshake >= 0 {
		p.LastHandshakeTime = now.Add(-handshake)
	}
	return &wgtypes.Device{Name: "dynk8s", Peers: []wgtypes.Peer{p}}
}

func newSite() *site {
	var objs []runtime.Object
	for _, r := range kubeadmRoles {
		if r.kind == "ClusterRole" {
			objs = append(objs, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: r.name}})
		} else {
			objs = append(objs, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: r.name}})
		}
	}
	objs = append(objs, kubeadmConfig("10.244.0.0/16", "10.96.0.0/12"), onPremNode("cp-1"), onPremNode("worker-1"),
		flannelConfig("vxlan"), flannelDaemonSet("--ip-masq", "--kube-subnet-mgr"))
	return &site{kube: objs,
		host: &fakeHost{route: Route{Dev: "dynk8s"}, mtu: map[string]int{"dynk8s": 1420, "flannel.1": 1370, "eth0": 1500}},
		wg:   &fakeWireGuard{devices: []*wgtypes.Device{{Name: "wg-home"}, peerDevice(30 * time.Second)}}}
}

func (s *site) run(t *testing.T, cfg *config.Config) Report {
	t.Helper()
	src := Sources{Host: s.host, WireGuard: s.wg, KubeError: s.noKube}
	if s.noKube == nil {
		src.Kube = fake.NewClientset(s.kube...)
		scheme := runtime.NewScheme()
		src.Dynamic = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
			calicoIPPools: "IPPoolList", calicoInstallation: "InstallationList"}, s.dynamic...)
	}
	return Run(context.Background(), src, Input{Stack: "dev", Config: cfg, Peer: s.peer, Now: now})
}

// failures are the failed checks, "check: detail | fix".
func failures(r Report) []string {
	out := []string{}
	for _, res := range r.Results {
		if res.Status == Fail {
			out = append(out, res.Check+": "+res.Detail+" | "+res.Fix)
		}
	}
	return out
}

func has(r Report, status Status, check, detail string) bool {
	for _, res := range r.Results {
		if res.Status == status && res.Check == check && strings.Contains(res.Detail, detail) {
			return true
		}
	}
	return false
}

// TestCheckHealthySite: a site that follows the README's steps passes every check there is a source for.
func TestCheckHealthySite(t *testing.T) {
	cfg := devConfig(t)
	r := newSite().run(t, cfg)
	assert.DeepEqual(t, failures(r), []string{})
	for _, want := range []struct{ check, detail string }{
		{"kubeadm role", "ClusterRole kubeadm:get-nodes exists"},
		{"kubeadm role", "Role kube-system/kubeadm:kubelet-config exists"},
		{"cluster ranges", "kubeadm-config states pods 10.244.0.0/16, services 10.96.0.0/12"},
		{"in-cluster parts' nodes", "2 Ready Nodes are labelled"},
		{"CNI encapsulation", "Flannel's backend is vxlan"},
		{"CNI masquerading", "flanneld runs with --ip-masq"},
		{"tunnel interface", "dynk8s has the gateway's peer"},
		{"VPC route", "the VPC (10.200.0.0/16) is routed into dynk8s"},
		{"tunnel MTU", "dynk8s has MTU 1420"},
		{"handshake", "last handshake was 30s ago"},
		{"CNI device MTU", "flannel.1 on this host has MTU 1370"},
	} {
		assert.Check(t, has(r, OK, want.check, want.detail), "want ok %s: %s in %+v", want.check, want.detail, r.Results)
	}
	assert.Check(t, !r.Failed())
}

// TestCheckFindsWhatToChange: each misstep of the README's on-prem steps fails its check with what to change.
func TestCheckFindsWhatToChange(t *testing.T) {
	cfg := devConfig(t)
	for _, c := range []struct {
		name   string
		change func(*site)
		want   []string
	}{{
		name: "a kubeadm role missing",
		change: func(s *site) {
			s.kube = append(s.kube[:1:1], s.kube[2:]...)
		},
		want: []string{"kubeadm role: ClusterRole kubeadm:get-nodes is missing: the stack binds its join token group to it, " +
			"and a pool node's kubeadm join needs it | kubeadm init creates it (its bootstrap-token and upload-config " +
			"phases): restore it, e.g. with `kubeadm init phase bootstrap-token` and `kubeadm init phase upload-config " +
			"all` on a control plane node"},
	}, {
		name: "another pod range",
		change: func(s *site) {
			s.kube[4] = kubeadmConfig("10.32.0.0/12", "10.96.0.0/12")
		},
		want: []string{"cluster ranges: dynk8s:kubernetes.podCidr: is 10.244.0.0/16, but the cluster's networking.podSubnet " +
			"is 10.32.0.0/12 (kube-system/kubeadm-config): set it to the cluster's, so that the checks that the stack's " +
			"ranges do not overlap it see the range the cluster uses | pulumi config set --path dynk8s:kubernetes.podCidr " +
			"<the cluster's range>"},
	}, {
		name: "not a kubeadm cluster",
		change: func(s *site) {
			s.kube = append(s.kube[:4:4], s.kube[5:]...)
		},
		want: []string{"cluster ranges: kube-system/kubeadm-config is missing: pool nodes join with kubeadm, which reads " +
			"it | dynk8s needs a cluster made with kubeadm init"},
	}, {
		name: "no node for the in-cluster parts",
		change: func(s *site) {
			s.kube = append(s.kube[:5:5], s.kube[7:]...)
		},
		want: []string{"in-cluster parts' nodes: no Ready Node is labelled node-restriction.kubernetes.io/dynk8s-onprem: " +
			"the autoscaler and the controller run only there | kubectl label node <name> " +
			"node-restriction.kubernetes.io/dynk8s-onprem=true (two nodes, for the controller's two replicas; README step 5)"},
	}, {
		name: "Flannel host-gw, without --ip-masq",
		change: func(s *site) {
			s.kube[7], s.kube[8] = flannelConfig("host-gw"), flannelDaemonSet("--kube-subnet-mgr")
		},
		want: []string{"CNI encapsulation: Flannel's backend is host-gw, which does not encapsulate: pod addresses would " +
			"cross the tunnel, and the gateway drops them | set \"Backend\": {\"Type\": \"vxlan\"} in net-conf.json " +
			"(kube-flannel/kube-flannel-cfg) and restart Flannel (README step 3)",
			"CNI masquerading: flanneld runs without --ip-masq (kube-flannel/kube-flannel-ds): pod traffic to addresses " +
				"outside the cluster leaves with pod addresses, which the tunnel does not carry | add --ip-masq to " +
				"flanneld's args (README step 3)"},
	}, {
		name: "Calico's manifests: detected MTU, a pool that neither encapsulates nor masquerades",
		change: func(s *site) {
			s.kube = append(s.kube[:7:7], &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system",
				Name: "calico-config"}, Data: map[string]string{"veth_mtu": "0", "calico_backend": "vxlan"}})
			s.dynamic = []runtime.Object{&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool", "metadata": map[string]any{"name": "default-ipv4-ippool"},
				"spec": map[string]any{"cidr": "10.244.0.0/16", "ipipMode": "Never", "vxlanMode": "Never", "natOutgoing": false}}}}
		},
		want: []string{"CNI MTU: Calico's MTU is detected (veth_mtu in kube-system/calico-config is \"0\"): on EC2 nodes " +
			"it would take the interface's 9001 | set veth_mtu in kube-system/calico-config to 1370 or less: wireguard.mtu " +
			"1420 less the encapsulation's 50 (README step 2)",
			"CNI encapsulation: Calico's IPPool default-ipv4-ippool does not encapsulate: pod addresses would cross the " +
				"tunnel, and the gateway drops them | set the IPPool's vxlanMode (or ipipMode) to Always or CrossSubnet (README step 3)",
			"CNI masquerading: Calico's IPPool default-ipv4-ippool does not masquerade outgoing pod traffic | set the " +
				"IPPool's natOutgoing: true (README step 3)"},
	}, {
		name: "Calico's operator: an MTU too large for the tunnel",
		change: func(s *site) {
			s.kube = s.kube[:7:7]
			s.dynamic = []runtime.Object{&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "operator.tigera.io/v1", "kind": "Installation", "metadata": map[string]any{"name": "default"},
				"spec": map[string]any{"calicoNetwork": map[string]any{"mtu": int64(1450),
					"ipPools": []any{map[string]any{"cidr": "10.244.0.0/16", "encapsulation": "VXLANCrossSubnet", "natOutgoing": "Enabled"}}}}}}}
		},
		want: []string{"CNI MTU: Calico's MTU is 1450 (spec.calicoNetwork.mtu of the Installation default): with its " +
			"encapsulation's 50 bytes it exceeds the tunnel's 1420 | set spec.calicoNetwork.mtu of the Installation " +
			"default to 1370 or less (README step 2)"},
	}, {
		name: "Cilium routing natively",
		change: func(s *site) {
			s.kube = append(s.kube[:7:7], &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system",
				Name: "cilium-config"}, Data: map[string]string{"routing-mode": "native", "mtu": "1370"}})
		},
		want: []string{"CNI encapsulation: Cilium routes natively (kube-system/cilium-config): pod addresses would cross " +
			"the tunnel, and the gateway drops them | set routing-mode: tunnel (tunnel-protocol: vxlan or geneve) (README step 3)"},
	}, {
		name: "the VPC not routed into the tunnel",
		change: func(s *site) {
			s.host.route = Route{Dev: "eth0", Via: "192.168.10.1"}
		},
		want: []string{"VPC route: the VPC (10.200.0.1) is routed via 192.168.10.1 on eth0, not into the tunnel's dynk8s | " +
			"ip route replace 10.200.0.0/16 dev dynk8s (wg-quick adds it from the peer's AllowedIPs; look for a more " +
			"specific route, or Table = off in the wg-quick file)"},
	}, {
		name: "no route to the VPC",
		change: func(s *site) {
			s.host.routeErr = errors.New("ip route get 10.200.0.1: RTNETLINK answers: Network is unreachable")
		},
		want: []string{"VPC route: no route to the VPC (10.200.0.1): ip route get 10.200.0.1: RTNETLINK answers: Network " +
			"is unreachable | ip route add 10.200.0.0/16 dev dynk8s (wg-quick adds it from the peer's AllowedIPs, unless " +
			"its Table = off)"},
	}, {
		name: "the tunnel's and a CNI device's MTU too large",
		change: func(s *site) {
			s.host.mtu["dynk8s"], s.host.mtu["vxlan.calico"] = 1500, 1450
		},
		want: []string{"tunnel MTU: dynk8s has MTU 1500, the stack's tunnel 1420 (wireguard.mtu) | MTU = 1420 in the " +
			"[Interface] of the wg-quick file (the stack's onPremWireGuardConfig has it), or ip link set dynk8s mtu 1420",
			"CNI device MTU: vxlan.calico on this host has MTU 1450: with its encapsulation's 50 bytes it exceeds the " +
				"tunnel's 1420 | set the CNI's MTU to 1370 or less, cluster-wide (README step 2)"},
	}, {
		name: "another on-prem host that routes the VPC elsewhere than the peer",
		change: func(s *site) {
			s.wg.devices = s.wg.devices[:1]
			s.peer = netip.MustParseAddr("192.168.10.2")
			s.host.route = Route{Dev: "eth0", Via: "192.168.10.1"}
		},
		want: []string{"VPC route: the VPC (10.200.0.1) is routed via 192.168.10.1 on eth0, not via the on-prem peer " +
			"192.168.10.2 | ip route add 10.200.0.0/16 via 192.168.10.2 (on this host, or on the on-prem router for " +
			"every host; README step 1)"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			s := newSite()
			c.change(s)
			r := s.run(t, cfg)
			assert.DeepEqual(t, failures(r), c.want)
			assert.Check(t, r.Failed())
		})
	}
}

// TestCheckSkipsWhatItCannotSee: what check cannot read is skipped with the reason, and what works at a cost is a
// warning, neither a failure.
func TestCheckSkipsWhatItCannotSee(t *testing.T) {
	cfg := devConfig(t)
	for _, c := range []struct {
		name          string
		change        func(*site)
		check, detail string
	}{
		{"no cluster", func(s *site) { s.noKube = errors.New("kubeconfig: no configuration") },
			"cluster", "the cluster's checks did not run: kubeconfig: no configuration"},
		{"not root", func(s *site) { s.wg.err = fmt.Errorf("open /var/run/wireguard: %w", os.ErrPermission) },
			"tunnel interface", "not root"},
		{"not the peer, no -peer", func(s *site) { s.wg.devices = s.wg.devices[:1] },
			"tunnel interface", "no WireGuard interface on this host has a peer for the VPC 10.200.0.0/16"},
		{"the gateway asleep", func(s *site) { s.wg.devices[1] = peerDevice(time.Hour) },
			"handshake", "last handshake was 1h0m0s ago: the tunnel is down now"},
		{"never a handshake", func(s *site) { s.wg.devices[1] = peerDevice(-1) },
			"handshake", "no handshake with the gateway yet"},
		{"Flannel's device from a 1500 LAN is a warning: Flannel has no MTU setting", func(s *site) { s.host.mtu["flannel.1"] = 1450 },
			"CNI device MTU", "flannel.1 on this host has MTU 1450"},
		{"no CNI known", func(s *site) { s.kube = s.kube[:7] },
			"CNI", "no Flannel, Calico or Cilium configuration found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSite()
			c.change(s)
			r := s.run(t, cfg)
			assert.DeepEqual(t, failures(r), []string{})
			assert.Check(t, has(r, Skip, c.check, c.detail) || has(r, Warn, c.check, c.detail),
				"want skip or warn %s: %s in %+v", c.check, c.detail, r.Results)
		})
	}
}

// TestLinuxHost reads MTUs as /sys/class/net has them, and the answer of `ip -json route get`.
func TestLinuxHost(t *testing.T) {
	dir := t.TempDir()
	assert.NilError(t, os.MkdirAll(filepath.Join(dir, "dynk8s"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "dynk8s", "mtu"), []byte("1420\n"), 0o644))
	h := LinuxHost{SysClassNet: dir}
	mtu, ok, err := h.MTU("dynk8s")
	assert.NilError(t, err)
	assert.Check(t, ok)
	assert.Check(t, is.Equal(mtu, 1420))
	_, ok, err = h.MTU("eth9")
	assert.NilError(t, err)
	assert.Check(t, !ok)
	_, _, err = h.MTU("../etc")
	assert.ErrorContains(t, err, "not an interface name")

	// iproute2 6.1's answers, on-link and through a gateway.
	rt, err := parseRouteGet([]byte(`[{"dst":"10.200.0.1","dev":"dynk8s","prefsrc":"10.201.0.2","flags":[],"uid":0,"cache":[]}]`))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(rt, Route{Dev: "dynk8s"}))
	rt, err = parseRouteGet([]byte(`[{"dst":"10.200.0.1","gateway":"192.168.10.2","dev":"eth0","prefsrc":"192.168.10.5","flags":[],"uid":0,"cache":[]}]`))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(rt, Route{Dev: "eth0", Via: "192.168.10.2"}))
	_, err = parseRouteGet([]byte(`[]`))
	assert.ErrorContains(t, err, "unexpected answer")
}

package cloudinit

import (
	"encoding/base64"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

const testCAHash = "sha256:8a3d1c2f0e9b7a6554433221100ffeeddccbbaa99887766554433221100ffee0"

// pool is a pool as the renderer takes it: node.json's pool values (as infra.NodeConfig builds them) and what the
// user data holds beside it.
type pool struct {
	node   nodeconfig.Node
	render NodeRender
}

// render is Node of the pool.
func (p pool) userData() ([]byte, error) { return Node(p.node, p.render) }

// generalPool is an x86_64 on-demand pool with one label of its own; spotPool an arm64 spot pool with a taint. The
// architecture does not change the user data (dnf picks $basearch), so the two differ in labels and taints.
func generalPool() pool {
	return pool{
		node: nodeconfig.Node{
			APIServerEndpoint:  endpoint.HostPort{Host: "192.168.10.10", Port: 6443},
			JoinTokenParameter: "/dynk8s/homelab/join-token",
			ClusterName:        "homelab",
			PoolName:           "general",
			Join: nodeconfig.Join{CACertHashes: []string{testCAHash}, Labels: map[string]string{
				"dynk8s.io/pool":          "general",
				"dynk8s.io/capacity-type": "on-demand",
			}},
			Host: nodeconfig.Host{
				OnPremCIDRs:  []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")},
				TunnelMTU:    1420,
				MetadataUIDs: []int{1000},
			},
		},
		render: NodeRender{
			KubernetesVersion: kube.Version{Major: 1, Minor: 34, Patch: 4},
			Agent: &Agent{Bucket: testAgentBucket, Key: "dynk8s-node/linux-amd64", VersionID: testAgentVersion,
				SHA256: testAgentSHA256},
		},
	}
}

const (
	testAgentBucket  = "dynk8s-homelab-agent-20261201153000000000000001"
	testAgentVersion = "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"
	// testAgentSHA256 is the sha256 of testAgentBinary.
	testAgentSHA256 = "cfe47477f1307f09463fd0848ab7a1a5524f2b62cd6c64c6fb332e4c03d26cb4"
)

func spotPool() pool {
	in := generalPool()
	in.node.PoolName = "spot-arm64"
	in.node.Join.Labels = map[string]string{
		"dynk8s.io/pool":               "spot-arm64",
		"dynk8s.io/capacity-type":      "spot",
		"node.kubernetes.io/lifecycle": "spot",
	}
	in.node.Join.Taints = []kube.Taint{{Key: "dynk8s.io/capacity-type", Value: "spot", Effect: "NoSchedule"}}
	in.render.DNS = OnPremDNS{Servers: []netip.Addr{netip.MustParseAddr("192.168.10.53"),
		netip.MustParseAddr("192.168.11.53")}, Domains: []string{"corp.example.com", "lab.example.net"}}
	in.render.Agent = &Agent{Bucket: testAgentBucket, Key: "dynk8s-node/linux-arm64", VersionID: testAgentVersion,
		SHA256: testAgentSHA256}
	return in
}

func TestNodeGolden(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]pool{"general": generalPool(), "spot-arm64": spotPool()} {
		t.Run(name, func(t *testing.T) {
			ud, err := in.userData()
			assert.NilError(t, err)
			golden.Assert(t, stubScripts(t, ud), "node-"+name+".golden")
		})
	}
}

func TestNodeIsDeterministic(t *testing.T) {
	t.Parallel()
	a, err := spotPool().userData()
	assert.NilError(t, err)
	b, err := spotPool().userData()
	assert.NilError(t, err)
	assert.DeepEqual(t, a, b)

	// The same labels, taints and hashes built in another order render the same bytes.
	in := spotPool()
	in.node.Join.Labels = map[string]string{}
	for _, k := range []string{"node.kubernetes.io/lifecycle", "dynk8s.io/pool", "dynk8s.io/capacity-type"} {
		in.node.Join.Labels[k] = spotPool().node.Join.Labels[k]
	}
	in.node.Join.CACertHashes = []string{"sha256:" + strings.Repeat("1", 64), testCAHash}
	in.node.Join.Taints = []kube.Taint{{Key: "z.example.com/b", Value: "", Effect: "NoExecute"}, {Key: "a.example.com/a", Value: "x", Effect: "NoSchedule"}}
	rev := in
	rev.node.Join.CACertHashes = []string{testCAHash, "sha256:" + strings.Repeat("1", 64)}
	rev.node.Join.Taints = []kube.Taint{in.node.Join.Taints[1], in.node.Join.Taints[0]}
	c, err := in.userData()
	assert.NilError(t, err)
	d, err := rev.userData()
	assert.NilError(t, err)
	assert.DeepEqual(t, c, d)
}

// The user data parses back into the renderer's types, and each document it carries parses as what it claims to be.
func TestNodeRoundTrip(t *testing.T) {
	t.Parallel()
	ud, err := spotPool().userData()
	assert.NilError(t, err)
	cc := parseCloudConfig(t, ud)

	assert.DeepEqual(t, cc.RunCmd, [][]string{
		{"systemctl", "enable", "--no-reload", "dynk8s-onprem-routes.service", "dynk8s-join.service", "dynk8s-agent.service"},
		{"systemctl", "start", "dynk8s-agent.service"},
		{"systemctl", "start", "dynk8s-onprem-routes.service"},
		{"systemctl", "try-reload-or-restart", "NetworkManager.service"},
		{"systemctl", "try-restart", "systemd-resolved.service"},
		{"systemctl", "start", "dynk8s-join.service"},
		{"sh", "-c", "! systemctl is-failed --quiet dynk8s-onprem-routes.service dynk8s-join.service dynk8s-imds-lock.service " +
			"dynk8s-agent.service"}})
	assert.Check(t, is.Len(cc.Packages, 0), "packages are installed by the agent, under its deadline")
	for id, r := range cc.YumRepos {
		assert.Check(t, r.GPGCheck, "%s: gpgcheck off", id)
		assert.Check(t, !r.Enabled, "%s: enabled globally; a dnf upgrade could move the pinned packages", id)
		assert.Check(t, strings.HasPrefix(r.BaseURL, "https://") && strings.Contains(r.BaseURL, "v1.34"), "%s: %s", id, r.BaseURL)
		assert.Check(t, is.Equal(r.GPGKey, r.BaseURL+"repodata/repomd.xml.key"))
		assert.Check(t, is.Equal(r.Priority, 1), "%s: a Fedora package of the same name could win on version", id)
	}
	assert.Check(t, is.Len(cc.YumRepos, 2))

	cfg := nodeJSON(t, cc)
	assert.Check(t, is.DeepEqual(cfg.Packages, []string{"kubelet-1.34.4", "kubeadm-1.34.4", "cri-tools-1.34.*", "cri-o-1.34.*"}))
	assert.Check(t, is.Equal(cfg.JoinTokenParameter, "/dynk8s/homelab/join-token"))
	assert.Check(t, is.DeepEqual(cfg.Repos, []string{"dynk8s-kubernetes", "dynk8s-cri-o"}))
	// The metadata lockdown's nft is installed where the image lacks it, from the release repository first.
	assert.Check(t, is.DeepEqual(cfg.SystemPackages, []string{"container-selinux", "iptables", "nftables"}))
	assert.Check(t, is.DeepEqual(cfg.SystemRepos, []string{"fedora"}))
	assert.Check(t, is.DeepEqual(cfg.UpdateRepos, []string{"updates"}))
	assert.Check(t, is.DeepEqual(cfg.PrePullImages, []string{"registry.k8s.io/pause:3.10.1", "registry.k8s.io/kube-proxy:v1.34.4"}))
	assert.Check(t, is.Equal(cfg.LaunchHook, ""), "no warm pool, no launch hook")
	assert.Check(t, is.DeepEqual(cfg.KernelModules, []string{"overlay", "br_netfilter"}))
	assert.Check(t, is.Equal(cfg.CRISocket, "unix:///var/run/crio/crio.sock"))
	assert.Check(t, is.Equal(cfg.Deadlines, nodeconfig.DefaultDeadlines))

	crio := fileByPath(t, cc, "/etc/crio/crio.conf.d/90-dynk8s.conf").Content
	for _, want := range []string{`pause_image = "registry.k8s.io/pause:3.10.1"`, `cgroup_manager = "systemd"`,
		`plugin_dirs = ["/opt/cni/bin", "/usr/libexec/cni"]`} {
		assert.Check(t, is.Contains(crio, want))
	}
	assert.Check(t, is.Equal(fileByPath(t, cc, "/etc/modules-load.d/dynk8s.conf").Content, "overlay\nbr_netfilter\n"))
	sysctl := fileByPath(t, cc, "/etc/sysctl.d/90-dynk8s.conf").Content
	for _, want := range []string{"net.ipv4.ip_forward = 1", "net.bridge.bridge-nf-call-iptables = 1", "net.bridge.bridge-nf-call-ip6tables = 1"} {
		assert.Check(t, is.Contains(sysctl, want))
	}
	unit := fileByPath(t, cc, "/etc/systemd/system/dynk8s-join.service").Content
	assert.Check(t, is.Contains(unit, "ConditionPathExists=!/etc/kubernetes/kubelet.conf\n"))
	assert.Check(t, is.Contains(unit, "ExecStart=/usr/local/bin/dynk8s-node join --config /etc/dynk8s/node.json\n"))
	// The unit's hard timeout is the agent's deadline and its slack.
	assert.Check(t, is.Contains(unit, "TimeoutStartSec=840s\n"))
	// The labels the agent sets from IMDS are those kube's list says the boot sets.
	assert.Check(t, is.DeepEqual(slices.Sorted(maps.Keys(nodeconfig.RuntimeLabels(nodeconfig.Identity{}))),
		slices.Sorted(slices.Values(kube.SetByBoot()))))

	jc := nodetest.ParseJoinConfig(t, testJoinConfig(t, cc))
	assert.DeepEqual(t, jc, joinConfiguration{
		APIVersion: "kubeadm.k8s.io/v1beta4",
		Kind:       "JoinConfiguration",
		Discovery: discovery{BootstrapToken: bootstrapTokenDiscovery{
			APIServerEndpoint: "192.168.10.10:6443",
			CACertHashes:      []string{testCAHash},
			Token:             "abcdef.0123456789abcdef",
		}},
		NodeRegistration: nodeRegistration{
			// The Node is named after the instance: the name the CSR approver checks against EC2.
			Name:      "i-0123456789abcdef0",
			CRISocket: "unix:///var/run/crio/crio.sock",
			KubeletExtraArgs: []kubeletArg{
				{Name: "node-ip", Value: "10.100.1.23"},
				{Name: "node-labels", Value: "dynk8s.io/capacity-type=spot,dynk8s.io/pool=spot-arm64," +
					"node.kubernetes.io/instance-type=m7g.large,node.kubernetes.io/lifecycle=spot," +
					"topology.kubernetes.io/region=eu-central-1,topology.kubernetes.io/zone=eu-central-1a"},
				{Name: "provider-id", Value: "aws:///eu-central-1a/i-0123456789abcdef0"},
			},
			Taints: []kube.Taint{{Key: "dynk8s.io/capacity-type", Value: "spot", Effect: "NoSchedule"}},
		},
		Patches: kubeadmPatches{Directory: "/etc/kubernetes/patches"},
	})
}

func TestNodeWithoutTaintsSaysSoExplicitly(t *testing.T) {
	t.Parallel()
	ud, err := generalPool().userData()
	assert.NilError(t, err)
	assert.Check(t, is.Contains(testJoinConfig(t, parseCloudConfig(t, ud)), "  taints: []\n"))
}

// TestNodeBootToleratesTheImage: the join unit runs nothing before the agent, which logs what it does (a kernel
// without br_netfilter, Fedora Cloud's minimal module set, or an unknown sysctl key is the agent's to report, and the
// timer's runs on a waiting warm instance must do nothing else); and NetworkManager leaves the CNI's interfaces
// alone, or it can take their routes and links down, from this first boot on: runcmd has it read the drop-in
// cloud-init wrote after it started, before the join.
func TestNodeBootToleratesTheImage(t *testing.T) {
	t.Parallel()
	ud, err := generalPool().userData()
	assert.NilError(t, err)
	cc := parseCloudConfig(t, ud)
	unit := fileByPath(t, cc, "/etc/systemd/system/"+joinUnitName).Content
	assert.Check(t, !strings.Contains(unit, "ExecStartPre"), "the join unit runs something before the agent:\n%s", unit)
	reload := slices.IndexFunc(cc.RunCmd, func(c []string) bool {
		return slices.Equal(c, []string{"systemctl", "try-reload-or-restart", "NetworkManager.service"})
	})
	join := slices.IndexFunc(cc.RunCmd, func(c []string) bool { return slices.Contains(c, "start") && slices.Contains(c, joinUnitName) })
	assert.Check(t, reload >= 0 && reload < join, "NetworkManager is not reloaded before the join: %v", cc.RunCmd)
	nm := fileByPath(t, cc, "/etc/NetworkManager/conf.d/90-dynk8s-cni.conf").Content
	assert.Check(t, strings.HasPrefix(nm, "[keyfile]\nunmanaged-devices="))
	for _, iface := range []string{"cali*", "tunl*", "vxlan.calico", "flannel*", "cni0", "veth*", "cilium*", "lxc*"} {
		assert.Check(t, is.Contains(nm, "interface-name:"+iface+";"), iface)
	}
}

// The pool's pre-pull images are normalized as the runtime does, pulled once each, after pause and kube-proxy; the
// launch hook's name reaches the boot as it is.
func TestNodePrePullImagesAndLaunchHook(t *testing.T) {
	t.Parallel()
	in := spotPool()
	in.node.PrePullImages = []string{"busybox", "quay.io/jenkins/agent:3.1@sha256:" + strings.Repeat("ab", 32),
		"docker.io/library/busybox:latest", "registry.k8s.io/kube-proxy:v1.34.4"}
	in.node.LaunchHook = "dynk8s-launch"
	ud, err := in.userData()
	assert.NilError(t, err)
	cfg := nodeJSON(t, parseCloudConfig(t, ud))
	assert.Check(t, is.DeepEqual(cfg.PrePullImages, []string{"registry.k8s.io/pause:3.10.1", "registry.k8s.io/kube-proxy:v1.34.4",
		"docker.io/library/busybox:latest", "quay.io/jenkins/agent:3.1@sha256:" + strings.Repeat("ab", 32)}))
	assert.Check(t, is.Equal(cfg.LaunchHook, "dynk8s-launch"))
}

func TestNodePauseImageFollowsKubeadm(t *testing.T) {
	t.Parallel()
	for _, m := range kube.Minors {
		in := generalPool()
		in.render.KubernetesVersion = kube.Version{Major: 1, Minor: m.Minor, Patch: 2}
		ud, err := in.userData()
		assert.NilError(t, err, m.Minor)
		assert.Check(t, is.Contains(string(ud), `pause_image = "registry.k8s.io/pause:`+m.Pause+`"`), m.Minor)
		assert.Check(t, is.Contains(string(ud), "isv:/cri-o:/stable:/v"+m.CRIO+"/rpm/"), m.Minor)
	}
}

func TestNodeValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		modify func(*pool)
		want   []string
	}{
		{"version unset", func(in *pool) { in.render.KubernetesVersion = kube.Version{} }, []string{"KubernetesVersion: version 0.0.0 is not supported"}},
		{"minor too old for v1beta4", func(in *pool) { in.render.KubernetesVersion = kube.Version{Major: 1, Minor: 30, Patch: 2} }, []string{"1.30.2 is not supported"}},
		{"minor unknown", func(in *pool) { in.render.KubernetesVersion = kube.Version{Major: 1, Minor: 38} }, []string{"1.38.0 is not supported"}},
		{"no endpoint", func(in *pool) { in.node.APIServerEndpoint = endpoint.HostPort{} }, []string{"APIServerEndpoint: is required"}},
		{"no CA hash", func(in *pool) { in.node.Join.CACertHashes = nil }, []string{"CACertHashes: at least one is required"}},
		{"CA hash upper case", func(in *pool) { in.node.Join.CACertHashes = []string{strings.ToUpper(testCAHash)} }, []string{"CACertHashes[0]"}},
		{"CA hash twice", func(in *pool) { in.node.Join.CACertHashes = []string{testCAHash, testCAHash} }, []string{"CACertHashes[1]", "listed twice"}},
		{"parameter with space", func(in *pool) { in.node.JoinTokenParameter = "/dynk8s/join token" }, []string{"JoinTokenParameter"}},
		{"parameter reserved", func(in *pool) { in.node.JoinTokenParameter = "/aws/reference/x" }, []string{"reserves names starting with aws"}},
		{"parameter is a token", func(in *pool) { in.node.JoinTokenParameter = "abcdef.0123456789abcdef" }, []string{"looks like a bootstrap token"}},
		{"cluster name", func(in *pool) { in.node.ClusterName = "Home_Lab" }, []string{"ClusterName"}},
		{"gateway id not an instance id", func(in *pool) { in.node.GatewayInstanceID = "gateway" }, []string{"GatewayInstanceID: \"gateway\" is not an EC2 instance id"}},
		{"pool name", func(in *pool) { in.node.PoolName = "" }, []string{"PoolName"}},
		{"pool label missing", func(in *pool) { delete(in.node.Join.Labels, kube.LabelPool) }, []string{"dynk8s.io/pool must be the pool name"}},
		{"pool label mismatch", func(in *pool) { in.node.Join.Labels[kube.LabelPool] = "other" }, []string{"dynk8s.io/pool must be the pool name \"general\""}},
		{"label value is a token", func(in *pool) { in.node.Join.Labels["example.com/t"] = "abcdef.0123456789abcdef" }, []string{"looks like a bootstrap token"}},
		{"pre-pull image", func(in *pool) { in.node.PrePullImages = []string{"quay.io/ok:1", "Not An Image"} }, []string{"PrePullImages[1]", "is not an image reference"}},
		{"launch hook", func(in *pool) { in.node.LaunchHook = "hook with blanks" }, []string{"LaunchHook", "is not a lifecycle hook name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := generalPool()
			tc.modify(&in)
			_, err := in.userData()
			assert.Assert(t, err != nil)
			for _, w := range tc.want {
				assert.Check(t, is.ErrorContains(err, w))
			}
		})
	}

	// Every problem is reported at once.
	in := generalPool()
	in.render.KubernetesVersion = kube.Version{}
	in.node.APIServerEndpoint = endpoint.HostPort{}
	in.node.Join.CACertHashes = nil
	_, err := in.userData()
	for _, w := range []string{"KubernetesVersion", "APIServerEndpoint", "CACertHashes"} {
		assert.Check(t, is.ErrorContains(err, w))
	}
}

// The join token and any key exist only in SSM; the renderer never sees them. Inputs that carry a token- or
// key-shaped value are refused without repeating it, and no rendered pool contains anything token-shaped.
func TestNodeRendersNoSecret(t *testing.T) {
	t.Parallel()
	const token = "7f3k2q.p9x8w7v6u5t4s3r2"
	const key = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	for _, bad := range []func(*pool){
		func(in *pool) { in.node.JoinTokenParameter = "/dynk8s/" + token },
		func(in *pool) { in.node.JoinTokenParameter = "/dynk8s/" + key },
		func(in *pool) { in.node.Join.Labels["example.com/token"] = token },
		func(in *pool) {
			in.node.Join.Taints = []kube.Taint{{Key: "example.com/t", Value: token, Effect: kube.NoSchedule}}
		},
	} {
		in := generalPool()
		bad(&in)
		_, err := in.userData()
		assert.Assert(t, err != nil)
		assert.Check(t, !strings.Contains(err.Error(), token) && !strings.Contains(err.Error(), key), "error repeats the secret: %v", err)
	}

	// Names that only resemble secrets in part are fine, and nothing token- or key-shaped reaches the output.
	in := spotPool()
	in.node.JoinTokenParameter = "/dynk8s/homelab/bootstrap.token-for-spot-arm64"
	in.node.Join.Labels["example.com/key-ref"] = "yAnz5TF-lXXJte14tji3zlMNq"
	for _, pool := range []pool{generalPool(), spotPool(), in} {
		ud, err := pool.userData()
		assert.NilError(t, err)
		assert.Check(t, !tokenLikeRE.Match(ud), "token-shaped text in user data: %q", tokenLikeRE.Find(ud))
		assert.Check(t, !keyLikeRE.Match(ud), "key-shaped text in user data: %q", keyLikeRE.Find(ud))
	}
}

// The gateway to wake goes to the agent in node.json (it is not secret), empty when the gateway never sleeps.
func TestNodeNamesTheGatewayToWake(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"", "i-0feedfacecafe0001"} {
		in := generalPool()
		in.node.GatewayInstanceID = id
		ud, err := in.userData()
		assert.NilError(t, err)
		assert.Check(t, is.Equal(nodeJSON(t, parseCloudConfig(t, ud)).GatewayInstanceID, id))
	}
}

// The EC2 limit is 16 KiB gzipped; a pool's user data stays well under it, so that what comes next still fits. The
// size is logged for the record.
func TestNodeUserDataSize(t *testing.T) {
	t.Parallel()
	withGateway := generalPool()
	withGateway.node.GatewayInstanceID = "i-0feedfacecafe0001"
	for name, in := range map[string]pool{"general": generalPool(), "spot-arm64": spotPool(), "with-gateway": withGateway} {
		ud, err := in.userData()
		assert.NilError(t, err)
		enc, err := Encode(ud)
		assert.NilError(t, err)
		gz, err := base64.StdEncoding.DecodeString(enc)
		assert.NilError(t, err)
		t.Logf("pool %s: %d bytes raw, %d bytes gzipped, %d bytes base64", name, len(ud), len(gz), len(enc))
		// About 3.4 KiB: the agent's bootstrap, node.json, the units and the host's files; no boot script but the
		// bootstrap. The stacks' own pools are held to the same 4 KiB (infra's TestNodeUserDataBudget).
		assert.Check(t, len(gz) <= 4*1024, "pool %s: %d bytes gzipped; keep user data small", name, len(gz))
	}
}

func parseEnv(t *testing.T, content string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(content, "\n"), "\n") {
		k, v, ok := strings.Cut(line, "=")
		assert.Assert(t, ok, "env line %q", line)
		assert.Assert(t, envKeyRE.MatchString(k) && envValueRE.MatchString(v), "env line %q", line)
		env[k] = v
	}
	return env
}

// nodeJSON is the user data's /etc/dynk8s/node.json, decoded as the agent decodes it.
func nodeJSON(t *testing.T, cc cloudConfig) nodeconfig.Node {
	t.Helper()
	cfg, err := nodeconfig.Decode(strings.NewReader(fileByPath(t, cc, nodeconfig.Path).Content))
	assert.NilError(t, err)
	return cfg
}

// testJoinConfig is the JoinConfiguration the agent would hand kubeadm for the user data's node.json, on the
// instance the fakes describe, with a token.
func testJoinConfig(t *testing.T, cc cloudConfig) string {
	t.Helper()
	jc := nodeJSON(t, cc).JoinConfig(nodeconfig.Identity{InstanceID: "i-0123456789abcdef0", InstanceType: "m7g.large",
		Region: "eu-central-1", Zone: "eu-central-1a", NodeIP: netip.MustParseAddr("10.100.1.23")}, "abcdef.0123456789abcdef", "")
	b, err := yaml.Marshal(jc)
	assert.NilError(t, err)
	return string(b)
}

// kubeadm itself validates the JoinConfiguration the agent hands it (built as the agent builds it). kubeadm is not a
// Debian package: hack/tools.sh builds it, and `make e2e` runs this test with it on PATH and
// DYNK8S_REQUIRE_KUBEADM set, where a missing kubeadm fails; elsewhere it skips.
func TestNodeJoinConfigurationPassesKubeadmValidate(t *testing.T) {
	t.Parallel()
	kubeadm, err := exec.LookPath("kubeadm")
	if err != nil {
		if os.Getenv("DYNK8S_REQUIRE_KUBEADM") != "" {
			t.Fatalf("kubeadm is not on PATH and DYNK8S_REQUIRE_KUBEADM is set: %v", err)
		}
		t.Skip("kubeadm is not on PATH (hack/tools.sh builds it; make e2e runs this test)")
	}
	for name, in := range map[string]pool{"general": generalPool(), "spot-arm64": spotPool()} {
		ud, err := in.userData()
		assert.NilError(t, err)
		doc := testJoinConfig(t, parseCloudConfig(t, ud))
		f := filepath.Join(t.TempDir(), "join.yaml")
		assert.NilError(t, os.WriteFile(f, []byte(doc), 0o600))
		out, err := exec.Command(kubeadm, "config", "validate", "--config", f).CombinedOutput()
		assert.NilError(t, err, "%s: kubeadm config validate: %s", name, out)
	}
}

// A pool with a warm pool gets dynk8s-join.timer: its Running and Hibernated instances enter service without a boot.
// runcmd enables it with the other units, before anything starts (a prompt stop of a warm instance after its
// lifecycle action must not cut an enable short), and starts it before the join unit, since a successful join stops
// and disables it for good. It elapses within a second of its time, not systemd's default minute. A cold pool has
// none.
func TestWarmPoolNodesGetTheJoinTimer(t *testing.T) {
	t.Parallel()
	cold, err := generalPool().userData()
	assert.NilError(t, err)
	for _, f := range parseCloudConfig(t, cold).WriteFiles {
		assert.Check(t, f.Path != "/etc/systemd/system/"+joinTimerName, "a cold pool has the timer")
	}
	in := generalPool()
	in.node.LaunchHook = "dynk8s-launch"
	ud, err := in.userData()
	assert.NilError(t, err)
	cc := parseCloudConfig(t, ud)
	timer := fileByPath(t, cc, "/etc/systemd/system/"+joinTimerName).Content
	assert.Check(t, is.Contains(timer, "OnUnitInactiveSec=2s\n"))
	assert.Check(t, is.Contains(timer, "AccuracySec=1s\n"))
	assert.Check(t, is.Contains(timer, "Unit="+joinUnitName+"\n"))
	assert.DeepEqual(t, cc.RunCmd[0], []string{"systemctl", "enable", "--no-reload", routesUnitName, joinUnitName, agentUnitName, joinTimerName})
	assert.DeepEqual(t, cc.RunCmd[len(cc.RunCmd)-3:len(cc.RunCmd)-1], [][]string{
		{"systemctl", "start", joinTimerName}, {"systemctl", "start", joinUnitName}})
	for i, c := range cc.RunCmd[1:] {
		assert.Check(t, c[0] != "systemctl" || c[1] != "enable", "runcmd[%d] enables a unit after the first start: %v", i+1, c)
	}
}

// runcmd is one shell script whose status is its last command's: that command fails exactly when a unit runcmd
// started has failed, so cloud-init reports a failed join (the box shows it: TestBoxNodeColdThenReboot). Run with
// a stand-in systemctl whose is-failed answers as the real one does.
func TestRuncmdFailsOnAFailedUnit(t *testing.T) {
	t.Parallel()
	ud, err := generalPool().userData()
	assert.NilError(t, err)
	last := parseCloudConfig(t, ud).RunCmd
	cmd := last[len(last)-1]
	for _, tc := range []struct {
		failed string // the unit the stand-in reports failed, "" for none
		ok     bool
	}{{"", true}, {joinUnitName, false}, {imdsUnitName, false}, {routesUnitName, false}} {
		bin := t.TempDir()
		stub := "#!/bin/sh\n[ \"$1 $2\" = \"is-failed --quiet\" ] || exit 2\nshift 2\nfor u; do [ \"$u\" = \"" +
			tc.failed + "\" ] && exit 0; done\nexit 1\n"
		assert.NilError(t, os.WriteFile(filepath.Join(bin, "systemctl"), []byte(stub), 0o755))
		c := exec.Command(cmd[0], cmd[1:]...)
		c.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		err := c.Run()
		assert.Check(t, (err == nil) == tc.ok, "failed unit %q: %v", tc.failed, err)
	}
}

package nodetest

import (
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// What the acceptance tests' nodes and gateways are configured with, and the names the agent's contract spells.
const (
	testTokenParameter = "/dynk8s/test/join-token"
	testToken          = "k7x2qa.0f9e8d7c6b5a4z3y"
	testCAHash         = "sha256:8a3d1c2f0e9b7a6554433221100ffeeddccbbaa99887766554433221100ffee0"
	testGatewayID      = "i-0feedfacecafe0001"
	testKeyParameter   = "/dynk8s/homelab/gateway-private-key"
	testGatewayPrivate = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
	testPeerPublicKey  = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="
	// dnfOptions are the options of every dnf transaction of the boot.
	dnfOptions = "--setopt=install_weak_deps=False --setopt=tsflags=nodocs --setopt=max_parallel_downloads=10"
	// imdsUnitName is the metadata lockdown's unit, wgKeyPath the gateway's WireGuard key.
	imdsUnitName = "dynk8s-imds-lock.service"
	wgKeyPath    = "/etc/wireguard/wg0.key"
	// testUptime is the fake /proc/uptime's.
	testUptime = 42500 * time.Millisecond
)

// testInstanceID is the instance the fakes describe.
var testInstanceID = fakeaws.NodeInstance().ID

// testAgent is the agent's pin the user data carries (the tests install the built agent in its place).
var testAgent = cloudinit.Agent{Bucket: "dynk8s-homelab-agent-20261201153000000000000001", Key: "dynk8s-node/linux-arm64",
	VersionID: "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY", SHA256: "cfe47477f1307f09463fd0848ab7a1a5524f2b62cd6c64c6fb332e4c03d26cb4"}

// testPool is the node the tests boot, reaching its API server at api: an arm64 spot pool of Kubernetes 1.34.4,
// tainted, with on-prem routes and DNS.
func testPool(api endpoint.HostPort) (nodeconfig.Node, cloudinit.NodeRender) {
	capacity := "spot"
	return nodeconfig.Node{
			APIServerEndpoint: api, JoinTokenParameter: testTokenParameter,
			ClusterName: testClusterName, PoolName: "spot-arm64",
			Join: nodeconfig.Join{CACertHashes: []string{testCAHash},
				Labels: map[string]string{"dynk8s.io/pool": "spot-arm64", "dynk8s.io/capacity-type": capacity,
					"node.kubernetes.io/lifecycle": capacity},
				Taints: []kube.Taint{{Key: "dynk8s.io/capacity-type", Value: capacity, Effect: "NoSchedule"}}},
			Host: nodeconfig.Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}, TunnelMTU: 1420,
				MetadataUIDs: []int{1000}},
		}, cloudinit.NodeRender{
			KubernetesVersion: kube.Version{Major: 1, Minor: 34, Patch: 4},
			DNS: cloudinit.OnPremDNS{Servers: []netip.Addr{netip.MustParseAddr("192.168.10.53"),
				netip.MustParseAddr("192.168.11.53")}, Domains: []string{"corp.example.com", "lab.example.net"}},
			Agent: &testAgent,
		}
}

// testGateway is the WireGuard gateway the tests boot.
func testGateway() cloudinit.GatewayInput {
	return cloudinit.GatewayInput{
		ListenPort: 51820, MTU: 1420, TunnelAddress: netip.MustParsePrefix("10.99.0.1/30"),
		PeerPublicKey:       mustKey(testPeerPublicKey),
		PeerAllowedIPs:      []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("10.99.0.2/32")},
		PrivateKeyParameter: testKeyParameter, Agent: &testAgent,
	}
}

func mustKey(s string) wgtypes.Key {
	k, err := wgtypes.ParseKey(s)
	if err != nil {
		panic(err)
	}
	return k
}

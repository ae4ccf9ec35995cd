package nodeconfig

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp/cmpopts"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
)

func testNode() Node {
	return Node{
		ClusterName: "homelab", PoolName: "spot", APIServerEndpoint: endpoint.MustParse("192.168.10.10:6443"),
		JoinTokenParameter: "/dynk8s/homelab/join-token", CRISocket: "unix:///var/run/crio/crio.sock",
		Packages: []string{"kubelet-1.34.4"},
		Join: Join{CACertHashes: []string{"sha256:b", "sha256:a"}, Labels: map[string]string{"dynk8s.io/pool": "spot"},
			Taints:           []kube.Taint{{Key: "k", Effect: "NoSchedule"}},
			PatchesDirectory: "/etc/kubernetes/patches"},
		Host: Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}, TunnelMTU: 1420,
			MetadataUIDs: []int{1000}},
		Deadlines: DefaultDeadlines,
	}
}

// What the renderer encodes, the agent decodes to the same value; durations are written as Go writes them.
func TestRoundTrip(t *testing.T) {
	b, err := testNode().Encode()
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), `"join": "12m0s"`))
	assert.Check(t, is.Contains(string(b), `"wakeInterval": "20s"`))
	assert.Check(t, is.Contains(string(b), `"onPremCidrs": [`+"\n"+`   "192.168.0.0/16"`))
	n, err := Decode(strings.NewReader(string(b)))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(n, testNode(), cmpopts.EquateComparable(netip.Prefix{})))
	assert.Check(t, is.Equal(n.Deadlines.UnitTimeout(), 14*time.Minute))
	assert.Check(t, is.Equal(n.Deadlines.RoutesUnitTimeout(), 3*time.Minute))
}

// The decoder is strict: an unknown key (a typo, or a renderer newer than the agent), a second document, a bad
// duration or a missing value is an error that names the key.
func TestDecodeIsStrict(t *testing.T) {
	good, err := testNode().Encode()
	assert.NilError(t, err)
	for name, c := range map[string]struct {
		doc, want string
	}{
		"unknown key":    {strings.Replace(string(good), `"poolName"`, `"poolNmae"`, 1), `unknown key "poolNmae"`},
		"another case":   {strings.Replace(string(good), `"poolName"`, `"poolname"`, 1), `unknown key "poolname"`},
		"nested":         {strings.Replace(string(good), `"effect"`, `"Effect"`, 1), `unknown key "join.taints.0.Effect"`},
		"second object":  {string(good) + "{}", "data after the JSON object"},
		"bad duration":   {strings.Replace(string(good), `"12m0s"`, `"12 minutes"`, 1), `time: unknown unit`},
		"missing values": {`{"deadlines": {"join": "0s"}}`, "missing or invalid: apiServerEndpoint, clusterName, criSocket"},
		"zero deadline":  {strings.Replace(string(good), `"12m0s"`, `"0s"`, 1), "deadlines.join (a positive duration)"},
		"host bits":      {strings.Replace(string(good), `"192.168.0.0/16"`, `"192.168.1.1/16"`, 1), "host.onPremCidrs.0 (an IPv4 network address, not 192.168.1.1/16)"},
		"not a prefix":   {strings.Replace(string(good), `"192.168.0.0/16"`, `"192.168.0.0"`, 1), `netip.ParsePrefix("192.168.0.0"): no '/'`},
		"root may read":  {strings.Replace(string(good), `1000`, `0`, 1), "host.metadataUids.0 (a non-root UID, not 0)"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(c.doc))
			assert.ErrorContains(t, err, c.want)
		})
	}
}

// The JoinConfiguration the agent hands kubeadm: the pool's labels with the instance's zone, region and type, the
// instance id as the node name and in the provider ID, the CA pins sorted, taints always a list.
func TestJoinConfig(t *testing.T) {
	id := Identity{InstanceID: "i-0123456789abcdef0", InstanceType: "m7g.large", Region: "eu-central-1",
		Zone: "eu-central-1a", NodeIP: netip.MustParseAddr("10.100.1.23")}
	n := testNode()
	n.Join.Taints = nil
	jc := n.JoinConfig(id, "abcdef.0123456789abcdef", "/tmp/root")
	assert.DeepEqual(t, jc, JoinConfiguration{
		APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "JoinConfiguration",
		Discovery: Discovery{BootstrapToken: BootstrapTokenDiscovery{APIServerEndpoint: "192.168.10.10:6443",
			CACertHashes: []string{"sha256:a", "sha256:b"}, Token: "abcdef.0123456789abcdef"}},
		NodeRegistration: NodeRegistration{Name: "i-0123456789abcdef0", CRISocket: "unix:///var/run/crio/crio.sock",
			KubeletExtraArgs: []KubeletArg{
				{Name: "node-ip", Value: "10.100.1.23"},
				{Name: "node-labels", Value: "dynk8s.io/pool=spot,node.kubernetes.io/instance-type=m7g.large," +
					"topology.kubernetes.io/region=eu-central-1,topology.kubernetes.io/zone=eu-central-1a"},
				{Name: "provider-id", Value: "aws:///eu-central-1a/i-0123456789abcdef0"},
			},
			Taints: []kube.Taint{}},
		Patches: Patches{Directory: "/tmp/root/etc/kubernetes/patches"},
	})
}

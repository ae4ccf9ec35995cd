package nodetest

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The agent points kubeadm join at the patches the user data writes (the kubelet's resolvConf: cloudinit's
// TestNodeKubeletPatchSetsResolvConf), under its root like every other path.
func TestAgentPointsKubeadmAtThePatches(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, nil, fakeaws.IMDSInstance{})
	run := newAgentEnv(t, ud, aws, nil, nil).run(t, AgentPath, "join")
	assert.Equal(t, run.exitCode, 0)
	jc := ParseJoinConfig(t, run.file("join-config.yaml"))
	assert.Check(t, is.Equal(jc.Patches.Directory, filepath.Join(run.root, "etc/kubernetes/patches")))
	_, err := os.Stat(filepath.Join(jc.Patches.Directory, "kubeletconfiguration+merge.yaml"))
	assert.Check(t, err)
}

// The built agent's onprem-routes and imds-lock, as their units run them, through ip(8) and nft(8) on PATH: the
// routes are capped at the pool's MTU once a default route shows up; the metadata lockdown loads the ruleset the
// agent writes, with EC2 Instance Connect's user from the image's passwd, and the real nft(8) takes that ruleset.
// A lockdown nft refuses fails with one reason. (The scenarios are the agent's table tests: TestOnPremRoutes,
// TestLockMetadata.)
func TestHostUnitsRunTheAgent(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, func(in *nodeconfig.Node) {
		in.Host.OnPremCIDRs = append(in.Host.OnPremCIDRs, netip.MustParsePrefix("172.16.0.0/12"))
		in.Host.TunnelMTU = 1380
		in.Host.MetadataUIDs = []int{1000}
	}, fakeaws.IMDSInstance{})

	run := newAgentEnv(t, ud, aws, map[string]string{"STUB_IP_NO_ROUTE": "2"}, nil).run(t, AgentPath, "onprem-routes")
	assert.Equal(t, run.exitCode, 0)
	calls := run.file("calls")
	assert.Check(t, is.Equal(strings.Count(calls, "ip -j -4 route show default\n"), 3))
	assert.Check(t, is.Contains(calls, "ip route replace 192.168.0.0/16 via 10.100.1.1 dev ens5 mtu 1380\n"+
		"ip route replace 172.16.0.0/12 via 10.100.1.1 dev ens5 mtu 1380\n"))
	assert.Check(t, is.Contains(run.stderr, "dynk8s-onprem-routes: routes to 192.168.0.0/16 172.16.0.0/12 via 10.100.1.1 dev ens5 capped at MTU 1380"))

	passwd := func(root string) {
		assert.NilError(t, os.WriteFile(filepath.Join(root, "etc/passwd"),
			[]byte("root:x:0:0::/root:/bin/bash\nec2-instance-connect:x:977:977::/:/sbin/nologin\n"), 0o644))
	}
	run = newAgentEnv(t, ud, aws, nil, passwd).run(t, AgentPath, "imds-lock")
	assert.Equal(t, run.exitCode, 0)
	ruleset := filepath.Join(run.root, "run/dynk8s/imds-lock.nft")
	assert.Check(t, is.Contains(run.file("calls"), "nft -f "+ruleset+"\n"))
	b, err := os.ReadFile(ruleset)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "elements = { 0, 977, 1000 }"))
	if nft, err := exec.LookPath("nft"); err == nil {
		out, err := exec.Command(nft, "-c", "-f", ruleset).CombinedOutput()
		assert.Check(t, err, "nft -c: %s", out)
	}

	bad := newAgentEnv(t, ud, aws, map[string]string{"STUB_NFT_FAILS": "1"}, nil).run(t, AgentPath, "imds-lock")
	assert.Check(t, bad.exitCode != 0)
	failed := FailedLines(bad.stderr)
	assert.Assert(t, is.Len(failed, 1), bad.stderr)
	assert.Check(t, is.Contains(failed[0], "nft could not load"))
}

package cloudinit

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/google/go-cmp/cmp/cmpopts"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// SELinux is decided, not defaulted: CRI-O's drop-in says selinux = false in so many words. CRI-O's own default is
// false today, but documented as deprecated and to follow the host in a future release (cri-o
// internal/config/template.go, templateStringCrioRuntimeSelinux), which on Fedora would confine every pod.
func TestNodeCRIOSELinuxIsExplicit(t *testing.T) {
	t.Parallel()
	ud, err := generalPool().userData()
	assert.NilError(t, err)
	var conf map[string]map[string]map[string]any
	_, err = toml.Decode(fileByPath(t, parseCloudConfig(t, ud), "/etc/crio/crio.conf.d/90-dynk8s.conf").Content, &conf)
	assert.NilError(t, err)
	v, ok := conf["crio"]["runtime"]["selinux"]
	assert.Assert(t, ok, "[crio.runtime] has no selinux key: %v", conf["crio"]["runtime"])
	assert.Check(t, is.Equal(v, false))
}

// The kubelet's resolvConf is the node's own decision, not the cluster's kubelet-config: kubeadm join patches it in
// from the directory the JoinConfiguration names (the agent points kubeadm at it: node/nodetest's
// TestAgentPointsKubeadmAtThePatches; the real kubeadm applies it in the e2e TestKubeletJoin).
func TestNodeKubeletPatchSetsResolvConf(t *testing.T) {
	t.Parallel()
	ud, err := spotPool().userData()
	assert.NilError(t, err)
	cc := parseCloudConfig(t, ud)
	patch := fileByPath(t, cc, "/etc/kubernetes/patches/kubeletconfiguration+merge.yaml")
	var p map[string]any
	assert.NilError(t, yaml.UnmarshalStrict([]byte(patch.Content), &p))
	// Image pulls in parallel, so the DaemonSets' images do not queue behind each other on a new node (boot N3);
	// no client certificate rotation, so that the kubelet bootstraps with the key the agent marked its instance with;
	// node status changes posted within a second (the fuse resource lifts the startup taint), and the unchanged
	// status reported at the default 5 minutes, which an explicit update frequency would otherwise become.
	assert.Check(t, is.DeepEqual(p, map[string]any{"resolvConf": "/run/systemd/resolve/resolv.conf",
		"serializeImagePulls": false, "maxParallelImagePulls": float64(4), "rotateCertificates": false,
		"nodeStatusUpdateFrequency": "1s", "nodeStatusReportFrequency": "5m0s"}))

}

// runcmd enables the units for the boots to come, then installs the agent and runs the host's steps before the join:
// the routes (and DNS), and NetworkManager's reload. The metadata lockdown is no step of runcmd's: the kubelet
// requires it, so it is loaded before any kubelet runs, on every path, and no kubelet runs when it failed. Both run
// the agent, so both require its bootstrap.
func TestNodeHostStepsAroundTheJoin(t *testing.T) {
	t.Parallel()
	general, err := generalPool().userData()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(parseCloudConfig(t, general).RunCmd, [][]string{
		{"systemctl", "enable", "--no-reload", "dynk8s-onprem-routes.service", "dynk8s-join.service", "dynk8s-agent.service"},
		{"systemctl", "start", "dynk8s-agent.service"},
		{"systemctl", "start", "dynk8s-onprem-routes.service"},
		{"systemctl", "try-reload-or-restart", "NetworkManager.service"},
		{"systemctl", "start", "dynk8s-join.service"},
		{"sh", "-c", "! systemctl is-failed --quiet dynk8s-onprem-routes.service dynk8s-join.service dynk8s-imds-lock.service " +
			"dynk8s-agent.service"},
	}))
	spot, err := spotPool().userData()
	assert.NilError(t, err)
	cc := parseCloudConfig(t, spot)
	assert.Check(t, is.DeepEqual(cc.RunCmd[2:5], [][]string{
		{"systemctl", "start", "dynk8s-onprem-routes.service"},
		{"systemctl", "try-reload-or-restart", "NetworkManager.service"},
		{"systemctl", "try-restart", "systemd-resolved.service"},
	}))

	routes := parseUnit(t, routesUnitName, fileByPath(t, cc, "/etc/systemd/system/dynk8s-onprem-routes.service").Content)
	assert.Check(t, is.DeepEqual(routes, parsedUnit{
		"Unit.Description":         strings.Fields("dynk8s: cap the path MTU toward the on-prem ranges at the tunnel's"),
		"Unit.Wants":               {"network-online.target"},
		"Unit.After":               {"network-online.target", "dynk8s-agent.service"},
		"Unit.Requires":            {"dynk8s-agent.service"},
		"Unit.Before":              {"dynk8s-join.service", "kubelet.service"},
		"Service.Type":             {"oneshot"},
		"Service.RemainAfterExit":  {"yes"},
		"Service.ExecStart":        strings.Fields("/usr/local/bin/dynk8s-node onprem-routes --config /etc/dynk8s/node.json"),
		"Service.StandardOutput":   {"journal+console"},
		"Service.StandardError":    {"journal+console"},
		"Service.SyslogIdentifier": {"dynk8s-onprem-routes"},
		"Service.TimeoutStartSec":  {"180s"},
		"Install.WantedBy":         {"multi-user.target"},
	}))
	lock := parseUnit(t, imdsUnitName, fileByPath(t, cc, "/etc/systemd/system/dynk8s-imds-lock.service").Content)
	assert.Check(t, is.DeepEqual(lock, parsedUnit{
		"Unit.Description":         strings.Fields("dynk8s: keep the instance metadata service from pods and non-root users"),
		"Unit.Requires":            {"dynk8s-agent.service"},
		"Unit.After":               {"dynk8s-agent.service"},
		"Service.Type":             {"oneshot"},
		"Service.RemainAfterExit":  {"yes"},
		"Service.ExecStart":        strings.Fields("/usr/local/bin/dynk8s-node imds-lock --config /etc/dynk8s/node.json"),
		"Service.StandardOutput":   {"journal+console"},
		"Service.StandardError":    {"journal+console"},
		"Service.SyslogIdentifier": {"dynk8s-imds-lock"},
	}), "the lock has a condition, an ordering besides the bootstrap's or an [Install] of its own")
	kubelet := parseUnit(t, kubeletLockDropIn, fileByPath(t, cc, kubeletLockDropIn).Content)
	assert.Check(t, is.DeepEqual(kubelet, parsedUnit{"Unit.Requires": {imdsUnitName}, "Unit.After": {imdsUnitName}}))

	// node.json's host section is what the two subcommands apply.
	cfg := nodeJSON(t, cc)
	assert.Check(t, is.DeepEqual(cfg.Host, nodeconfig.Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")},
		TunnelMTU: 1420, MetadataUIDs: []int{1000}}, cmpopts.EquateComparable(netip.Prefix{})))
}

// On-prem names go to the on-prem servers, through systemd-resolved's route-only domains; a pool without on-prem
// DNS gets no drop-in at all.
func TestNodeOnPremDNS(t *testing.T) {
	t.Parallel()
	spot, err := spotPool().userData()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(fileByPath(t, parseCloudConfig(t, spot), "/etc/systemd/resolved.conf.d/90-dynk8s-onprem.conf").Content,
		"[Resolve]\nDNS=192.168.10.53 192.168.11.53\nDomains=~corp.example.com ~lab.example.net\n"))
	general, err := generalPool().userData()
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(general), "resolved.conf.d"))
	assert.Check(t, !strings.Contains(string(general), "systemd-resolved"))
}

// The renderer checks what its encoding needs (resolved's lists) and node.json what the agent needs; the rules about
// the values (the MTU's range, the servers inside the ranges, at most three, with domains) are the config's
// (infra/config's TestOnPremDNSValidation and the wireguard tests), which run before any renderer.
func TestNodeHostValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		modify func(*pool)
		want   string
	}{
		{"no on-prem range", func(p *pool) { p.node.Host.OnPremCIDRs = nil }, "node config: missing or invalid: host.onPremCidrs"},
		{"range with host bits", func(p *pool) { p.node.Host.OnPremCIDRs = []netip.Prefix{netip.MustParsePrefix("192.168.1.1/16")} },
			"host.onPremCidrs.0 (an IPv4 network address, not 192.168.1.1/16)"},
		{"MTU unset", func(p *pool) { p.node.Host.TunnelMTU = 0 }, "host.tunnelMtu (a positive MTU)"},
		{"no server address", func(p *pool) {
			p.render.DNS = OnPremDNS{Servers: []netip.Addr{{}}, Domains: []string{"corp.lan"}}
		}, "DNS.Servers[0]: is not an IP address"},
		{"routing prefix in a domain", func(p *pool) {
			p.render.DNS = OnPremDNS{Servers: []netip.Addr{netip.MustParseAddr("192.168.1.53")}, Domains: []string{"~corp.lan"}}
		}, `DNS.Domains[0]: "~corp.lan" is not a DNS domain`},
		{"a space in a domain", func(p *pool) {
			p.render.DNS = OnPremDNS{Servers: []netip.Addr{netip.MustParseAddr("192.168.1.53")},
				Domains: []string{"corp.lan other.lan"}}
		}, `DNS.Domains[0]: "corp.lan other.lan" is not a DNS domain`},
		{"root as a metadata user", func(p *pool) { p.node.Host.MetadataUIDs = []int{0} }, "host.metadataUids.0 (a non-root UID, not 0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := generalPool()
			tc.modify(&in)
			_, err := in.userData()
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

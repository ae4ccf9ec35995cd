package config_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// devConfig is Pulumi.dev.yaml's config map, read afresh each call.
func devConfig(t *testing.T) map[string]any {
	t.Helper()
	values, err := config.ReadStackFile("../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	return values
}

func parse(t *testing.T, values map[string]any) (*config.Config, error) {
	t.Helper()
	cfg, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	return config.ParseValues(cfg.Values)
}

var (
	obj  = mockcloud.Object
	pool = mockcloud.Pool
)

func TestDevAndProdStacksAreValid(t *testing.T) {
	for _, stack := range []string{"dev", "prod"} {
		t.Run(stack, func(t *testing.T) {
			cfg, err := mockcloud.LoadStackFile("../../Pulumi." + stack + ".yaml")
			assert.NilError(t, err)
			_, err = config.ParseValues(cfg.Values)
			assert.NilError(t, err)
		})
	}
}

// gateway.idleStop 0 keeps the gateway running; any duration from the minimum on is taken as given.
func TestGatewayIdleStop(t *testing.T) {
	for value, want := range map[any]time.Duration{"0": 0, "0s": 0, "5m": 5 * time.Minute, "1h30m": 90 * time.Minute} {
		c := devConfig(t)
		obj(c, "gateway")["idleStop"] = value
		cfg, err := parse(t, c)
		assert.NilError(t, err, "idleStop %v", value)
		assert.Equal(t, cfg.Gateway.IdleStop, want, "idleStop %v", value)
	}
}

func TestDefaultsApplied(t *testing.T) {
	c := map[string]any{
		"aws:region":         "eu-central-1",
		"dynk8s:clusterName": "lab",
		"dynk8s:kubernetes": map[string]any{
			"version": "1.34.4", "apiServerEndpoint": "192.168.1.10:6443", "podCidr": "10.244.0.0/16",
		},
		"dynk8s:wireguard": map[string]any{"onPremCidrs": []any{"192.168.1.0/24"}},
		"dynk8s:fedora":    map[string]any{"release": 42},
		"dynk8s:nodePools": []any{map[string]any{"name": "x", "arch": "x86_64", "instanceTypes": []any{"m7i.large"}}},
	}
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Network.VPCCIDR, netip.MustParsePrefix("10.200.0.0/16"))
	assert.DeepEqual(t, cfg.Network.AvailabilityZones, config.Zones{Count: 2})
	assert.Equal(t, cfg.Kubernetes.ServiceCIDR, netip.MustParsePrefix("10.96.0.0/12"))
	assert.Check(t, cfg.Kubernetes.Kubeconfig == nil, "no kubeconfig: the ambient one")
	assert.Equal(t, cfg.WireGuard.ListenPort, 51820)
	assert.Equal(t, cfg.WireGuard.MTU, 1420)
	assert.Equal(t, cfg.WireGuard.TunnelCIDR, netip.MustParsePrefix("10.201.0.0/30"))
	assert.Check(t, cfg.WireGuard.OnPremPublicKey == nil && cfg.WireGuard.OnPremEndpoint == nil)
	assert.Equal(t, cfg.Gateway.InstanceType, "t4g.micro")
	assert.Equal(t, cfg.Gateway.IdleStop, 15*time.Minute)
	assert.Equal(t, cfg.NodePools[0].MinSize, 0)
	assert.Equal(t, cfg.NodePools[0].MaxSize, 3)
	assert.Equal(t, cfg.NodePools[0].VolumeSizeGiB, 50)
	assert.Equal(t, cfg.NodePools[0].Image, config.ImageStock, "a pool boots the stock image unless it opts in")
	assert.Equal(t, cfg.Autoscaler.Version, "", "no override")
	assert.Equal(t, cfg.Derived.AutoscalerVersion.String(), "1.34.5", "resolved from the Kubernetes minor")
	assert.Equal(t, cfg.Derived.Kubernetes.Minor, 34)
	assert.Equal(t, cfg.Autoscaler.ScaleDownUnneededTime, "10m")
	assert.Equal(t, cfg.Autoscaler.Expander, "least-waste")
	assert.Equal(t, cfg.Autoscaler.ScaleDownUnreadyTime, time.Hour)
	assert.Equal(t, cfg.Autoscaler.MaxNodeProvisionTime, 25*time.Minute)
	assert.Check(t, !cfg.Autoscaler.SkipNodesWithSystemPods)
	assert.Check(t, cfg.NodePools[0].Autoscaling.ScaleDownUnneededTime == nil, "no per-pool option unless given")
	assert.Check(t, cfg.Fuse.Enabled)
	assert.Equal(t, cfg.Fuse.Capacity, 5000)
	// The shortest wait the config allows: a stale Node of a reclaimed instance holds the autoscaler's
	// cluster-health gate until the cleanup deletes it (AWS N5).
	assert.Equal(t, cfg.Cleanup.NotReadyAfter, 5*time.Minute)
	assert.Equal(t, cfg.Kubernetes.BootstrapTokenTTL, 2*time.Hour)
	assert.Equal(t, cfg.Kubernetes.BootstrapTokenRotation, "1")
	assert.Check(t, cfg.TerminationHandler.Enabled)
	assert.Equal(t, cfg.Identity.AutoscalerKeyRotation, "1")
}

// TestBadConfig: each malformed config is refused with exactly one error, at its exact key path.
func TestBadConfig(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c map[string]any)
		path   string
		msg    string // a fragment of the message
	}{
		{"region missing", func(c map[string]any) { delete(c, "aws:region") }, "aws:region", "required"},
		{"region malformed", func(c map[string]any) { c["aws:region"] = "europe" }, "aws:region", "not an AWS region"},
		{"region of an isolated partition", func(c map[string]any) { c["aws:region"] = "us-isob-east-1" }, "aws:region", "isolated partition"},
		{"region of another isolated partition", func(c map[string]any) { c["aws:region"] = "eu-isoe-west-1" }, "aws:region", "isolated partition"},
		{"cluster name missing", func(c map[string]any) { delete(c, "dynk8s:clusterName") }, "dynk8s:clusterName", "required"},
		{"cluster name not a tag segment", func(c map[string]any) { c["dynk8s:clusterName"] = "Home_Lab" }, "dynk8s:clusterName", "lowercase"},
		{"cluster name too long", func(c map[string]any) { c["dynk8s:clusterName"] = strings.Repeat("a", 33) }, "dynk8s:clusterName", "1-32"},
		{"kubernetes not a map", func(c map[string]any) { c["dynk8s:kubernetes"] = "1.34.4" }, "dynk8s:kubernetes", "structured"},
		{"version missing", func(c map[string]any) { delete(obj(c, "kubernetes"), "version") }, "dynk8s:kubernetes.version", "required"},
		{"version with v", func(c map[string]any) { obj(c, "kubernetes")["version"] = "v1.34.4" }, "dynk8s:kubernetes.version", "exact version"},
		{"version without patch", func(c map[string]any) { obj(c, "kubernetes")["version"] = 1.34 }, "dynk8s:kubernetes.version", "exact version"},
		{"version too old for v1beta4", func(c map[string]any) { obj(c, "kubernetes")["version"] = "1.30.2" }, "dynk8s:kubernetes.version", "1.31"},
		{"misspelt kubernetes key", func(c map[string]any) { obj(c, "kubernetes")["verison"] = "1.34.4" }, "dynk8s:kubernetes.verison", "unknown key: did you mean version? (known keys here: apiServerEndpoint, "}, //nolint:misspell // the typo is the test
		{"key in the wrong case", func(c map[string]any) { obj(c, "kubernetes")["podcidr"] = "10.244.0.0/16" }, "dynk8s:kubernetes.podcidr", "did you mean podCidr?"},
		{"key like no known one", func(c map[string]any) { obj(c, "kubernetes")["flavour"] = "vanilla" }, "dynk8s:kubernetes.flavour", "unknown key (known keys here: apiServerEndpoint, "},
		{"taint as a string", func(c map[string]any) {
			pool(c, 1)["taints"] = []any{"example.com/spot=true:NoSchedule"}
		}, "dynk8s:nodePools[1].taints[0]", "must be a map of keys to values (its keys: effect, key, value), got the string"},
		{"minor without a known autoscaler", func(c map[string]any) { obj(c, "kubernetes")["version"] = "1.37.1" }, "dynk8s:kubernetes.version", "(set dynk8s:autoscaler.version)"},
		{"endpoint without port", func(c map[string]any) { obj(c, "kubernetes")["apiServerEndpoint"] = "192.168.10.10" }, "dynk8s:kubernetes.apiServerEndpoint", "host:port"},
		{"endpoint port out of range", func(c map[string]any) { obj(c, "kubernetes")["apiServerEndpoint"] = "192.168.10.10:70000" }, "dynk8s:kubernetes.apiServerEndpoint", "port"},
		{"endpoint not routed through the tunnel", func(c map[string]any) { obj(c, "kubernetes")["apiServerEndpoint"] = "172.16.0.1:6443" }, "dynk8s:kubernetes.apiServerEndpoint", "not inside"},
		{"ca hash too short", func(c map[string]any) { obj(c, "kubernetes")["caCertHash"] = "sha256:abc" }, "dynk8s:kubernetes.caCertHash", "64"},
		{"ca hash uppercase", func(c map[string]any) {
			obj(c, "kubernetes")["caCertHash"] = "sha256:" + strings.Repeat("AB", 32)
		}, "dynk8s:kubernetes.caCertHash", "lowercase"},
		{"on-prem node name not a Node name", func(c map[string]any) { obj(c, "kubernetes")["onPremNodes"] = []any{"cp-1", "Worker_2"} }, "dynk8s:kubernetes.onPremNodes[1]", "is not a Node name"},
		{"on-prem node name an instance id", func(c map[string]any) { obj(c, "kubernetes")["onPremNodes"] = []any{"i-0123456789abcdef0"} }, "dynk8s:kubernetes.onPremNodes[0]", "pool nodes register with their pool label"},
		{"on-prem node listed twice", func(c map[string]any) { obj(c, "kubernetes")["onPremNodes"] = []any{"cp-1", "cp-1"} }, "dynk8s:kubernetes.onPremNodes[1]", "listed twice"},
		{"pod cidr missing", func(c map[string]any) { delete(obj(c, "kubernetes"), "podCidr") }, "dynk8s:kubernetes.podCidr", "required"},
		{"pod cidr malformed", func(c map[string]any) { obj(c, "kubernetes")["podCidr"] = "10.244.0.0/33" }, "dynk8s:kubernetes.podCidr", "not a CIDR"},
		{"pod cidr host bits", func(c map[string]any) { obj(c, "kubernetes")["podCidr"] = "10.244.1.0/16" }, "dynk8s:kubernetes.podCidr", "host bits"},
		{"service overlaps pods", func(c map[string]any) { obj(c, "kubernetes")["serviceCidr"] = "10.244.128.0/20" }, "dynk8s:kubernetes.serviceCidr", "overlaps"},
		{"vpc overlaps on-prem", func(c map[string]any) { obj(c, "network")["vpcCidr"] = "192.168.0.0/16" }, "dynk8s:wireguard.onPremCidrs[0]", "overlaps"},
		{"tunnel inside the vpc", func(c map[string]any) { obj(c, "wireguard")["tunnelCidr"] = "10.200.5.0/30" }, "dynk8s:wireguard.tunnelCidr", "overlaps"},
		{"vpc too large", func(c map[string]any) { obj(c, "network")["vpcCidr"] = "10.96.0.0/11" }, "dynk8s:network.vpcCidr", "/16 to /24"},
		{"vpc not a cidr", func(c map[string]any) { obj(c, "network")["vpcCidr"] = "vpc" }, "dynk8s:network.vpcCidr", "not a CIDR"},
		{"vpc ipv6", func(c map[string]any) { obj(c, "network")["vpcCidr"] = "fd00::/56" }, "dynk8s:network.vpcCidr", "IPv4"},
		{"zero zones", func(c map[string]any) { obj(c, "network")["availabilityZones"] = 0 }, "dynk8s:network.availabilityZones", "1..6"},
		{"zone of another region", func(c map[string]any) { obj(c, "network")["availabilityZones"] = []any{"us-east-1a"} }, "dynk8s:network.availabilityZones[0]", "not a zone"},
		{"zones neither count nor list", func(c map[string]any) { obj(c, "network")["availabilityZones"] = "two" }, "dynk8s:network.availabilityZones", "count"},
		{"listen port zero", func(c map[string]any) { obj(c, "wireguard")["listenPort"] = 0 }, "dynk8s:wireguard.listenPort", "1..65535"},
		{"mtu too small", func(c map[string]any) { obj(c, "wireguard")["mtu"] = 1200 }, "dynk8s:wireguard.mtu", "1280..8920"},
		{"mtu above jumbo", func(c map[string]any) { obj(c, "wireguard")["mtu"] = 9001 }, "dynk8s:wireguard.mtu", "1280..8920"},
		{"mtu not a number", func(c map[string]any) { obj(c, "wireguard")["mtu"] = "big" }, "dynk8s:wireguard.mtu", "whole number"},
		{"on-prem cidrs missing", func(c map[string]any) { delete(obj(c, "wireguard"), "onPremCidrs") }, "dynk8s:wireguard.onPremCidrs", "required"},
		{"on-prem cidr twice", func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "192.168.10.0/24"}
		}, "dynk8s:wireguard.onPremCidrs[1]", "twice"},
		{"tunnel too small for two peers", func(c map[string]any) { obj(c, "wireguard")["tunnelCidr"] = "10.201.0.0/31" }, "dynk8s:wireguard.tunnelCidr", "too small"},
		// Security: the node security group admits onPremCidrs and tunnelCidr on every port, and nodes have public
		// addresses; the gateway dials onPremEndpoint through the internet gateway.
		{"on-prem range public", func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "8.8.8.0/24"}
		}, "dynk8s:wireguard.onPremCidrs[1]", "not a private range"},
		{"on-prem range starts private, ends public", func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "192.168.0.0/15"}
		}, "dynk8s:wireguard.onPremCidrs[1]", "not a private range"},
		{"on-prem range link-local, even when public ranges are allowed", func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "169.254.0.0/16"}
			obj(c, "wireguard")["allowPublicOnPremCidrs"] = true
		}, "dynk8s:wireguard.onPremCidrs[1]", "169.254.0.0/16 link-local"},
		{"on-prem range holds loopback", func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "96.0.0.0/3"}
			obj(c, "wireguard")["allowPublicOnPremCidrs"] = true
		}, "dynk8s:wireguard.onPremCidrs[1]", "127.0.0.0/8 loopback"},
		{"on-prem range multicast", func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "239.1.0.0/16"}
		}, "dynk8s:wireguard.onPremCidrs[1]", "multicast"},
		{"tunnel public", func(c map[string]any) { obj(c, "wireguard")["tunnelCidr"] = "8.8.4.0/30" }, "dynk8s:wireguard.tunnelCidr", "not a private range"},
		{"tunnel public though public on-prem ranges are allowed", func(c map[string]any) {
			obj(c, "wireguard")["tunnelCidr"] = "8.8.4.0/30"
			obj(c, "wireguard")["allowPublicOnPremCidrs"] = true
		}, "dynk8s:wireguard.tunnelCidr", "not a private range"},
		{"tunnel reserved", func(c map[string]any) { obj(c, "wireguard")["tunnelCidr"] = "240.0.0.0/30" }, "dynk8s:wireguard.tunnelCidr", "reserved"},
		{"vpc link-local", func(c map[string]any) { obj(c, "network")["vpcCidr"] = "169.254.0.0/16" }, "dynk8s:network.vpcCidr", "link-local"},
		{"pod range in this-network", func(c map[string]any) { obj(c, "kubernetes")["podCidr"] = "0.0.0.0/16" }, "dynk8s:kubernetes.podCidr", "this network"},
		{"on-prem endpoint inside the on-prem ranges", func(c map[string]any) {
			obj(c, "wireguard")["onPremEndpoint"] = "192.168.10.5:51820"
		}, "dynk8s:wireguard.onPremEndpoint", "inside wireguard.onPremCidrs[0] (192.168.10.0/24)"},
		{"on-prem endpoint inside a public on-prem range", func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "198.51.100.0/24"}
			obj(c, "wireguard")["allowPublicOnPremCidrs"] = true
			obj(c, "wireguard")["onPremEndpoint"] = "198.51.100.20:51820"
		}, "dynk8s:wireguard.onPremEndpoint", "inside wireguard.onPremCidrs[1]"},
		{"on-prem endpoint in the tunnel", func(c map[string]any) {
			obj(c, "wireguard")["onPremEndpoint"] = "10.201.0.2:51820"
		}, "dynk8s:wireguard.onPremEndpoint", "inside wireguard.tunnelCidr"},
		{"on-prem endpoint private", func(c map[string]any) {
			obj(c, "wireguard")["onPremEndpoint"] = "172.16.5.5:51820"
		}, "dynk8s:wireguard.onPremEndpoint", "private address"},
		{"on-prem endpoint loopback", func(c map[string]any) {
			obj(c, "wireguard")["onPremEndpoint"] = "127.0.0.1:51820"
		}, "dynk8s:wireguard.onPremEndpoint", "loopback"},
		{"on-prem key not 32 bytes", func(c map[string]any) { obj(c, "wireguard")["onPremPublicKey"] = "c2hvcnQ=" }, "dynk8s:wireguard.onPremPublicKey", "32 bytes"},
		{"on-prem endpoint without port", func(c map[string]any) { obj(c, "wireguard")["onPremEndpoint"] = "vpn.example.com" }, "dynk8s:wireguard.onPremEndpoint", "host:port"},
		{"gateway type not a type name", func(c map[string]any) { obj(c, "gateway")["instanceType"] = "t4g micro" }, "dynk8s:gateway.instanceType", "not an EC2 instance type name"},
		{"gateway idle stop too short", func(c map[string]any) { obj(c, "gateway")["idleStop"] = "2m" }, "dynk8s:gateway.idleStop", "at least 5m0s"},
		{"gateway idle stop negative", func(c map[string]any) { obj(c, "gateway")["idleStop"] = "-15m" }, "dynk8s:gateway.idleStop", "at least 5m0s"},
		{"gateway idle stop not a duration", func(c map[string]any) { obj(c, "gateway")["idleStop"] = 15 }, "dynk8s:gateway.idleStop", "duration"},
		{"agent retention zero", func(c map[string]any) { obj(c, "agent")["retentionDays"] = 0 }, "dynk8s:agent.retentionDays", "at least 1 day"},
		{"fedora release missing", func(c map[string]any) { delete(obj(c, "fedora"), "release") }, "dynk8s:fedora.release", "required"},
		{"fedora release without naming scheme", func(c map[string]any) { obj(c, "fedora")["release"] = 12 }, "dynk8s:fedora.release", "naming scheme"},
		{"fedora release not a number", func(c map[string]any) { obj(c, "fedora")["release"] = "forty" }, "dynk8s:fedora.release", "whole number"},
		{"no pools", func(c map[string]any) { delete(c, "dynk8s:nodePools") }, "dynk8s:nodePools", "at least one"},
		{"pools not a list", func(c map[string]any) { c["dynk8s:nodePools"] = map[string]any{"name": "x"} }, "dynk8s:nodePools", "list"},
		{"pool name not a DNS label", func(c map[string]any) { pool(c, 0)["name"] = "Builders_X86" }, "dynk8s:nodePools[0].name", "DNS label"},
		{"pool name duplicated", func(c map[string]any) { pool(c, 1)["name"] = "builders-x86" }, "dynk8s:nodePools[1].name", "already"},
		{"pool arch in kernel spelling", func(c map[string]any) { pool(c, 1)["arch"] = "aarch64" }, "dynk8s:nodePools[1].arch", "EC2 names"},
		{"pool without instance types", func(c map[string]any) { pool(c, 0)["instanceTypes"] = []any{} }, "dynk8s:nodePools[0].instanceTypes", "at least one"},
		{"instance type without a size", func(c map[string]any) { pool(c, 0)["instanceTypes"] = []any{"c7i"} }, "dynk8s:nodePools[0].instanceTypes[0]", "family.size"},
		{"instance type listed twice", func(c map[string]any) {
			pool(c, 1)["instanceTypes"] = []any{"c7g.2xlarge", "c7g.2xlarge"}
		}, "dynk8s:nodePools[1].instanceTypes[1]", "listed twice"},
		{"min above max", func(c map[string]any) { pool(c, 0)["minSize"] = 5; pool(c, 0)["maxSize"] = 2 }, "dynk8s:nodePools[0].maxSize", "must be >= minSize (5)"},
		{"negative max", func(c map[string]any) { pool(c, 1)["maxSize"] = -1 }, "dynk8s:nodePools[1].maxSize", "must be >= minSize (0)"},
		{"negative min", func(c map[string]any) { pool(c, 0)["minSize"] = -1 }, "dynk8s:nodePools[0].minSize", ">= 0"},
		{"max not a number", func(c map[string]any) { pool(c, 0)["maxSize"] = "three" }, "dynk8s:nodePools[0].maxSize", "whole number"},
		{"volume too small", func(c map[string]any) { pool(c, 0)["volumeSizeGiB"] = 5 }, "dynk8s:nodePools[0].volumeSizeGiB", "20..16384"},
		{"spot not a boolean", func(c map[string]any) { pool(c, 1)["spot"] = "maybe" }, "dynk8s:nodePools[1].spot", "true or false"},
		{"node-role label", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"node-role.kubernetes.io/worker": ""}
		}, `dynk8s:nodePools[0].labels["node-role.kubernetes.io/worker"]`, "NodeRestriction"},
		{"kubernetes.io label", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"kubernetes.io/team": "ci"}
		}, `dynk8s:nodePools[0].labels["kubernetes.io/team"]`, "NodeRestriction"},
		{"k8s.io label", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"cluster.k8s.io/pool": "ci"}
		}, `dynk8s:nodePools[0].labels["cluster.k8s.io/pool"]`, "NodeRestriction"},
		{"label dynk8s sets itself", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"dynk8s.io/pool": "other"}
		}, `dynk8s:nodePools[0].labels["dynk8s.io/pool"]`, "set by dynk8s"},
		{"label value with space", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"example.com/builder": "x 86"}
		}, `dynk8s:nodePools[0].labels["example.com/builder"]`, "label value"},
		{"label value not a string", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"example.com/cores": 8}
		}, `dynk8s:nodePools[0].labels["example.com/cores"]`, "must be a string"},
		{"label the boot sets", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"topology.kubernetes.io/zone": "eu-central-1a"}
		}, `dynk8s:nodePools[0].labels["topology.kubernetes.io/zone"]`, "set by dynk8s"},
		{"label key not a qualified name", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"-bad": "x"}
		}, "dynk8s:nodePools[0].labels.-bad", "name part"},
		{"label value with a comma", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{"example.com/a": "b,c=d"}
		}, `dynk8s:nodePools[0].labels["example.com/a"]`, "label value"},
		{"taint twice", func(c map[string]any) {
			pool(c, 1)["taints"] = []any{map[string]any{"key": "a", "value": "b", "effect": "NoSchedule"},
				map[string]any{"key": "a", "value": "c", "effect": "NoSchedule"}}
		}, "dynk8s:nodePools[1].taints[1].key", "is already taints[0]"},
		{"taint effect unknown", func(c map[string]any) {
			pool(c, 1)["taints"].([]any)[0].(map[string]any)["effect"] = "NoRun"
		}, "dynk8s:nodePools[1].taints[0].effect", "NoSchedule"},
		{"taint key missing", func(c map[string]any) {
			delete(pool(c, 1)["taints"].([]any)[0].(map[string]any), "key")
		}, "dynk8s:nodePools[1].taints[0].key", "required"},
		{"taint key not a qualified name", func(c map[string]any) {
			pool(c, 1)["taints"].([]any)[0].(map[string]any)["key"] = "ci/builders/arm"
		}, "dynk8s:nodePools[1].taints[0].key", "is not a valid key"},
		{"too many tags for the group", func(c map[string]any) {
			labels := map[string]any{}
			for i := range 45 {
				labels[fmt.Sprintf("example.com/l%02d", i)] = "x"
			}
			pool(c, 0)["labels"] = labels
		}, "dynk8s:nodePools[0].labels", "limit of 50"},
		{"ami id malformed", func(c map[string]any) { pool(c, 0)["amiId"] = "ami-xyz" }, "dynk8s:nodePools[0].amiId", "not an AMI id"},
		{"pre-pull image malformed", func(c map[string]any) {
			pool(c, 0)["prePullImages"] = []any{"quay.io/ok/agent:1", "Not An Image"}
		}, "dynk8s:nodePools[0].prePullImages[1]", "is not an image reference"},
		{"pre-pull images too many", func(c map[string]any) {
			var imgs []any
			for i := range 21 {
				imgs = append(imgs, fmt.Sprintf("quay.io/x/img%d:1", i))
			}
			pool(c, 0)["prePullImages"] = imgs
		}, "dynk8s:nodePools[0].prePullImages", "at most 20 images"},
		{"misspelt pool key", func(c map[string]any) { pool(c, 0)["instanceType"] = "c7i.large" }, "dynk8s:nodePools[0].instanceType", "unknown key"},
		{"autoscaler of another minor", func(c map[string]any) { obj(c, "autoscaler")["version"] = "1.33.6" }, "dynk8s:autoscaler.version", "minor"},
		{"autoscaler version malformed", func(c map[string]any) { obj(c, "autoscaler")["version"] = "latest" }, "dynk8s:autoscaler.version", "exact version"},
		{"scale-down time not a duration", func(c map[string]any) { obj(c, "autoscaler")["scaleDownUnneededTime"] = "ten minutes" }, "dynk8s:autoscaler.scaleDownUnneededTime", "duration"},
		{"expander unknown", func(c map[string]any) { obj(c, "autoscaler")["expander"] = "cheapest" }, "dynk8s:autoscaler.expander", "not a Cluster Autoscaler expander"},
		{"price expander on AWS", func(c map[string]any) { obj(c, "autoscaler")["expander"] = "least-waste,price" }, "dynk8s:autoscaler.expander", "lacks"},
		{"label key too long for an ASG tag", func(c map[string]any) {
			pool(c, 0)["labels"] = map[string]any{strings.Repeat("a", 40) + ".example.com/" + strings.Repeat("b", 50): "x"}
		}, `dynk8s:nodePools[0].labels["` + strings.Repeat("a", 40) + ".example.com/" + strings.Repeat("b", 50) + `"]`, "at most 128"},
		{"taint key too long for an ASG tag", func(c map[string]any) {
			pool(c, 1)["taints"].([]any)[0].(map[string]any)["key"] = strings.Repeat("t", 63) + ".example.com/" + strings.Repeat("s", 20)
		}, "dynk8s:nodePools[1].taints[0].key", "at most 128"},
		{"ipv6 on-prem endpoint", func(c map[string]any) { obj(c, "wireguard")["onPremEndpoint"] = "[2001:db8::1]:51820" }, "dynk8s:wireguard.onPremEndpoint", "IPv4 address only"},
		{"fuse capacity zero", func(c map[string]any) { obj(c, "fuse")["capacity"] = 0 }, "dynk8s:fuse.capacity", "> 0"},
		{"fuse image for unknown arch", func(c map[string]any) {
			obj(c, "fuse")["images"] = map[string]any{"riscv64": "example.com/fuse:v1"}
		}, "dynk8s:fuse.images.riscv64", "unknown arch"},
		{"fuse image not a reference", func(c map[string]any) {
			obj(c, "fuse")["images"] = map[string]any{"arm64": "Example.com/Fuse:v1"}
		}, "dynk8s:fuse.images.arm64", "is not an image reference"},
		{"provision time under the boot's worst case", func(c map[string]any) { obj(c, "autoscaler")["maxNodeProvisionTime"] = "21m" }, "dynk8s:autoscaler.maxNodeProvisionTime", "boot at its worst"},
		{"unready time under the gateway's recovery", func(c map[string]any) { obj(c, "autoscaler")["scaleDownUnreadyTime"] = "10m" }, "dynk8s:autoscaler.scaleDownUnreadyTime", "at least 20m0s"},
		{"max nodes negative", func(c map[string]any) { obj(c, "autoscaler")["maxNodesTotal"] = -1 }, "dynk8s:autoscaler.maxNodesTotal", "0 (no cap)"},
		{"scan interval under a second", func(c map[string]any) { obj(c, "autoscaler")["scanInterval"] = "500ms" }, "dynk8s:autoscaler.scanInterval", "from 1s to 1m0s"},
		{"scan interval over a minute", func(c map[string]any) { obj(c, "autoscaler")["scanInterval"] = "2m" }, "dynk8s:autoscaler.scanInterval", "got 2m0s"},
		{"system pods flag not a boolean", func(c map[string]any) { obj(c, "autoscaler")["skipNodesWithSystemPods"] = "sometimes" }, "dynk8s:autoscaler.skipNodesWithSystemPods", "true or false"},
		{"pool utilization above one", func(c map[string]any) {
			pool(c, 0)["autoscaling"] = map[string]any{"scaleDownUtilizationThreshold": 1.5}
		}, "dynk8s:nodePools[0].autoscaling.scaleDownUtilizationThreshold", "(0, 1]"},
		{"pool unneeded time not a duration", func(c map[string]any) {
			pool(c, 0)["autoscaling"] = map[string]any{"scaleDownUnneededTime": "soon"}
		}, "dynk8s:nodePools[0].autoscaling.scaleDownUnneededTime", "duration"},
		{"warm pool on a spot pool", func(c map[string]any) { pool(c, 1)["warmPool"] = map[string]any{} }, "dynk8s:nodePools[1].warmPool", "on-demand pool of one instance type"},
		{"warm pool on a pool of two types", func(c map[string]any) {
			pool(c, 0)["instanceTypes"] = []any{"c7i.2xlarge", "c6i.2xlarge"}
			pool(c, 0)["warmPool"] = map[string]any{}
		}, "dynk8s:nodePools[0].warmPool", "mixed instances policy"},
		{"warm pool of zero", func(c map[string]any) { pool(c, 0)["warmPool"] = map[string]any{"size": 0} }, "dynk8s:nodePools[0].warmPool.size", "1..maxSize (4)"},
		{"warm pool above maxSize", func(c map[string]any) { pool(c, 0)["warmPool"] = map[string]any{"size": 5} }, "dynk8s:nodePools[0].warmPool.size", "1..maxSize (4)"},
		{"warm pool state unknown", func(c map[string]any) { pool(c, 0)["warmPool"] = map[string]any{"state": "stopped"} }, "dynk8s:nodePools[0].warmPool.state", "Stopped, Hibernated or Running"},
		{"image unknown", func(c map[string]any) { pool(c, 1)["image"] = "Baked" }, "dynk8s:nodePools[1].image", `must be stock or baked, got "Baked"`},
		{"baked image with amiId", func(c map[string]any) {
			pool(c, 0)["image"] = "baked"
			pool(c, 0)["amiId"] = "ami-0123456789abcdef0"
		}, "dynk8s:nodePools[0].image", "set one of them"},
		{"warm pool reuse on scale-in", func(c map[string]any) {
			pool(c, 0)["warmPool"] = map[string]any{"reuseOnScaleIn": true}
		}, "dynk8s:nodePools[0].warmPool.reuseOnScaleIn", "cordoned, tainted Node"},
		{"warm pool key misspelt", func(c map[string]any) { pool(c, 0)["warmPool"] = map[string]any{"sise": 1} }, "dynk8s:nodePools[0].warmPool.sise", "unknown key"},
		{"warm pool not a map", func(c map[string]any) { pool(c, 0)["warmPool"] = 2 }, "dynk8s:nodePools[0].warmPool", "must be a map"},
		{"cache too large", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"sizeGiB": 20000} }, "dynk8s:nodePools[0].cache.sizeGiB", "1..16384"},
		{"cache iops per GiB", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"sizeGiB": 10, "iops": 6000} }, "dynk8s:nodePools[0].cache.iops", "at most 500 per GiB of sizeGiB (5000)"},
		{"cache throughput per iops", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"throughput": 1000} }, "dynk8s:nodePools[0].cache.throughput", "at most a quarter of iops (750 MiB/s)"},
		{"cache under the kubelet", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"mountPath": "/var/lib/kubelet/cache"} }, "dynk8s:nodePools[0].cache.mountPath", "is under /var/lib/kubelet"},
		{"cache at the root", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"mountPath": "/"} }, "dynk8s:nodePools[0].cache.mountPath", "a clean absolute path"},
		{"cache relative", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"mountPath": "cache"} }, "dynk8s:nodePools[0].cache.mountPath", "a clean absolute path"},
		{"cache idle days", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"maxIdleDays": 0} }, "dynk8s:nodePools[0].cache.maxIdleDays", "1..3650"},
		{"cache volumes negative", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"maxVolumes": -1} }, "dynk8s:nodePools[0].cache.maxVolumes", "0 (the pool's maxSize) or more"},
		{"cache key misspelt", func(c map[string]any) { pool(c, 0)["cache"] = map[string]any{"size": 100} }, "dynk8s:nodePools[0].cache.size", "unknown key"},
		{"hibernated on the stock image", func(c map[string]any) {
			pool(c, 0)["warmPool"] = map[string]any{"state": "Hibernated"}
		}, "dynk8s:nodePools[0].warmPool.state", "set amiId"},
		{"cleanup under five minutes", func(c map[string]any) { obj(c, "cleanup")["notReadyAfter"] = "2m" }, "dynk8s:cleanup.notReadyAfter", "at least 5m"},
		{"cleanup not a duration", func(c map[string]any) { obj(c, "cleanup")["notReadyAfter"] = "soon" }, "dynk8s:cleanup.notReadyAfter", "duration"},
		{"token ttl under the floor", func(c map[string]any) { obj(c, "kubernetes")["bootstrapTokenTTL"] = "29m" }, "dynk8s:kubernetes.bootstrapTokenTTL", "must be 30m..24h, got 29m"},
		{"token ttl above kubeadm's default", func(c map[string]any) { obj(c, "kubernetes")["bootstrapTokenTTL"] = "25h" }, "dynk8s:kubernetes.bootstrapTokenTTL", "must be 30m..24h, got 25h"},
		{"token ttl not a duration", func(c map[string]any) { obj(c, "kubernetes")["bootstrapTokenTTL"] = "two hours" }, "dynk8s:kubernetes.bootstrapTokenTTL", "duration"},
		{"token ttl a bare number", func(c map[string]any) { obj(c, "kubernetes")["bootstrapTokenTTL"] = 7200 }, "dynk8s:kubernetes.bootstrapTokenTTL", "duration"},
		{"removed Session Manager option", func(c map[string]any) { obj(c, "identity")["sessionManager"] = true }, "dynk8s:identity.sessionManager", "EC2 Instance Connect"},
		{"removed ECR option", func(c map[string]any) { obj(c, "identity")["ecrReadOnly"] = false }, "dynk8s:identity.ecrReadOnly", "ecr-credential-provider"},
		{"kubeconfig empty", func(c map[string]any) { obj(c, "kubernetes")["kubeconfig"] = " " }, "dynk8s:kubernetes.kubeconfig", "empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := devConfig(t)
			tc.mutate(c)
			cfg, err := parse(t, c)
			assert.Assert(t, cfg == nil, "a refused config yields no Config")
			var cfgErr *config.Error
			assert.Assert(t, errors.As(err, &cfgErr), "want a *ConfigError, got %v", err)
			assert.Equal(t, len(cfgErr.Errors), 1, "want exactly one problem, got:\n%v", err)
			assert.Equal(t, cfgErr.Errors[0].Path, tc.path)
			assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, tc.msg))
			assert.Check(t, is.Contains(err.Error(), tc.path+": "), "the message names the key path")
		})
	}
}

// TestWarmPool: an empty warmPool takes its defaults, the pools without one keep none, and a hibernated pool's
// template node leaves the RAM's room on the root volume out of its ephemeral storage.
func TestWarmPool(t *testing.T) {
	c := devConfig(t)
	pool(c, 0)["warmPool"] = map[string]any{}
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	assert.DeepEqual(t, cfg.NodePools[0].WarmPool, &config.WarmPool{Size: 1, State: config.WarmStopped})
	assert.Equal(t, cfg.NodePools[0].WarmInstances(), 1)
	assert.Check(t, cfg.NodePools[1].WarmPool == nil)
	assert.Equal(t, cfg.NodePools[1].WarmInstances(), 0)

	storage := func(cfg *config.Config) string {
		// A c7i.2xlarge, as EC2 describes it.
		for _, tag := range cfg.GroupTags(cfg.NodePools[0], config.InstanceType{VCPU: 8, MemoryMiB: 16384}) {
			if tag.Key == "k8s.io/cluster-autoscaler/node-template/resources/ephemeral-storage" {
				return tag.Value
			}
		}
		return ""
	}
	assert.Equal(t, storage(cfg), "63Gi", "(80 GiB - 10 GiB of OS) less the 10% eviction threshold")
	pool(c, 0)["warmPool"] = map[string]any{"size": 4, "state": "Hibernated"}
	pool(c, 0)["amiId"] = "ami-0123456789abcdef0"
	cfg, err = parse(t, c)
	assert.NilError(t, err)
	assert.Equal(t, cfg.NodePools[0].WarmInstances(), 4)
	assert.Equal(t, storage(cfg), "48Gi", "a c7i.2xlarge's 16 GiB of RAM held back too")
}

// TestBootstrapTokenTTLBounds: both bounds are accepted, and the rotation period is a third of the TTL in whole
// minutes.
func TestBootstrapTokenTTLBounds(t *testing.T) {
	for ttl, period := range map[string]time.Duration{"30m": 10 * time.Minute, "24h": 8 * time.Hour,
		"2h": 40 * time.Minute, "100m": 33 * time.Minute} {
		c := devConfig(t)
		obj(c, "kubernetes")["bootstrapTokenTTL"] = ttl
		cfg, err := parse(t, c)
		assert.NilError(t, err, ttl)
		assert.Equal(t, config.BootstrapTokenRotationPeriod(cfg.Kubernetes.BootstrapTokenTTL), period, ttl)
	}
}

// TestBootstrapTokenTTLFloorOutlivesAJoin: SSM holds a token at most one rotation period old, so with the smallest
// TTL allowed a node that reads it just before the next rotation still has more than its whole join deadline. Raise
// the floor if the join timeout grows.
func TestBootstrapTokenTTLFloorOutlivesAJoin(t *testing.T) {
	ttl := config.MinBootstrapTokenTTL
	left := ttl - config.BootstrapTokenRotationPeriod(ttl)
	join := nodeconfig.DefaultDeadlines.UnitTimeout()
	assert.Check(t, left > join, "a %s token read one period (%s) after it was issued has %s left, "+
		"not more than the join unit's timeout %s", ttl, config.BootstrapTokenRotationPeriod(ttl), left, join)
}

// TestPoolAutoscalingOptionsBecomeTags: the autoscaler reads per-group options from the group's tags.
func TestPoolAutoscalingOptionsBecomeTags(t *testing.T) {
	c := devConfig(t)
	pool(c, 1)["autoscaling"] = map[string]any{"scaleDownUnneededTime": "3m", "scaleDownUtilizationThreshold": 0.25}
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	tags := map[string]string{}
	for _, tag := range cfg.GroupTags(cfg.NodePools[1], config.InstanceType{}) {
		tags[tag.Key] = tag.Value
	}
	const prefix = "k8s.io/cluster-autoscaler/node-template/autoscaling-options/"
	assert.Equal(t, tags[prefix+"scaledownunneededtime"], "3m0s")
	assert.Equal(t, tags[prefix+"scaledownutilizationthreshold"], "0.25")
	for _, tag := range cfg.GroupTags(cfg.NodePools[0], config.InstanceType{}) {
		assert.Check(t, !strings.HasPrefix(tag.Key, prefix), "pool 0 sets no option: %s", tag.Key)
	}
}

// TestExpandersForAWS: every expander the AWS provider runs is accepted, alone and chained (the priority expander
// with a rank on every pool).
func TestExpandersForAWS(t *testing.T) {
	for _, e := range []string{"least-nodes", "least-waste", "most-pods", "priority", "random", "priority,least-waste"} {
		c := devConfig(t)
		obj(c, "autoscaler")["expander"] = e
		if strings.Contains(e, "priority") {
			pool(c, 0)["autoscaling"] = map[string]any{"priority": 10}
			pool(c, 1)["autoscaling"] = map[string]any{"priority": 20}
		}
		_, err := parse(t, c)
		assert.NilError(t, err, e)
	}
}

// TestPriorityExpanderRanks: with the priority expander every pool needs a rank, each error naming the pool's key;
// a rank without the expander, and a negative one, are refused too.
func TestPriorityExpanderRanks(t *testing.T) {
	c := devConfig(t)
	obj(c, "autoscaler")["expander"] = "priority,least-waste"
	_, err := parse(t, c)
	assert.ErrorContains(t, err, "dynk8s:nodePools[0].autoscaling.priority: is required with autoscaler.expander")
	assert.ErrorContains(t, err, "dynk8s:nodePools[1].autoscaling.priority: is required")

	pool(c, 1)["autoscaling"] = map[string]any{"priority": 20}
	_, err = parse(t, c)
	assert.ErrorContains(t, err, "dynk8s:nodePools[0].autoscaling.priority: is required")
	assert.Check(t, !strings.Contains(err.Error(), "nodePools[1].autoscaling.priority"), err.Error())

	pool(c, 0)["autoscaling"] = map[string]any{"priority": -1}
	_, err = parse(t, c)
	assert.ErrorContains(t, err, "dynk8s:nodePools[0].autoscaling.priority: must be 0 or more, got -1")

	pool(c, 0)["autoscaling"] = map[string]any{"priority": 10}
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	assert.Equal(t, *cfg.NodePools[0].Autoscaling.Priority, 10)
	assert.Equal(t, *cfg.NodePools[1].Autoscaling.Priority, 20)

	obj(c, "autoscaler")["expander"] = "least-waste"
	_, err = parse(t, c)
	assert.ErrorContains(t, err, "dynk8s:nodePools[0].autoscaling.priority: ranks the pool for the priority "+
		"expander, which autoscaler.expander \"least-waste\" does not use")
}

// TestUnknownTopLevelKey: a key of the dynk8s namespace that the program does not read is refused at the top level,
// as a misspelt key inside a section is, with the known keys; keys of other namespaces are others' to read.
func TestUnknownTopLevelKey(t *testing.T) {
	c := devConfig(t)
	c["dynk8s:autoscalr"] = map[string]any{"expander": "random"}
	_, err := parse(t, c)
	var cfgErr *config.Error
	assert.Assert(t, errors.As(err, &cfgErr), "a misspelt top-level key passed: %v", err)
	assert.Equal(t, len(cfgErr.Errors), 1, err.Error())
	assert.Equal(t, cfgErr.Errors[0].Path, "dynk8s:autoscalr")
	assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, "unknown key: did you mean autoscaler? (known keys here: agent, autoscaler, cleanup, clusterName, fedora"))

	c = devConfig(t)
	c["dynk8s:clustername"] = "lab" // the wrong case: keys are case-sensitive
	_, err = parse(t, c)
	assert.ErrorContains(t, err, "dynk8s:clustername: unknown key")

	// A namespace a typo or two away from dynk8s would drop its whole section unread (newcomer review).
	for _, key := range []string{"dynk8:autoscaler", "dnyk8s:autoscaler", "Dynk8s:autoscaler", "dynk88s:autoscaler"} {
		c = devConfig(t)
		c[key] = map[string]any{"expander": "random"}
		_, err = parse(t, c)
		assert.Assert(t, errors.As(err, &cfgErr), "%s passed: %v", key, err)
		assert.Check(t, is.Equal(cfgErr.Errors[0].Path, key))
		assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, "did you mean dynk8s:autoscaler?"), key)
	}

	c = devConfig(t)
	c["aws:profile"] = "lab"
	c["kubernetes:context"] = "lab"
	c["pulumi:tags"] = map[string]any{"team": "infra"}
	c["random:seed"] = "x"
	_, err = parse(t, c)
	assert.NilError(t, err, "other namespaces are not dynk8s's to refuse")
}

// TestPrivateRangesAccepted: the private ranges (RFC 1918, RFC 6598) pass as on-prem and tunnel ranges; a public
// on-prem range passes when the stack says so; a public endpoint and a name pass.
func TestPrivateRangesAccepted(t *testing.T) {
	for name, mutate := range map[string]func(map[string]any){
		"all of RFC 1918": func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.0.0/16", "172.16.0.0/12"}
		},
		"shared address space": func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "100.64.0.0/16"}
			obj(c, "wireguard")["tunnelCidr"] = "100.127.255.252/30"
		},
		"public on-prem range, opted in": func(c map[string]any) {
			obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.10.0/24", "8.8.8.0/24"}
			obj(c, "wireguard")["allowPublicOnPremCidrs"] = true
		},
		"public endpoint":   func(c map[string]any) { obj(c, "wireguard")["onPremEndpoint"] = "198.51.100.20:51820" },
		"endpoint by name":  func(c map[string]any) { obj(c, "wireguard")["onPremEndpoint"] = "vpn.example.org:51820" },
		"shared-space pods": func(c map[string]any) { obj(c, "kubernetes")["podCidr"] = "100.96.0.0/11" },
	} {
		t.Run(name, func(t *testing.T) {
			c := devConfig(t)
			mutate(c)
			_, err := parse(t, c)
			assert.NilError(t, err)
		})
	}
}

// TestFixedSizePool: minSize == maxSize is a pool of fixed size, and a valid one; only maxSize < minSize is refused.
func TestFixedSizePool(t *testing.T) {
	for _, n := range []int{1, 3, 1000} {
		c := devConfig(t)
		pool(c, 0)["minSize"], pool(c, 0)["maxSize"] = n, n
		cfg, err := parse(t, c)
		assert.NilError(t, err, "minSize = maxSize = %d", n)
		assert.Equal(t, cfg.NodePools[0].MinSize, n)
		assert.Equal(t, cfg.NodePools[0].MaxSize, n)
	}
}

// TestEveryProblemReportedAtOnce: three independent mistakes give three errors, in key order.
func TestEveryProblemReportedAtOnce(t *testing.T) {
	c := devConfig(t)
	pool(c, 1)["maxSize"] = -1
	obj(c, "wireguard")["mtu"] = 100
	c["dynk8s:clusterName"] = "Bad Name"
	_, err := parse(t, c)
	var cfgErr *config.Error
	assert.Assert(t, errors.As(err, &cfgErr))
	var paths []string
	for _, e := range cfgErr.Errors {
		paths = append(paths, e.Path)
	}
	assert.DeepEqual(t, paths, []string{
		"dynk8s:clusterName", "dynk8s:nodePools[1].maxSize", "dynk8s:wireguard.mtu",
	})
	assert.Check(t, is.Contains(err.Error(), "dynk8s:nodePools[1].maxSize: must be >= minSize (0)"))
	assert.Check(t, is.Contains(err.Error(), "3 problems"))
}

// TestRequiredTagsAreRequired: the `required` tag, which the configuration reference shows, is what validation
// enforces: a valid config without a key so tagged fails on that key with "is required", and one without any other
// key does not.
func TestRequiredTagsAreRequired(t *testing.T) {
	full := func() map[string]any {
		values := devConfig(t)
		wg := obj(values, "wireguard")
		wg["onPremForward"] = map[string]any{"mode": "cluster", "allow": []any{
			map[string]any{"cidr": wg["onPremCidrs"].([]any)[0]},
		}}
		return values
	}
	_, err := parse(t, full())
	assert.NilError(t, err, "the fixture must be valid")
	required := 0
	for _, k := range config.Keys() {
		values := full()
		if !deleteKey(values, k.Path) {
			continue // a key the fixture does not set
		}
		_, err := parse(t, values)
		var cfgErr *config.Error
		missing := errors.As(err, &cfgErr) && slices.ContainsFunc(cfgErr.Errors, func(e config.FieldError) bool {
			return strings.ReplaceAll(e.Path, "[0]", "[i]") == k.Path && strings.HasPrefix(e.Msg, "is required") &&
				!strings.HasPrefix(e.Msg, "is required with") // required with another key: optional alone
		})
		assert.Check(t, missing == k.Required, "%s: tagged required %v, but without it the config gives %v",
			k.Path, k.Required, err)
		if k.Required {
			required++
		}
	}
	assert.Check(t, required >= 10, "only %d required keys checked", required)
}

// deleteKey removes the key at path (list entries as [i], the first entry taken) from a stack's config map.
func deleteKey(values map[string]any, path string) bool {
	ns, rest, _ := strings.Cut(path, ":")
	top, rest, nested := strings.Cut(rest, ".")
	top, list := strings.CutSuffix(top, "[i]")
	if !nested {
		_, ok := values[ns+":"+top]
		delete(values, ns+":"+top)
		return ok && !list
	}
	node := values[ns+":"+top]
	if list {
		entries, _ := node.([]any)
		if len(entries) == 0 {
			return false
		}
		node = entries[0]
	}
	segments := strings.Split(rest, ".")
	for _, seg := range segments[:len(segments)-1] {
		m, _ := node.(map[string]any)
		name, list := strings.CutSuffix(seg, "[i]")
		node = m[name]
		if list {
			entries, _ := node.([]any)
			if len(entries) == 0 {
				return false
			}
			node = entries[0]
		}
	}
	m, ok := node.(map[string]any)
	last := segments[len(segments)-1]
	if _, set := m[last]; !ok || !set {
		return false
	}
	delete(m, last)
	return true
}

// TestStackFileIsReadAsPulumiReadsIt: the stack file reader parses YAML as the Pulumi CLI does (gopkg.in/yaml.v3,
// YAML 1.2's scalars), so what the offline plan accepts is what `pulumi preview` accepts: `spot: yes` is the string
// "yes" and refused as a boolean, a key given twice is an error, and `spot: true` still reads.
func TestStackFileIsReadAsPulumiReadsIt(t *testing.T) {
	dev, err := os.ReadFile("../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	read := func(t *testing.T, text string) (map[string]any, error) {
		path := filepath.Join(t.TempDir(), "Pulumi.test.yaml")
		assert.NilError(t, os.WriteFile(path, []byte(text), 0o600))
		return config.ReadStackFile(path)
	}
	spot := regexp.MustCompile(`(?m)^(\s+)spot: (true|false)$`)
	assert.Assert(t, spot.Match(dev), "Pulumi.dev.yaml sets no pool's spot")

	values, err := read(t, spot.ReplaceAllString(string(dev), "${1}spot: yes"))
	assert.NilError(t, err)
	i := slices.IndexFunc(values["dynk8s:nodePools"].([]any), func(p any) bool { return p.(map[string]any)["spot"] != nil })
	assert.Check(t, is.Equal(mockcloud.Pool(values, i)["spot"], "yes"), "YAML 1.1's yes read as a boolean")
	_, err = parse(t, values)
	assert.Check(t, is.ErrorContains(err, fmt.Sprintf("dynk8s:nodePools[%d].spot", i)))

	_, err = read(t, strings.Replace(string(dev), "\n  dynk8s:clusterName:", "\n  aws:region: eu-west-1\n  dynk8s:clusterName:", 1))
	assert.Check(t, is.ErrorContains(err, `mapping key "aws:region" already defined`))

	values, err = read(t, string(dev))
	assert.NilError(t, err)
	_, err = parse(t, values)
	assert.NilError(t, err)
}

// A pool's cache, set as an empty map, takes gp3's baseline, the default mount path and idle days, and keeps at most
// the pool's maxSize volumes; without one the pool keeps none.
func TestCacheDefaults(t *testing.T) {
	c := map[string]any{
		"aws:region":         "eu-central-1",
		"dynk8s:clusterName": "lab",
		"dynk8s:kubernetes": map[string]any{
			"version": "1.34.4", "apiServerEndpoint": "192.168.1.10:6443", "podCidr": "10.244.0.0/16",
		},
		"dynk8s:wireguard": map[string]any{"onPremCidrs": []any{"192.168.1.0/24"}},
		"dynk8s:fedora":    map[string]any{"release": 42},
		"dynk8s:nodePools": []any{
			map[string]any{"name": "x", "arch": "x86_64", "instanceTypes": []any{"m7i.large"}, "maxSize": 5,
				"cache": map[string]any{}},
			map[string]any{"name": "y", "arch": "x86_64", "instanceTypes": []any{"m7i.large"},
				"cache": map[string]any{"maxVolumes": 2}},
			map[string]any{"name": "z", "arch": "x86_64", "instanceTypes": []any{"m7i.large"}},
		},
	}
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	assert.DeepEqual(t, *cfg.NodePools[0].Cache, config.Cache{SizeGiB: 100, IOPS: 3000, Throughput: 125,
		MountPath: "/var/lib/dynk8s-cache", MaxIdleDays: 14})
	assert.Equal(t, cfg.NodePools[0].CacheVolumes(), 5)
	assert.Equal(t, cfg.NodePools[1].CacheVolumes(), 2)
	assert.Check(t, cfg.NodePools[2].Cache == nil)
	assert.Equal(t, cfg.NodePools[2].CacheVolumes(), 0)
}

package infra_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/wireguard"
)

// runStack runs the whole program under the mock engine with the given config map.
func runStack(t *testing.T, values map[string]any) *plan.Result {
	t.Helper()
	cfg, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	res, err := plan.RunConfig("dev", cfg)
	assert.NilError(t, err)
	return res
}

// in reads an input of a recorded resource as plain data, secrets revealed.
func in(r *mockcloud.Resource, key string) any {
	return mockcloud.Plain(r.Inputs[resource.PropertyKey(key)], true)
}

func find(t *testing.T, res *plan.Result, typ, name string) *mockcloud.Resource {
	t.Helper()
	r := res.Cloud.Find(typ, name)
	assert.Assert(t, r != nil, "no %s named %s", typ, name)
	return r
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asList(v any) []any         { l, _ := v.([]any); return l }

func TestNodePoolLaunchTemplates(t *testing.T) {
	res := runStack(t, devConfig(t))
	for _, pool := range []string{"builders-x86", "builders-arm"} {
		t.Run(pool, func(t *testing.T) {
			lt := find(t, res, "aws:ec2/launchTemplate:LaunchTemplate", "pool-"+pool+"-lt")
			assert.Equal(t, lt.Parent, "pool-"+pool)
			md := asMap(in(lt, "metadataOptions"))
			assert.Equal(t, md["httpTokens"], "required")
			assert.Equal(t, md["httpPutResponseHopLimit"], float64(1))
			bdm := asList(in(lt, "blockDeviceMappings"))
			assert.Equal(t, len(bdm), 1)
			assert.Equal(t, asMap(bdm[0])["deviceName"], "/dev/sda1", "the image's own root device")
			ebs := asMap(asMap(bdm[0])["ebs"])
			assert.Equal(t, ebs["encrypted"], "true")
			assert.Equal(t, ebs["deleteOnTermination"], "true")
			assert.Equal(t, ebs["volumeType"], "gp3")
			assert.Equal(t, ebs["volumeSize"], float64(80))
			assert.Check(t, in(lt, "keyName") == nil, "no SSH key by default")
			assert.Check(t, len(asList(in(lt, "vpcSecurityGroupIds"))) == 1)
			assert.Check(t, in(lt, "iamInstanceProfile") != nil)
			specs := asList(in(lt, "tagSpecifications"))
			var kinds []string
			for _, s := range specs {
				kinds = append(kinds, asMap(s)["resourceType"].(string))
			}
			assert.DeepEqual(t, kinds, []string{"instance", "volume"})

			userData, ok := in(lt, "userData").(string)
			assert.Assert(t, ok && userData != "", "user data present")
			raw, err := cloudinit.Decode(userData)
			assert.NilError(t, err)
			assert.Check(t, bytes.HasPrefix(raw, []byte("#cloud-config\n")))
		})
	}
}

// Each pool's user data pins the agent object of its architecture: the bucket's name, the key, the object's
// version and its sha256 (the plan's stand-in here), as the agent bucket declared them.
func TestNodePoolsPinTheAgentOfTheirArch(t *testing.T) {
	res := runStack(t, devConfig(t))
	bucket := find(t, res, "aws:s3/bucketV2:BucketV2", "agent").ID
	for pool, arch := range map[string]string{"builders-x86": "amd64", "builders-arm": "arm64"} {
		object := find(t, res, "aws:s3/bucketObjectv2:BucketObjectv2", "agent-linux-"+arch)
		raw, err := cloudinit.Decode(in(find(t, res, "aws:ec2/launchTemplate:LaunchTemplate", "pool-"+pool+"-lt"),
			"userData").(string))
		assert.NilError(t, err)
		files, err := cloudinit.Files(raw)
		assert.NilError(t, err)
		i := slices.IndexFunc(files, func(f cloudinit.File) bool { return f.Path == "/etc/dynk8s/agent.env" })
		assert.Assert(t, i >= 0, "%s: no agent.env", pool)
		assert.Check(t, is.Equal(files[i].Content, "DYNK8S_AGENT_BUCKET="+bucket+"\n"+
			"DYNK8S_AGENT_DEADLINE_SECONDS="+strconv.Itoa(int(nodeconfig.NodeAgentFetch.Seconds()))+"\n"+
			"DYNK8S_AGENT_KEY=dynk8s-node/linux-"+arch+"\n"+
			"DYNK8S_AGENT_SHA256="+infra.StandInSHA256+"\n"+
			"DYNK8S_AGENT_VERSION_ID="+object.Outputs["versionId"].StringValue()+"\n"), pool)
	}
}

// The gateway runs the agent of its own architecture, which the bucket holds even when no pool shares it (the dev
// gateway is a t4g, arm64; here only the x86 pool is left): its user data pins that object, and its role may read
// exactly that key, the node role exactly its pools'.
func TestGatewayPinsTheAgentOfItsArch(t *testing.T) {
	c := devConfig(t)
	c["dynk8s:nodePools"] = c["dynk8s:nodePools"].([]any)[:1]
	res := runStack(t, c)
	bucket := find(t, res, "aws:s3/bucketV2:BucketV2", "agent").ID
	object := find(t, res, "aws:s3/bucketObjectv2:BucketObjectv2", "agent-linux-arm64")
	raw, err := cloudinit.Decode(in(find(t, res, "aws:ec2/instance:Instance", "gateway"), "userDataBase64").(string))
	assert.NilError(t, err)
	files, err := cloudinit.Files(raw)
	assert.NilError(t, err)
	i := slices.IndexFunc(files, func(f cloudinit.File) bool { return f.Path == "/etc/dynk8s/agent.env" })
	assert.Assert(t, i >= 0, "the gateway has no agent.env")
	assert.Check(t, is.Equal(files[i].Content, "DYNK8S_AGENT_BUCKET="+bucket+"\n"+
		"DYNK8S_AGENT_DEADLINE_SECONDS=300\n"+
		"DYNK8S_AGENT_KEY=dynk8s-node/linux-arm64\n"+
		"DYNK8S_AGENT_SHA256="+infra.StandInSHA256+"\n"+
		"DYNK8S_AGENT_VERSION_ID="+object.Outputs["versionId"].StringValue()+"\n"))
	arn := func(arch string) []string { return []string{"arn:aws:s3:::" + bucket + "/dynk8s-node/linux-" + arch} }
	gateway := find(t, res, "aws:iam/rolePolicy:RolePolicy", "agent-gateway-read")
	assert.Check(t, is.Equal(in(gateway, "role"), find(t, res, "aws:iam/role:Role", "identity-gateway-role").Outputs["name"].StringValue()))
	assert.Check(t, is.DeepEqual(policy(t, gateway, "policy").Statement[0].Resource, arn("arm64")))
	node := find(t, res, "aws:iam/rolePolicy:RolePolicy", "agent-node-read")
	assert.Check(t, is.DeepEqual(policy(t, node, "policy").Statement[0].Resource, arn("amd64")))
}

// A pool's nodes pre-pull the fuse plugin's image for their arch and the pool's own prePullImages.
func TestNodesPrePullPluginAndPoolImages(t *testing.T) {
	c := devConfig(t)
	pool(c, 1)["prePullImages"] = []any{"quay.io/jenkins/agent:3.1"}
	res := runStack(t, c)
	for name, want := range map[string][]string{
		"builders-x86": {"registry.k8s.io/pause:3.10.2", "registry.k8s.io/kube-proxy:v1.36.3",
			"docker.io/soolaugust/fuse-device-plugin:v1.0"},
		"builders-arm": {"registry.k8s.io/pause:3.10.2", "registry.k8s.io/kube-proxy:v1.36.3",
			"docker.io/soolaugust/fuse-device-plugin:v1.1", "quay.io/jenkins/agent:3.1"},
	} {
		got := poolNodeConfig(t, find(t, res, "aws:ec2/launchTemplate:LaunchTemplate", "pool-"+name+"-lt")).PrePullImages
		assert.Check(t, is.DeepEqual(got, want), name)
	}
}

func TestFedoraImageLookup(t *testing.T) {
	res := runStack(t, devConfig(t))
	var lookups []map[string]any
	for _, c := range res.Cloud.Calls() {
		if c.Token == "aws:ec2/getAmi:getAmi" {
			lookups = append(lookups, mockcloud.PlainMap(c.Args, true))
		}
	}
	assert.Equal(t, len(lookups), 3, "one per pool and one for the gateway")
	archs := map[string]bool{}
	for _, l := range lookups {
		assert.DeepEqual(t, l["owners"], []any{infra.FedoraOwner})
		assert.Equal(t, l["mostRecent"], true)
		filters := map[string]string{}
		for _, f := range asList(l["filters"]) {
			filters[asMap(f)["name"].(string)] = asList(asMap(f)["values"])[0].(string)
		}
		archs[filters["architecture"]] = true
		assert.Equal(t, filters["virtualization-type"], "hvm")
		assert.Equal(t, filters["root-device-type"], "ebs")
		assert.Equal(t, filters["state"], "available")
		nameArch := map[string]string{"x86_64": "x86_64", "arm64": "aarch64"}[filters["architecture"]]
		assert.Equal(t, filters["name"], "Fedora-Cloud-Base-AmazonEC2."+nameArch+"-44-*")
		assert.Check(t, is.Contains(l["nameRegex"].(string), "-44-"))
	}
	assert.DeepEqual(t, archs, map[string]bool{"x86_64": true, "arm64": true})
}

func TestAutoScalingGroups(t *testing.T) {
	res := runStack(t, devConfig(t))
	x86 := find(t, res, "aws:autoscaling/group:Group", "pool-builders-x86-asg")
	arm := find(t, res, "aws:autoscaling/group:Group", "pool-builders-arm-asg")

	for _, g := range []*mockcloud.Resource{x86, arm} {
		_, hasDesired := g.Inputs["desiredCapacity"]
		assert.Check(t, !hasDesired, "%s: desiredCapacity must never be set", g.Name)
		assert.Check(t, is.Contains(g.IgnoreChanges, "desiredCapacity"), "%s", g.Name)
		assert.Equal(t, len(asList(in(g, "vpcZoneIdentifiers"))), 2, "a subnet per zone")
		assert.Check(t, in(g, "instanceRefresh") == nil, "no instance refresh by default")
		assert.DeepEqual(t, in(g, "suspendedProcesses"), []any{"AZRebalance"})
	}
	assert.Equal(t, in(x86, "minSize"), float64(0))
	assert.Equal(t, in(x86, "maxSize"), float64(4))
	assert.Equal(t, in(arm, "maxSize"), float64(6))

	// On-demand single type: the launch template at its newest version number, never "$Latest".
	lt := asMap(in(x86, "launchTemplate"))
	assert.Equal(t, lt["version"], "1")
	assert.Check(t, in(x86, "mixedInstancesPolicy") == nil)

	// Spot: mixed instances, no on-demand, price-capacity-optimized.
	assert.Check(t, in(arm, "launchTemplate") == nil)
	mip := asMap(in(arm, "mixedInstancesPolicy"))
	dist := asMap(mip["instancesDistribution"])
	assert.Equal(t, dist["onDemandBaseCapacity"], float64(0))
	assert.Equal(t, dist["onDemandPercentageAboveBaseCapacity"], float64(0))
	assert.Equal(t, dist["spotAllocationStrategy"], "price-capacity-optimized")
	spec := asMap(asMap(mip["launchTemplate"])["launchTemplateSpecification"])
	assert.Equal(t, spec["version"], "1")
	var types []any
	for _, o := range asList(asMap(mip["launchTemplate"])["overrides"]) {
		types = append(types, asMap(o)["instanceType"])
	}
	assert.DeepEqual(t, types, []any{"c7g.2xlarge", "c6g.2xlarge"})
}

// TestGroupTerminationsDrain: nothing the group itself terminates (Capacity Rebalancing, instance refresh, health
// replacement, a lowered maxSize) goes without a drain. Capacity Rebalancing is off: it launches a replacement and
// then terminates the at-risk node without notice. Every group holds terminating instances in Terminating:Wait for
// longer than the termination handler's drain, which it starts when IMDS shows the target lifecycle state
// Terminated.
func TestGroupTerminationsDrain(t *testing.T) {
	res := runStack(t, devConfig(t))
	for _, g := range res.Cloud.ByType("aws:autoscaling/group:Group") {
		assert.Check(t, in(&g, "capacityRebalance") != true, "%s: capacity rebalancing terminates without a drain", g.Name)
		// A hook resource of its own: a group's initialLifecycleHooks apply only when the group is created.
		hook := find(t, res, "aws:autoscaling/lifecycleHook:LifecycleHook", strings.TrimSuffix(g.Name, "-asg")+"-drain")
		assert.Equal(t, in(hook, "autoscalingGroupName"), mockcloud.Plain(g.Outputs["name"], true))
		assert.Equal(t, in(hook, "lifecycleTransition"), "autoscaling:EC2_INSTANCE_TERMINATING")
		assert.Equal(t, in(hook, "defaultResult"), "CONTINUE", "a node that cannot drain is still terminated")
		assert.Check(t, in(hook, "heartbeatTimeout").(float64) > float64(config.DrainGraceSeconds),
			"%s: the hook must outlast the drain", g.Name)
	}
	ds := find(t, res, "kubernetes:apps/v1:DaemonSet", "addons-nth")
	env := map[string]any{}
	for _, e := range asList(dig(in(ds, "spec"), "template", "spec", "containers", 0, "env")) {
		env[asMap(e)["name"].(string)] = asMap(e)["value"]
	}
	assert.Equal(t, env["ENABLE_ASG_LIFECYCLE_DRAINING"], "true", "the handler drains on the target lifecycle state")
	assert.Equal(t, env["NODE_TERMINATION_GRACE_PERIOD"], strconv.Itoa(config.DrainGraceSeconds))
	// Scheduled maintenance and group terminations hit on-demand nodes too: the handler runs on every pool node.
	spec := asMap(dig(in(ds, "spec"), "template", "spec"))
	_, spotOnly := asMap(spec["nodeSelector"])["dynk8s.io/capacity-type"]
	assert.Check(t, !spotOnly, "the handler must not be limited to spot nodes")
}

// dig walks maps and lists of plain data.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			v = asMap(v)[k]
		case int:
			l := asList(v)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func groupTags(g *mockcloud.Resource) map[string]string {
	out := map[string]string{}
	for _, tag := range asList(in(g, "tags")) {
		m := asMap(tag)
		out[m["key"].(string)] = m["value"].(string)
		if strings.HasPrefix(m["key"].(string), "k8s.io/") && m["propagateAtLaunch"] != false {
			out["!propagated:"+m["key"].(string)] = "true"
		}
	}
	return out
}

func TestAutoscalerTags(t *testing.T) {
	res := runStack(t, devConfig(t))
	arm := groupTags(find(t, res, "aws:autoscaling/group:Group", "pool-builders-arm-asg"))
	want := map[string]string{
		"Name":                              "homelab-builders-arm",
		"dynk8s:cluster":                    "homelab",
		"dynk8s:pool":                       "builders-arm",
		"k8s.io/cluster-autoscaler/enabled": "true",
		"k8s.io/cluster-autoscaler/homelab": "owned",
		"k8s.io/cluster-autoscaler/node-template/label/example.com/builder":              "aarch64",
		"k8s.io/cluster-autoscaler/node-template/label/dynk8s.io/pool":                   "builders-arm",
		"k8s.io/cluster-autoscaler/node-template/label/dynk8s.io/capacity-type":          "spot",
		"k8s.io/cluster-autoscaler/node-template/label/kubernetes.io/arch":               "arm64",
		"k8s.io/cluster-autoscaler/node-template/label/kubernetes.io/os":                 "linux",
		"k8s.io/cluster-autoscaler/node-template/label/topology.kubernetes.io/region":    "eu-central-1",
		"k8s.io/cluster-autoscaler/node-template/label/node.kubernetes.io/instance-type": "c7g.2xlarge",
		"k8s.io/cluster-autoscaler/node-template/taint/example.com/spot":                 "true:NoSchedule",
		"k8s.io/cluster-autoscaler/node-template/resources/github.com/fuse":              "5000",
		// What a c7g.2xlarge with an 80 GiB root really offers pods, not its nominal 8 vCPU/16384 MiB: 7% of the
		// memory held back by kernel and firmware and 100Mi of eviction threshold; the volume less 10 GiB of OS
		// and images, less the 10% eviction threshold. Without ephemeral-storage a pod requesting any never
		// scales a group up from zero.
		"k8s.io/cluster-autoscaler/node-template/resources/cpu":               "8",
		"k8s.io/cluster-autoscaler/node-template/resources/memory":            "15137Mi",
		"k8s.io/cluster-autoscaler/node-template/resources/ephemeral-storage": "63Gi",
	}
	assert.DeepEqual(t, arm, want)

	x86 := groupTags(find(t, res, "aws:autoscaling/group:Group", "pool-builders-x86-asg"))
	assert.Equal(t, x86["k8s.io/cluster-autoscaler/node-template/label/kubernetes.io/arch"], "amd64")
	assert.Equal(t, x86["k8s.io/cluster-autoscaler/node-template/label/dynk8s.io/capacity-type"], "on-demand")
	for k := range x86 {
		assert.Check(t, !strings.Contains(k, "/taint/"), "the x86 pool has no taints: %s", k)
	}

	// The nodes register with the fuse startup taint, which the template node must not carry: the autoscaler would
	// otherwise think no pod can land on the group.
	for k := range arm {
		assert.Check(t, !strings.Contains(k, "startup-taint"), k)
	}
	for _, lt := range res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate") {
		taints := poolNodeConfig(t, &lt).Join.Taints
		assert.Check(t, slices.ContainsFunc(taints, func(tt kube.Taint) bool {
			return tt.Key == "startup-taint.cluster-autoscaler.kubernetes.io/fuse" && tt.Effect == "NoSchedule"
		}), "%s: %v", lt.Name, taints)
	}

	// Without fuse, no resource tag.
	c := devConfig(t)
	obj(c, "fuse")["enabled"] = false
	noFuse := groupTags(find(t, runStack(t, c), "aws:autoscaling/group:Group", "pool-builders-arm-asg"))
	_, has := noFuse["k8s.io/cluster-autoscaler/node-template/resources/github.com/fuse"]
	assert.Check(t, !has)
}

func TestPoolsNeverCollide(t *testing.T) {
	res := runStack(t, devConfig(t))
	seen := map[string]bool{}
	for _, r := range res.Cloud.Resources() {
		key := r.Type + "/" + r.Name
		assert.Check(t, !seen[key], "duplicate resource %s", key)
		seen[key] = true
	}
	for _, typ := range []string{"aws:ec2/launchTemplate:LaunchTemplate", "aws:autoscaling/group:Group", infra.NodePoolType} {
		assert.Equal(t, len(res.Cloud.ByType(typ)), 2, typ)
	}
}

// TestDeterministic: the same config twice declares byte-identical inputs, so a second `pulumi up` is a no-op.
func TestDeterministic(t *testing.T) {
	doc := func() []byte {
		var b bytes.Buffer
		assert.NilError(t, runStack(t, devConfig(t)).WriteJSON(&b))
		return b.Bytes()
	}
	first, second := doc(), doc()
	assert.Assert(t, bytes.Equal(first, second), "two runs of the same config differ")
}

func TestNetwork(t *testing.T) {
	res := runStack(t, devConfig(t))
	for _, z := range []string{"a", "b"} {
		s := find(t, res, "aws:ec2/subnet:Subnet", "network-subnet-eu-central-1"+z)
		assert.Equal(t, in(s, "mapPublicIpOnLaunch"), true, "nodes egress with their own public IPv4, no NAT")
	}
	assert.Equal(t, len(res.Cloud.ByType("aws:ec2/natGateway:NatGateway")), 0)
	routes := map[string]map[string]any{}
	for _, r := range res.Cloud.ByType("aws:ec2/route:Route") {
		routes[in(&r, "destinationCidrBlock").(string)] = mockcloud.PlainMap(r.Inputs, true)
	}
	igw := find(t, res, "aws:ec2/internetGateway:InternetGateway", "network-igw")
	gw := find(t, res, "aws:ec2/instance:Instance", "gateway")
	eni := gw.Outputs["primaryNetworkInterfaceId"].StringValue()
	assert.Equal(t, routes["0.0.0.0/0"]["gatewayId"], igw.ID)
	assert.Equal(t, routes["192.168.10.0/24"]["networkInterfaceId"], eni, "routes target the gateway's own interface")
	assert.Equal(t, routes["10.201.0.0/30"]["networkInterfaceId"], eni, "replies to the on-prem peer's tunnel address")
	assert.Equal(t, len(routes), 3)
	assert.Equal(t, in(gw, "sourceDestCheck"), false)

	// No ingress from anywhere, except WireGuard's UDP port on the gateway.
	for _, sg := range res.Cloud.ByType("aws:ec2/securityGroup:SecurityGroup") {
		for _, rule := range asList(in(&sg, "ingress")) {
			r := asMap(rule)
			for _, cidr := range asList(r["cidrBlocks"]) {
				if cidr != "0.0.0.0/0" {
					continue
				}
				assert.Equal(t, sg.Name, "network-gateway-sg", "open ingress on %s", sg.Name)
				assert.Equal(t, r["protocol"], "udp")
				assert.Equal(t, r["fromPort"], float64(51820))
				assert.Equal(t, r["toPort"], float64(51820))
			}
		}
	}
	nodeSG := find(t, res, "aws:ec2/securityGroup:SecurityGroup", "network-node-sg")
	var sources []any
	for _, rule := range asList(in(nodeSG, "ingress")) {
		sources = append(sources, asList(asMap(rule)["cidrBlocks"])...)
	}
	assert.DeepEqual(t, sources, []any{"192.168.10.0/24", "10.201.0.0/30", "10.200.0.0/16"})
	// Path MTU discovery: the gateway's "fragmentation needed" (ICMP type 3 code 4; for an icmp rule EC2 reads
	// fromPort as the type and toPort as the code) reaches the nodes, whose interfaces run at 9001 against the
	// tunnel's 1420. Nothing else from the VPC is let in.
	var pmtu []map[string]any
	for _, rule := range asList(in(nodeSG, "ingress")) {
		if r := asMap(rule); r["protocol"] == "icmp" {
			pmtu = append(pmtu, r)
		}
	}
	assert.Assert(t, len(pmtu) == 1)
	assert.Equal(t, pmtu[0]["fromPort"], float64(3))
	assert.Equal(t, pmtu[0]["toPort"], float64(4))
	assert.DeepEqual(t, pmtu[0]["cidrBlocks"], []any{"10.200.0.0/16"})

	// The gateway's fixed address is reserved in its subnet, so EC2 never gives it to a node (AWS N9); the gateway
	// and the groups launch into that subnet only once the reservation exists.
	reservation := find(t, res, "aws:ec2/subnetCidrReservation:SubnetCidrReservation", "network-gateway-address")
	assert.Equal(t, in(reservation, "subnetId"), in(gw, "subnetId"))
	assert.Equal(t, in(reservation, "cidrBlock"), in(gw, "privateIp").(string)+"/32")
	assert.Equal(t, in(reservation, "reservationType"), "explicit")
	// Explicitly, not through the subnet ids, which would then be unknown in the preview of an upgrade that adds
	// the reservation and show the gateway replaced (subnetId forces a new instance).
	assert.Check(t, is.Contains(gw.DependsOn, "network-gateway-address"))
	assert.Check(t, !slices.Contains(gw.InputDependencies["subnetId"], "network-gateway-address"))
	for _, g := range res.Cloud.ByType("aws:autoscaling/group:Group") {
		assert.Check(t, is.Contains(g.DependsOn, "network-gateway-address"), g.Name)
	}

	// Node names are instance ids, never reused: a recycled private address cannot adopt a stale Node.
	for _, sub := range res.Cloud.ByType("aws:ec2/subnet:Subnet") {
		assert.Equal(t, in(&sub, "privateDnsHostnameTypeOnLaunch"), "resource-name", sub.Name)
	}

	// With a known on-prem endpoint, the WireGuard port is open to that address only.
	c := devConfig(t)
	obj(c, "wireguard")["onPremEndpoint"] = "198.51.100.7:51820"
	gwSG := find(t, runStack(t, c), "aws:ec2/securityGroup:SecurityGroup", "network-gateway-sg")
	assert.DeepEqual(t, asMap(asList(in(gwSG, "ingress"))[0])["cidrBlocks"], []any{"198.51.100.7/32"})
}

func TestGateway(t *testing.T) {
	res := runStack(t, devConfig(t))
	inst := find(t, res, "aws:ec2/instance:Instance", "gateway")
	assert.Equal(t, in(inst, "instanceType"), "t4g.micro")
	assert.Equal(t, asMap(in(inst, "metadataOptions"))["httpTokens"], "required")
	root := asMap(in(inst, "rootBlockDevice"))
	assert.Equal(t, root["encrypted"], true)
	assert.Equal(t, root["volumeType"], "gp3")
	assert.Equal(t, root["volumeSize"], float64(mockcloud.FedoraSnapshotGiB), "the image's own snapshot size")
	assert.Equal(t, in(inst, "privateIp"), "10.200.0.10", "the fixed address in the first zone's subnet")
	assert.Equal(t, in(inst, "subnetId"), find(t, res, "aws:ec2/subnet:Subnet", "network-subnet-eu-central-1a").ID)
	assert.Equal(t, in(inst, "userDataReplaceOnChange"), true)
	raw, err := cloudinit.Decode(in(inst, "userDataBase64").(string))
	assert.NilError(t, err)
	assert.Check(t, bytes.HasPrefix(raw, []byte("#cloud-config\n")))

	// The dev stack's on-prem peer dials in: it needs the fixed address of an Elastic IP, on the gateway's interface.
	eip := find(t, res, "aws:ec2/eip:Eip", "gateway-eip")
	assert.Equal(t, in(eip, "networkInterface"), inst.Outputs["primaryNetworkInterfaceId"].StringValue())

	// A replaced gateway (new image, tunnel settings) must release its fixed address before the new one claims it.
	assert.Check(t, inst.DeleteBeforeReplace, "the instance is replaced delete-first")
	// An Elastic IP needs the internet gateway attached first; the instance's first boot needs the way out.
	assert.Check(t, is.Contains(eip.DependsOn, "network-igw"))
	for _, dep := range []string{"network-igw", "network-route-default", "network-rta-eu-central-1a", "gateway-key"} {
		assert.Check(t, is.Contains(inst.DependsOn, dep))
	}

	// Automatic recovery covers failed hosts only; a hung guest (the instance status check) is rebooted by an alarm.
	alarm := find(t, res, "aws:cloudwatch/metricAlarm:MetricAlarm", "gateway-status")
	assert.Equal(t, in(alarm, "metricName"), "StatusCheckFailed_Instance")
	assert.Equal(t, in(alarm, "namespace"), "AWS/EC2")
	assert.DeepEqual(t, in(alarm, "dimensions"), map[string]any{"InstanceId": inst.ID})
	assert.DeepEqual(t, in(alarm, "alarmActions"), []any{"arn:aws:automate:eu-central-1:ec2:reboot"})

	key := find(t, res, "aws:ssm/parameter:Parameter", "gateway-key")
	assert.Equal(t, in(key, "type"), "SecureString")
	assert.Equal(t, in(key, "name"), "/dynk8s/homelab/wireguard-gateway-key")
	assert.Check(t, key.Inputs["value"].IsSecret(), "the private key is secret in state")
	priv := in(key, "value").(string)
	pub, err := wireguard.PublicKey(priv)
	assert.NilError(t, err)
	assert.Equal(t, res.Outputs["gatewayPublicKey"].Value, pub)
	assert.Check(t, !res.Outputs["gatewayPublicKey"].Secret)

	conf := res.Outputs["onPremWireGuardConfig"]
	assert.Check(t, conf.Secret)
	text := conf.Value.(string)
	assert.Check(t, is.Contains(text, "PublicKey = "+pub))
	assert.Check(t, is.Contains(text, "Endpoint = "+res.Outputs["gatewayPublicIp"].Value.(string)+":51820"))
	assert.Check(t, is.Contains(text, "PersistentKeepalive = 25"))
	assert.Check(t, is.Contains(text, "MTU = 1420"))
	assert.Check(t, is.Contains(text, "Address = 10.201.0.2/30"))
	assert.Check(t, is.Contains(text, "PrivateKey = "), "a generated on-prem key pair travels in the config")
}

// Dialling out (wireguard.onPremEndpoint), the gateway has no address that bills while it sleeps: no Elastic IP, no
// gatewayPublicIp output, and the on-prem peer learns the address from the gateway's handshakes.
func TestGatewayDialOut(t *testing.T) {
	c := devConfig(t)
	obj(c, "wireguard")["onPremEndpoint"] = "198.51.100.7:51820"
	res := runStack(t, c)
	assert.Equal(t, len(res.Cloud.ByType("aws:ec2/eip:Eip")), 0)
	_, ok := res.Outputs["gatewayPublicIp"]
	assert.Check(t, !ok, "a dialling-out gateway has no address to publish")
	inst := find(t, res, "aws:ec2/instance:Instance", "gateway")
	// Its public IPv4 is the one its subnet maps at each start.
	subnet := find(t, res, "aws:ec2/subnet:Subnet", "network-subnet-eu-central-1a")
	assert.Equal(t, in(inst, "subnetId"), subnet.ID)
	assert.Equal(t, in(subnet, "mapPublicIpOnLaunch"), true)
	text := res.Outputs["onPremWireGuardConfig"].Value.(string)
	assert.Check(t, !strings.Contains(text, "Endpoint"), text)
	assert.Check(t, is.Contains(text, "ListenPort = 51820"))
	raw, err := cloudinit.Decode(in(inst, "userDataBase64").(string))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(raw), "Endpoint = 198.51.100.7:51820"))
	for _, r := range res.Cloud.ByType("aws:ec2/route:Route") {
		if id, ok := in(&r, "networkInterfaceId").(string); ok {
			assert.Check(t, is.Equal(id, inst.Outputs["primaryNetworkInterfaceId"].StringValue()), r.Name)
		}
	}
}

// The gateway sleeps by default: its user data runs the idle check, the nodes' user data names it to wake, the
// nodes may start it and it may list instances. gateway.idleStop 0 removes all of that.
func TestGatewaySleepsByDefault(t *testing.T) {
	res := runStack(t, devConfig(t))
	inst := find(t, res, "aws:ec2/instance:Instance", "gateway")
	raw, err := cloudinit.Decode(in(inst, "userDataBase64").(string))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(raw), `"stop": "15m0s"`), "gateway.json's idle check")
	assert.Check(t, is.Equal(in(inst, "instanceInitiatedShutdownBehavior"), "stop"))
	for _, lt := range res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate") {
		assert.Check(t, is.Equal(poolNodeConfig(t, &lt).GatewayInstanceID, inst.ID), lt.Name)
	}
	wake := policy(t, find(t, res, "aws:iam/rolePolicy:RolePolicy", "gateway-wake"), "policy")
	assert.DeepEqual(t, wake.Statement[0].Resource, []string{"arn:aws:ec2:eu-central-1:" + mockcloud.Account + ":instance/" + inst.ID})
	assert.Equal(t, in(find(t, res, "aws:iam/rolePolicy:RolePolicy", "gateway-wake"), "role"),
		find(t, res, "aws:iam/role:Role", "identity-node-role").Outputs["name"].StringValue())
	assert.Equal(t, in(find(t, res, "aws:iam/rolePolicy:RolePolicy", "gateway-idle-check"), "role"),
		find(t, res, "aws:iam/role:Role", "identity-gateway-role").Outputs["name"].StringValue())

	c := devConfig(t)
	obj(c, "gateway")["idleStop"] = "0"
	res = runStack(t, c)
	inst = find(t, res, "aws:ec2/instance:Instance", "gateway")
	raw, err = cloudinit.Decode(in(inst, "userDataBase64").(string))
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(raw), "gateway-idle"))
	assert.Check(t, res.Cloud.Find("aws:iam/rolePolicy:RolePolicy", "gateway-wake") == nil)
	assert.Check(t, res.Cloud.Find("aws:iam/rolePolicy:RolePolicy", "gateway-idle-check") == nil)
	for _, lt := range res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate") {
		assert.Check(t, is.Equal(poolNodeConfig(t, &lt).GatewayInstanceID, ""), lt.Name)
	}
}

// Pulumi and a stopped gateway: preview, up and refresh must neither replace nor start it. The program declares no
// desired instance state (no aws:ec2/instanceState:InstanceState: pulumi-aws's Instance has instanceState as an
// output only), and none of the instance's inputs reads back differently from a stopped instance. In particular
// associatePublicIpAddress is not set: the provider reads it from the primary interface's public address, which a
// stopped instance has not, and it forces replacement (hashicorp/terraform-provider-aws#33775); the subnet maps
// the address instead. Nothing reads the instance's public address (it is gone while stopped).
func TestGatewayDeclaresNothingAStoppedInstanceChanges(t *testing.T) {
	for name, mutate := range map[string]func(map[string]any){
		"dial-in":  func(map[string]any) {},
		"dial-out": func(c map[string]any) { obj(c, "wireguard")["onPremEndpoint"] = "198.51.100.7:51820" },
	} {
		t.Run(name, func(t *testing.T) {
			c := devConfig(t)
			mutate(c)
			res := runStack(t, c)
			assert.Equal(t, len(res.Cloud.ByType("aws:ec2/instanceState:InstanceState")), 0)
			inst := find(t, res, "aws:ec2/instance:Instance", "gateway")
			for _, key := range []string{"associatePublicIpAddress", "instanceState", "networkInterfaces", "publicIp"} {
				_, set := inst.Inputs[resource.PropertyKey(key)]
				assert.Check(t, !set, "the gateway instance declares %s", key)
			}
			// The instance's public address (gone while it is stopped, new at each start) feeds nothing: not the
			// on-prem config, not an output, not another resource.
			pub := inst.Outputs["publicIp"].StringValue()
			assert.Assert(t, pub != "")
			for _, r := range res.Resources() {
				assert.Check(t, !strings.Contains(fmt.Sprint(mockcloud.PlainMap(r.Inputs, true)), pub), "%s uses it", r.Name)
			}
			for k, o := range res.Outputs {
				assert.Check(t, !strings.Contains(fmt.Sprint(o.Value), pub), "output %s uses it", k)
			}
		})
	}
}

func TestOnPremOwnKey(t *testing.T) {
	c := devConfig(t)
	const ownKey = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
	obj(c, "wireguard")["onPremPublicKey"] = ownKey
	res := runStack(t, c)
	text := res.Outputs["onPremWireGuardConfig"].Value.(string)
	assert.Check(t, !strings.Contains(text, "PrivateKey"), "the operator's private key is never in the stack")
	assert.Check(t, is.Contains(text, "PostUp = wg set %i private-key /etc/wireguard/dynk8s.key"))
	assert.Equal(t, len(res.Cloud.ByType("random:index/randomBytes:RandomBytes")), 1, "only the gateway's key")
	raw, err := cloudinit.Decode(in(find(t, res, "aws:ec2/instance:Instance", "gateway"), "userDataBase64").(string))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(raw), ownKey), "the gateway knows the on-prem peer by its key")
}

// policy parses an IAM policy document input.
func policy(t *testing.T, r *mockcloud.Resource, key string) infra.PolicyDocument {
	t.Helper()
	var doc infra.PolicyDocument
	assert.NilError(t, json.Unmarshal([]byte(in(r, key).(string)), &doc))
	assert.Equal(t, doc.Version, "2012-10-17")
	for _, s := range doc.Statement {
		if s.Effect == "Deny" {
			continue // a wildcard in a Deny takes away, never grants (the agent bucket's TLS guard)
		}
		for _, a := range s.Action {
			assert.Check(t, !strings.Contains(a, "*"), "wildcard action %q in %s", a, r.Name)
		}
	}
	return doc
}

func TestIdentityPolicies(t *testing.T) {
	res := runStack(t, devConfig(t))
	for _, role := range []string{"identity-node-role", "identity-gateway-role"} {
		trust := policy(t, find(t, res, "aws:iam/role:Role", role), "assumeRolePolicy")
		assert.Equal(t, len(trust.Statement), 1)
		assert.DeepEqual(t, trust.Statement[0].Principal, map[string][]string{"Service": {"ec2.amazonaws.com"}})
		assert.DeepEqual(t, trust.Statement[0].Action, []string{"sts:AssumeRole"})
	}
	params := map[string]string{
		"identity-node-read-parameter":    "arn:aws:ssm:eu-central-1:123456789012:parameter/dynk8s/homelab/join-token",
		"identity-gateway-read-parameter": "arn:aws:ssm:eu-central-1:123456789012:parameter/dynk8s/homelab/wireguard-gateway-key",
	}
	for name, arn := range params {
		doc := policy(t, find(t, res, "aws:iam/rolePolicy:RolePolicy", name), "policy")
		assert.Equal(t, len(doc.Statement), 1)
		assert.DeepEqual(t, doc.Statement[0].Action, []string{"ssm:GetParameter"})
		assert.DeepEqual(t, doc.Statement[0].Resource, []string{arn})
		assert.Check(t, doc.Statement[0].Condition == nil)
	}
	assert.Equal(t, len(res.Cloud.ByType("aws:iam/rolePolicyAttachment:RolePolicyAttachment")), 0,
		"no managed policies by default")

	ca := policy(t, find(t, res, "aws:iam/userPolicy:UserPolicy", "identity-autoscaler"), "policy")
	assert.Equal(t, len(ca.Statement), 2)
	read, write := ca.Statement[0], ca.Statement[1]
	assert.DeepEqual(t, read.Action, []string{
		"autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
		"autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
		"ec2:DescribeImages", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplateVersions",
		"ec2:GetInstanceTypesFromInstanceRequirements",
	})
	for _, a := range read.Action {
		verb := a[strings.Index(a, ":")+1:]
		assert.Check(t, strings.HasPrefix(verb, "Describe") || strings.HasPrefix(verb, "Get"), "read statement: %s", a)
	}
	// Region-scoped: DescribeLaunchTemplateVersions returns user data, and a leaked key must
	// read only the stack's region. aws:RequestedRegion is a global condition key, so every action takes it.
	assert.DeepEqual(t, read.Condition, map[string]map[string]string{
		"StringEquals": {"aws:RequestedRegion": "eu-central-1"},
	})
	assert.DeepEqual(t, write.Action, []string{
		"autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup",
	})
	assert.DeepEqual(t, write.Condition, map[string]map[string]string{
		"StringEquals": {
			"autoscaling:ResourceTag/k8s.io/cluster-autoscaler/homelab": "owned",
			"aws:RequestedRegion": "eu-central-1",
		},
	})

	// The stale-node cleanup's own user may only ask whether instances exist.
	cleanup := policy(t, find(t, res, "aws:iam/userPolicy:UserPolicy", "identity-cleanup"), "policy")
	assert.Equal(t, len(cleanup.Statement), 1)
	assert.DeepEqual(t, cleanup.Statement[0].Action, []string{"ec2:DescribeInstances"})
	assert.Equal(t, in(find(t, res, "aws:iam/userPolicy:UserPolicy", "identity-cleanup"), "user"), "homelab-node-cleanup")
	assert.Equal(t, len(res.Cloud.ByType("aws:iam/user:User")), 3, "the autoscaler's, the cleanup's and the token rotator's users")

	// The node role gets no managed policy: its only right is reading the join token.
	assert.Check(t, is.Len(res.Cloud.ByType("aws:iam/rolePolicyAttachment:RolePolicyAttachment"), 0))
}

// TestJoinTokenAndKeyRotation: Pulumi declares the join token's parameter with a placeholder and ignores its value
// from then on (the controller in the cluster owns it, so rotations never show as a diff); no token is drawn in
// Pulumi at all. The token writer's IAM user may put that one parameter and nothing else, with a key that rotates
// with the token.
func TestJoinTokenAndKeyRotation(t *testing.T) {
	res := runStack(t, devConfig(t))
	const arn = "arn:aws:ssm:eu-central-1:123456789012:parameter/dynk8s/homelab/join-token"
	param := find(t, res, "aws:ssm/parameter:Parameter", "identity-join-token")
	assert.Equal(t, in(param, "name"), "/dynk8s/homelab/join-token")
	assert.Equal(t, in(param, "type"), "SecureString")
	assert.Equal(t, in(param, "value"), infra.JoinTokenPlaceholder)
	// A changed description would make the provider put the state's value over the live token: ignored too (AWS
	// N12).
	assert.DeepEqual(t, param.IgnoreChanges, []string{"value", "description"})
	// The controller runs after the parameter exists, so its first PutParameter never creates it first.
	controller := find(t, res, "kubernetes:apps/v1:Deployment", "addons-controller")
	assert.Check(t, is.Contains(controller.DependsOn, "identity-join-token"))
	assert.Check(t, !regexp.MustCompile(`[a-z0-9]{6}\.[a-z0-9]{16}`).MatchString(infra.JoinTokenPlaceholder),
		"the placeholder looks like a token")
	assert.Equal(t, len(res.Cloud.ByType("random:index/randomString:RandomString")), 0, "a token drawn in Pulumi")
	assert.Equal(t, len(res.Cloud.ByType("kubernetes:core/v1:Secret")), 3, "the three AWS credentials, no token")

	user := find(t, res, "aws:iam/user:User", "identity-token-rotator")
	assert.Equal(t, in(user, "name"), "homelab-join-token-rotator")
	doc := policy(t, find(t, res, "aws:iam/userPolicy:UserPolicy", "identity-token-rotator"), "policy")
	assert.Equal(t, len(doc.Statement), 1)
	assert.Equal(t, doc.Statement[0].Effect, "Allow")
	assert.DeepEqual(t, doc.Statement[0].Action, []string{"ssm:PutParameter"})
	assert.DeepEqual(t, doc.Statement[0].Resource, []string{arn})
	// Only an overwrite of the parameter Pulumi made, and never with parameter policies (an expiration policy
	// would let a leaked key make the nodes' parameter vanish). The controller's request sends
	// Overwrite: true and no Policies (cluster/internal/rotate).
	assert.DeepEqual(t, doc.Statement[0].Condition, map[string]map[string]string{
		"Bool": {"ssm:Overwrite": "true"},
		"Null": {"ssm:Policies": "true"},
	})
	// The nodes read the very parameter the rotator writes.
	read := policy(t, find(t, res, "aws:iam/rolePolicy:RolePolicy", "identity-node-read-parameter"), "policy")
	assert.DeepEqual(t, read.Statement[0].Resource, []string{arn})

	key := find(t, res, "aws:iam/accessKey:AccessKey", "identity-token-rotator-key-1")
	assert.Check(t, is.Contains(key.AdditionalSecretOutputs, "secret"))
	assert.Equal(t, in(key, "user"), "homelab-join-token-rotator")
	rotation := func(res *plan.Result) any {
		d := find(t, res, "kubernetes:apps/v1:Deployment", "addons-controller")
		return asMap(asMap(asMap(asMap(in(d, "spec"))["template"])["metadata"])["annotations"])["dynk8s.io/bootstrap-token-rotation"]
	}
	assert.Equal(t, rotation(res), "1")

	c := devConfig(t)
	obj(c, "kubernetes")["bootstrapTokenRotation"] = "2"
	rotated := runStack(t, c)
	assert.Check(t, rotated.Cloud.Find("aws:iam/accessKey:AccessKey", "identity-token-rotator-key-2") != nil)
	assert.Check(t, rotated.Cloud.Find("aws:iam/accessKey:AccessKey", "identity-token-rotator-key-1") == nil)
	assert.Check(t, is.Equal(rotation(rotated), "2"), "rotate now: the controller rolls, its new leader issues a token")
	assert.DeepEqual(t, in(rotated.Cloud.Find("aws:ssm/parameter:Parameter", "identity-join-token"), "value"),
		infra.JoinTokenPlaceholder)

	key = find(t, res, "aws:iam/accessKey:AccessKey", "identity-autoscaler-key-1")
	assert.Check(t, is.Contains(key.AdditionalSecretOutputs, "secret"))
	c = devConfig(t)
	obj(c, "identity")["autoscalerKeyRotation"] = "2"
	rotated = runStack(t, c)
	assert.Check(t, rotated.Cloud.Find("aws:iam/accessKey:AccessKey", "identity-autoscaler-key-2") != nil)
	assert.Check(t, rotated.Cloud.Find("aws:iam/accessKey:AccessKey", "identity-autoscaler-key-1") == nil)
	assert.Check(t, rotated.Cloud.Find("aws:iam/accessKey:AccessKey", "identity-cleanup-key-2") != nil,
		"the rotation value rotates every on-prem key")
	assert.Check(t, is.Contains(find(t, res, "aws:iam/accessKey:AccessKey", "identity-cleanup-key-1").AdditionalSecretOutputs,
		"secret"))
}

// heldSecrets is every secret the stack holds, the one list the secret scans read: each secret output the cloud
// generated for a resource (an output its inputs did not carry: the IAM keys' secrets, the random bytes behind the
// WireGuard keys), and the WireGuard private keys the stack derives from those bytes. It is read from what the
// stack declared, so a new secret the stack comes to hold is scanned without a test naming it; the test holds that
// the list has at least the ones named in stackSecretsNamed.
func heldSecrets(t *testing.T, cloud *mockcloud.Cloud) map[string]string {
	t.Helper()
	held := map[string]string{}
	for _, r := range cloud.Resources() {
		for k, v := range r.Outputs {
			if _, input := r.Inputs[k]; input || !v.IsSecret() || !v.SecretValue().Element.IsString() {
				continue
			}
			value := v.SecretValue().Element.StringValue()
			held[r.Name+"."+string(k)] = value
			if r.Type == "random:index/randomBytes:RandomBytes" && k == "base64" {
				key, err := wireguard.PrivateKeyFromBytes(value)
				assert.NilError(t, err)
				held[r.Name+" (WireGuard private key)"] = key
			}
		}
	}
	return held
}

// stackSecretsNamed are secrets the dev stack must hold, and use (all but the generated on-prem key, which only the
// secret output carries): the scans cannot pass by finding no secret at all.
var stackSecretsNamed = map[string]bool{
	"identity-autoscaler-key-1.secret":           true,
	"identity-cleanup-key-1.secret":              true,
	"identity-token-rotator-key-1.secret":        true,
	"gateway-key (WireGuard private key)":        true,
	"gateway-onprem-key (WireGuard private key)": false,
}

// secretHolders are the resource inputs meant to carry a secret: a Kubernetes Secret's data and an SSM parameter's
// value (a SecureString). Anywhere else (a ConfigMap, an environment value, a tag) a secret is exposed to whoever
// reads that object, even when Pulumi keeps it encrypted in state.
var secretHolders = map[string][]string{
	"kubernetes:core/v1:Secret":   {"stringData", "data"},
	"aws:ssm/parameter:Parameter": {"value"},
}

// TestNoSecretInTheClear scans every input of every resource, the plan's JSON and the user data for every secret
// the stack holds (heldSecrets): none is shown in the clear, each is marked secret wherever it is used, and it is
// used only where a secret belongs (secretHolders).
func TestNoSecretInTheClear(t *testing.T) {
	t.Run("stock", func(t *testing.T) { noSecretInTheClear(t, devConfig(t)) })
	t.Run("baked", func(t *testing.T) { noSecretInTheClear(t, bakedDev(t)) })
}

func noSecretInTheClear(t *testing.T, values map[string]any) {
	res := runStack(t, values)
	secrets := heldSecrets(t, res.Cloud)
	for what := range stackSecretsNamed {
		assert.Check(t, secrets[what] != "", "the stack holds no %s: the scan list is incomplete", what)
	}

	var doc bytes.Buffer
	assert.NilError(t, res.WriteJSON(&doc))
	for what, v := range secrets {
		assert.Check(t, !strings.Contains(doc.String(), v), "%s appears in the clear in the plan", what)
	}

	// Each secret is used somewhere, and everywhere it is used it is marked secret, in a place meant for secrets.
	for what, v := range secrets {
		used := false
		for _, r := range res.Cloud.Resources() {
			for k, pv := range r.Inputs {
				if !containsString(pv, v) {
					continue
				}
				used = true
				assert.Check(t, mockcloud.ContainsSecret(pv), "%s is in %s.%s without the secret mark", what, r.Name, k)
				assert.Check(t, slices.Contains(secretHolders[r.Type], string(k)),
					"%s is in %s %s.%s: a secret belongs in a Kubernetes Secret or an SSM SecureString", what, r.Type,
					r.Name, k)
			}
		}
		if stackSecretsNamed[what] {
			assert.Check(t, used, "%s is never used: the scan proves nothing", what)
		}
	}
	// User data carries no secret at all.
	for _, lt := range res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate") {
		raw, err := cloudinit.Decode(in(&lt, "userData").(string))
		assert.NilError(t, err)
		for what, v := range secrets {
			assert.Check(t, !strings.Contains(string(raw), v), "%s in the user data of %s", what, lt.Name)
		}
	}
}

// TestComponentOutputsKeepSecrets: a component's outputs go into the state as its registered outputs (the fields
// tagged `pulumi:"..."`), which the mock engine does not record; each is awaited here, and one that carries a secret
// the stack holds must be secret.
func TestComponentOutputsKeepSecrets(t *testing.T) {
	sc, err := mockcloud.ConfigFromMap(devConfig(t))
	assert.NilError(t, err)
	cfg, err := config.ParseValues(sc.Values)
	assert.NilError(t, err)
	cloud := mockcloud.NewFor(sc)
	type output struct {
		where  string
		value  any
		secret bool
	}
	var outputs []output
	err = mockcloud.Run(func(ctx *pulumi.Context) error {
		stack, err := infra.NewStack(ctx, cfg, infra.AgentOrStandIn(""), func(context.Context, *config.Config) (infra.OnPremNodeState, error) {
			return infra.OnPremNodeState{Ready: []string{"onprem-1"}}, nil
		})
		if err != nil {
			return err
		}
		components := map[string]any{"network": stack.Network, "identity": stack.Identity, "gateway": stack.Gateway,
			"addons": stack.Addons}
		for _, p := range stack.Pools {
			components["pool "+p.Name] = p
		}
		for name, comp := range components {
			v := reflect.ValueOf(comp).Elem()
			for i := range v.NumField() {
				f := v.Type().Field(i)
				out, ok := v.Field(i).Interface().(pulumi.Output)
				if f.Tag.Get("pulumi") == "" || !ok {
					continue
				}
				value, secret, err := mockcloud.Await(out)
				if err != nil {
					return fmt.Errorf("%s.%s: %w", name, f.Name, err)
				}
				outputs = append(outputs, output{name + "." + f.Tag.Get("pulumi"), value, secret})
			}
		}
		return nil
	}, "dev", sc, cloud)
	assert.NilError(t, err)
	assert.Check(t, len(outputs) > 10, "only %d component outputs", len(outputs))
	secrets := heldSecrets(t, cloud)
	for _, o := range outputs {
		for what, v := range secrets {
			assert.Check(t, o.secret || !strings.Contains(fmt.Sprint(o.value), v),
				"component output %s carries the %s without the secret mark", o.where, what)
		}
	}
}

func containsString(v resource.PropertyValue, s string) bool {
	for _, x := range mockcloud.Strings(v) {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

// TestBadConfigDeclaresNothing: a refused config stops the program before its first resource.
func TestBadConfigDeclaresNothing(t *testing.T) {
	c := devConfig(t)
	pool(c, 1)["maxSize"] = -1
	cfg, err := mockcloud.ConfigFromMap(c)
	assert.NilError(t, err)
	res, err := plan.RunConfig("dev", cfg)
	var cfgErr *config.Error
	assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
	assert.Equal(t, len(res.Cloud.Resources()), 0)
	assert.Equal(t, len(res.Cloud.Calls()), 0)
}

// TestOnPremConfigParsesWithWG: the on-prem peer's config, as the stack outputs it, passes the real wg parser.
func TestOnPremConfigParsesWithWG(t *testing.T) {
	for name, mutate := range map[string]func(map[string]any){
		"generated key": func(map[string]any) {},
		"own key": func(c map[string]any) {
			obj(c, "wireguard")["onPremPublicKey"] = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := devConfig(t)
			mutate(c)
			conf := runStack(t, c).Outputs["onPremWireGuardConfig"].Value.(string)
			stderr := realtools.WGSetconf(t, []byte(conf))
			assert.Check(t, is.Contains(stderr, "Protocol not supported"))
			assert.Check(t, !strings.Contains(stderr, "Configuration parsing error"), stderr)
		})
	}
}

// TestCAHashFromClusterInfo: without kubernetes.caCertHash the stack reads kube-public/cluster-info through the
// on-prem provider and pins the CA found there.
func TestCAHashFromClusterInfo(t *testing.T) {
	c := devConfig(t)
	delete(obj(c, "kubernetes"), "caCertHash")
	res := runStack(t, c)
	info := find(t, res, "kubernetes:core/v1:ConfigMap", "cluster-info")
	assert.Check(t, info.Read, "cluster-info is read, never declared")
	assert.Equal(t, info.ID, "kube-public/cluster-info")
	_, want := mockcloud.ClusterCA()
	for _, lt := range res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate") {
		assert.Check(t, is.DeepEqual(poolNodeConfig(t, &lt).Join.CACertHashes, []string{want}),
			"%s pins the cluster's CA", lt.Name)
	}

}

// TestClusterInfoServer: kubeadm's token discovery returns the server that kube-public/cluster-info names, and the
// joined kubelet talks to that one, not to apiServerEndpoint. A server the VPC cannot reach is caught at preview.
func TestClusterInfoServer(t *testing.T) {
	run := func(server string, mutate func(map[string]any)) error {
		c := devConfig(t)
		if mutate != nil {
			mutate(c)
		}
		cfg, err := mockcloud.ConfigFromMap(c)
		assert.NilError(t, err)
		cfg.ClusterServer = server
		_, err = plan.RunConfig("dev", cfg)
		return err
	}
	assert.NilError(t, run("https://192.168.10.10:6443", nil), "the server the stack is configured with")
	assert.ErrorContains(t, run("https://192.168.10.11:6443", nil),
		"cluster-info names the API server https://192.168.10.11:6443, but dynk8s:kubernetes.apiServerEndpoint is 192.168.10.10:6443")
	assert.ErrorContains(t, run("https://192.168.10.10:443", nil), "apiServerEndpoint is 192.168.10.10:6443")
	assert.ErrorContains(t, run("https://k8s.lab.example:6443", nil), "dynk8s:kubernetes.serverNameResolvesInVpc")
	assert.NilError(t, run("https://k8s.lab.example:6443", func(c map[string]any) {
		obj(c, "kubernetes")["serverNameResolvesInVpc"] = true
	}), "the operator states the name resolves from the VPC")
}

func TestCACertHashFromKubeconfigErrors(t *testing.T) {
	for name, kubeconfig := range map[string]string{
		"not yaml":    "{",
		"no clusters": "apiVersion: v1\nkind: Config\n",
		"no CA data":  "clusters:\n- cluster:\n    server: https://x\n",
		"not base64":  "clusters:\n- cluster:\n    certificate-authority-data: '!!'\n",
		"not a cert":  "clusters:\n- cluster:\n    certificate-authority-data: " + base64.StdEncoding.EncodeToString([]byte("hello")) + "\n",
	} {
		_, err := infra.CACertHashFromKubeconfig(kubeconfig)
		assert.Check(t, err != nil, name)
	}
}

// TestNamesCarryTheCluster: every Name tag starts with the cluster's name, so two stacks in one account can be told
// apart in the console.
func TestNamesCarryTheCluster(t *testing.T) {
	t.Run("stock", func(t *testing.T) { namesCarryTheCluster(t, devConfig(t)) })
	t.Run("baked", func(t *testing.T) { namesCarryTheCluster(t, bakedDev(t)) })
}

func namesCarryTheCluster(t *testing.T, values map[string]any) {
	res := runStack(t, values)
	named := 0
	for _, r := range res.Cloud.Resources() {
		name, ok := asMap(in(&r, "tags"))["Name"].(string)
		if !ok {
			continue
		}
		named++
		assert.Check(t, strings.HasPrefix(name, "homelab-"), "%s %s is tagged Name=%s", r.Type, r.Name, name)
	}
	assert.Check(t, named > 10, "only %d resources carry a Name tag", named)

	// Groups and launch templates are named by the provider from a prefix: cluster, then pool.
	for _, typ := range []string{"aws:autoscaling/group:Group", "aws:ec2/launchTemplate:LaunchTemplate"} {
		var prefixes []string
		for _, r := range res.Cloud.ByType(typ) {
			prefixes = append(prefixes, in(&r, "namePrefix").(string))
		}
		sort.Strings(prefixes)
		assert.DeepEqual(t, prefixes, []string{"homelab-builders-arm-", "homelab-builders-x86-"})
	}
}

// TestVersionSkew: nodes may be older than the control plane, never newer (the Kubernetes version skew policy); the
// control plane's version comes from kube-system/kubeadm-config at preview. The autoscaler's minor is the control
// plane's, so nodes that trail it need autoscaler.version set (newcomer review F9).
func TestVersionSkew(t *testing.T) {
	runWith := func(version, autoscaler string) error {
		c := devConfig(t)
		// The nodes at 1.34.4, whatever the example pins: the cases are about these numbers.
		obj(c, "kubernetes")["version"] = "1.34.4"
		if autoscaler != "" {
			obj(c, "autoscaler")["version"] = autoscaler
		}
		cfg, err := mockcloud.ConfigFromMap(c)
		assert.NilError(t, err)
		cfg.ClusterVersion = version
		_, err = plan.RunConfig("dev", cfg)
		return err
	}
	run := func(version string) error { return runWith(version, "") }
	assert.NilError(t, run("v1.34.4"), "same version")
	assert.ErrorContains(t, run("v1.35.0"), "dynk8s:autoscaler.version: kube-system/kubeadm-config: the control "+
		"plane is 1.35.0 and the Cluster Autoscaler 1.34.5")
	assert.NilError(t, runWith("v1.35.0", "1.35.2"), "nodes one minor older, the autoscaler the control plane's")
	assert.NilError(t, run("v1.34.2"), "a newer patch of the same minor")
	assert.ErrorContains(t, run("v1.33.6"),
		"dynk8s:kubernetes.version: kube-system/kubeadm-config: the nodes' version 1.34.4 is newer than the "+
			"control plane's v1.33.6")
	assert.ErrorContains(t, run("1.34"), "kubernetesVersion")
}

// TestClusterNetworkingFromKubeadmConfig: kubernetes.podCidr and serviceCidr are compared at preview with the ranges
// kube-system/kubeadm-config states, and a mismatch fails with the key that fixes it before anything is declared.
func TestClusterNetworkingFromKubeadmConfig(t *testing.T) {
	run := func(pods, services string) (*plan.Result, error) {
		cfg, err := mockcloud.ConfigFromMap(devConfig(t))
		assert.NilError(t, err)
		cfg.ClusterPodSubnet, cfg.ClusterServiceSubnet = pods, services
		return plan.RunConfig("dev", cfg)
	}
	_, err := run("10.244.0.0/16,fd00:10:244::/56", "10.96.0.0/12")
	assert.NilError(t, err, "the configured ranges, a dual-stack pod subnet")
	res, err := run("10.245.0.0/16", "")
	assert.ErrorContains(t, err, "dynk8s:kubernetes.podCidr: is 10.244.0.0/16, but the cluster's "+
		"networking.podSubnet is 10.245.0.0/16 (kube-system/kubeadm-config): set it to the cluster's")
	assert.Check(t, !slices.ContainsFunc(res.Resources(), func(r mockcloud.Resource) bool {
		return r.Type == "aws:ec2/launchTemplate:LaunchTemplate"
	}), "a launch template declared despite the mismatch")
	_, err = run("", "10.100.0.0/16")
	assert.ErrorContains(t, err, "dynk8s:kubernetes.serviceCidr: is 10.96.0.0/12, but the cluster's "+
		"networking.serviceSubnet is 10.100.0.0/16")
}

// TestInstanceTypesAskEC2: instance types are looked up in EC2 at preview (the mock catalog offline). A type EC2
// does not have, one of the wrong architecture, or one no zone of the stack offers fails with its key path before
// anything is declared; the autoscaler's template is sized from EC2's answer.
func TestInstanceTypesAskEC2(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate     func(map[string]any)
		path, want string
	}{
		"c5 has no 16xlarge": {func(c map[string]any) { pool(c, 0)["instanceTypes"] = []any{"c5.16xlarge"} },
			"dynk8s:nodePools[0].instanceTypes[0]", "InvalidInstanceType"},
		"graviton 7g stops at 16xlarge": {func(c map[string]any) { pool(c, 1)["instanceTypes"] = []any{"c7g.24xlarge"} },
			"dynk8s:nodePools[1].instanceTypes[0]", "InvalidInstanceType"},
		"graviton type in an x86 pool": {func(c map[string]any) { pool(c, 0)["instanceTypes"] = []any{"c7g.2xlarge"} },
			"dynk8s:nodePools[0].instanceTypes[0]", "is an arm64 type but the pool's arch is x86_64"},
		"mixed shapes": {func(c map[string]any) { pool(c, 1)["instanceTypes"] = []any{"c7g.2xlarge", "c7g.4xlarge"} },
			"dynk8s:nodePools[1].instanceTypes[1]", "same shape"},
		"not offered in the chosen zone": {func(c map[string]any) {
			obj(c, "network")["availabilityZones"] = []any{"eu-central-1c"}
			pool(c, 1)["instanceTypes"] = []any{"c8g.2xlarge"}
		}, "dynk8s:nodePools[1].instanceTypes[0]", "not offered in any of the stack's zones (eu-central-1c)"},
		// The offline catalog says what it does not know rather than answering for EC2 (newcomer review).
		"gateway type of a family the catalog lacks": {func(c map[string]any) { obj(c, "gateway")["instanceType"] = "t9.huge" },
			"dynk8s:gateway.instanceType", `instance type "t9.huge" cannot be checked offline`},
		"pool type of a family the catalog lacks": {func(c map[string]any) { pool(c, 0)["instanceTypes"] = []any{"g5.2xlarge"} },
			"dynk8s:nodePools[0].instanceTypes[0]", "a real `pulumi preview` asks EC2 about it"},
		"gateway on a Mac": {func(c map[string]any) { obj(c, "gateway")["instanceType"] = "mac2.metal" },
			"dynk8s:gateway.instanceType", "neither an x86_64 nor an arm64 type"},
		// The hibernation prerequisites that depend on the type: a hibernated warm pool.
		"hibernated on graviton": {func(c map[string]any) {
			p := pool(c, 1)
			p["spot"], p["instanceTypes"], p["amiId"] = false, []any{"c7g.2xlarge"}, "ami-0123456789abcdef0"
			p["warmPool"] = map[string]any{"state": "Hibernated"}
		}, "dynk8s:nodePools[1].warmPool.state", "c7g.2xlarge cannot hibernate"},
		"hibernated on a type EC2 does not hibernate": {func(c map[string]any) {
			p := pool(c, 1)
			p["spot"], p["instanceTypes"], p["amiId"] = false, []any{"c8g.2xlarge"}, "ami-0123456789abcdef0"
			p["warmPool"] = map[string]any{"state": "Hibernated"}
		}, "dynk8s:nodePools[1].warmPool.state", "c8g.2xlarge cannot hibernate"},
		"hibernated with too much RAM": {func(c map[string]any) {
			p := pool(c, 0)
			p["instanceTypes"], p["amiId"], p["volumeSizeGiB"] = []any{"r7i.8xlarge"}, "ami-0123456789abcdef0", 400
			p["warmPool"] = map[string]any{"state": "Hibernated"}
		}, "dynk8s:nodePools[0].warmPool.state", "262144 MiB of RAM"},
		"hibernated on a volume without room for the RAM": {func(c map[string]any) {
			p := pool(c, 0)
			p["amiId"], p["volumeSizeGiB"] = "ami-0123456789abcdef0", 25
			p["warmPool"] = map[string]any{"state": "Hibernated"}
		}, "dynk8s:nodePools[0].warmPool.state", "must hold the RAM of c7i.2xlarge (16 GiB)"},
	} {
		t.Run(name, func(t *testing.T) {
			c := devConfig(t)
			tc.mutate(c)
			cfg, err := mockcloud.ConfigFromMap(c)
			assert.NilError(t, err)
			res, err := plan.RunConfig("dev", cfg)
			var cfgErr *config.Error
			assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
			assert.Equal(t, cfgErr.Errors[0].Path, tc.path)
			assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, tc.want))
			assert.Equal(t, len(res.Cloud.Resources()), 0, "nothing declared")
		})
	}

	// A type offered in only some zones still works there; EC2's shape sizes the template node.
	c := devConfig(t)
	pool(c, 1)["instanceTypes"] = []any{"c8g.4xlarge"}
	res := runStack(t, c)
	tags := groupTags(find(t, res, "aws:autoscaling/group:Group", "pool-builders-arm-asg"))
	assert.Equal(t, tags["k8s.io/cluster-autoscaler/node-template/resources/cpu"], "16")
	var looked []string
	for _, call := range res.Cloud.Calls() {
		if call.Token == "aws:ec2/getInstanceType:getInstanceType" {
			looked = append(looked, call.Args["instanceType"].StringValue())
		}
	}
	assert.DeepEqual(t, looked, []string{"t4g.micro", "c7i.2xlarge", "c8g.4xlarge"})
}

// TestWarmPoolInTheStack: nodePools[i].warmPool reaches that pool's group and hook, and only that pool's; the
// example stacks keep every pool cold.
func TestWarmPoolInTheStack(t *testing.T) {
	for _, g := range runStack(t, devConfig(t)).Cloud.ByType("aws:autoscaling/group:Group") {
		assert.Check(t, in(&g, "warmPool") == nil, "%s: warm pools are opt-in", g.Name)
	}
	c := devConfig(t)
	pool(c, 0)["warmPool"] = map[string]any{"size": 2, "state": "Running"}
	res := runStack(t, c)
	x86 := find(t, res, "aws:autoscaling/group:Group", "pool-builders-x86-asg")
	assert.Equal(t, dig(in(x86, "warmPool"), "poolState"), "Running")
	assert.Equal(t, dig(in(x86, "warmPool"), "minSize"), float64(2))
	hook := find(t, res, "aws:autoscaling/lifecycleHook:LifecycleHook", "pool-builders-x86-launch")
	assert.Equal(t, in(hook, "autoscalingGroupName"), mockcloud.Plain(x86.Outputs["name"], true))
	assert.Check(t, res.Cloud.Find("aws:autoscaling/lifecycleHook:LifecycleHook", "pool-builders-arm-launch") == nil)
	assert.Check(t, in(find(t, res, "aws:autoscaling/group:Group", "pool-builders-arm-asg"), "warmPool") == nil)
}

// NodeUserDataBudget is issue 27's bound on a pool's user data, gzipped: a quarter of EC2's 16 KiB, so that the
// boot's growth lands in the agent, not in user data.
const nodeUserDataBudget = 4096

// Every pool of the dev and prod stacks fits nodeUserDataBudget: the bootstrap, node.json, units and host files.
// The sizes are logged for the record.
func TestNodeUserDataBudget(t *testing.T) {
	for _, stack := range []string{"dev", "prod"} {
		values, err := config.ReadStackFile("../Pulumi." + stack + ".yaml")
		assert.NilError(t, err)
		cfg, err := mockcloud.ConfigFromMap(values)
		assert.NilError(t, err)
		res, err := plan.RunConfig(stack, cfg)
		assert.NilError(t, err)
		n := 0
		for _, lt := range res.Cloud.Resources() {
			if lt.Type != "aws:ec2/launchTemplate:LaunchTemplate" {
				continue
			}
			gz, err := base64.StdEncoding.DecodeString(in(&lt, "userData").(string))
			assert.NilError(t, err)
			t.Logf("%s %s: %d bytes gzipped", stack, lt.Name, len(gz))
			assert.Check(t, len(gz) <= nodeUserDataBudget, "%s %s: %d bytes gzipped, over %d", stack, lt.Name, len(gz),
				nodeUserDataBudget)
			n++
		}
		assert.Check(t, n > 0, "%s: no launch template", stack)
	}
}

// TestOnPremNodesCheck: the stack needs a Ready on-prem Node labelled kube.LabelOnPrem, where the parts that hold its
// AWS keys run; without one the program fails with what to run and declares nothing in AWS, and it names the
// labelled Nodes that are not Ready.
func TestOnPremNodesCheck(t *testing.T) {
	run := func(ready []string) (*plan.Result, error) {
		cfg, err := mockcloud.ConfigFromMap(devConfig(t))
		assert.NilError(t, err)
		cfg.OnPremNodes = ready
		return plan.RunConfig("dev", cfg)
	}
	_, err := run([]string{"worker-1"})
	assert.NilError(t, err)
	res, err := run([]string{})
	assert.ErrorContains(t, err, "no Ready Node of the on-prem cluster is labelled "+kube.LabelOnPrem)
	assert.ErrorContains(t, err, "kubectl label node NAME "+kube.LabelOnPrem+"=true")
	for _, r := range res.Resources() {
		assert.Check(t, !strings.HasPrefix(r.Type, "aws:"), "declared %s %s before the check", r.Type, r.Name)
	}
}

// Every pool's node.json carries the tunnel as configured: the on-prem ranges its routes go to and wireguard.mtu, the
// MTU they are capped at (a value other than the default, so a node that took the default would fail this).
func TestPoolNodesRouteThroughTheTunnelAsConfigured(t *testing.T) {
	c := devConfig(t)
	obj(c, "wireguard")["mtu"] = 1380
	obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.0.0/16", "172.16.0.0/12"}
	res := runStack(t, c)
	lts := res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate")
	assert.Assert(t, len(lts) > 0)
	for _, lt := range lts {
		host := poolNodeConfig(t, &lt).Host
		assert.Check(t, is.Equal(host.TunnelMTU, uint16(1380)), lt.Name)
		assert.Check(t, slices.Equal(host.OnPremCIDRs, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"),
			netip.MustParsePrefix("172.16.0.0/12")}), "%s: %v", lt.Name, host.OnPremCIDRs)
	}
}

// TestWarmPoolReplacementPolicy: a pool with a warm pool lets the controller's user (the cleanup's) terminate the
// instances of that pool's group alone, by the group tag Auto Scaling puts on them and the cluster's, in the stack's
// region and account, and read groups and warm pools; the controller runs the warm loop for exactly that group. A
// pool without one grants nothing, and a stack without warm pools runs no warm loop.
func TestWarmPoolReplacementPolicy(t *testing.T) {
	c := devConfig(t)
	p := pool(c, 1)
	p["spot"], p["instanceTypes"], p["warmPool"] = false, []any{"c7g.2xlarge"}, map[string]any{"state": "Stopped"}
	name := p["name"].(string)
	res := runStack(t, c)

	group := out(find(t, res, "aws:autoscaling/group:Group", "pool-"+name+"-asg"), "name").(string)
	r := find(t, res, "aws:iam/userPolicy:UserPolicy", "pool-"+name+"-warm-replace")
	assert.Equal(t, in(r, "user"), "homelab-node-cleanup")
	assert.Equal(t, in(r, "name"), "replace-stale-warm-instances-"+name)
	doc := policy(t, r, "policy")
	assert.Assert(t, is.Len(doc.Statement, 2))
	read, terminate := doc.Statement[0], doc.Statement[1]
	assert.DeepEqual(t, read.Action, []string{"autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeWarmPool"})
	assert.DeepEqual(t, read.Condition, map[string]map[string]string{"StringEquals": {"aws:RequestedRegion": "eu-central-1"}})
	assert.DeepEqual(t, terminate.Action, []string{"ec2:TerminateInstances"})
	assert.DeepEqual(t, terminate.Resource, []string{"arn:aws:ec2:eu-central-1:123456789012:instance/*"})
	assert.DeepEqual(t, terminate.Condition, map[string]map[string]string{"StringEquals": {
		"aws:ResourceTag/aws:autoscaling:groupName": group,
		"aws:ResourceTag/dynk8s:cluster":            "homelab",
	}})
	assert.Check(t, is.DeepEqual(warmPolicies(res), []string{r.Name}), "this one pool's")

	args := controllerArgs(t, res)
	assert.Check(t, is.Contains(args, any("--warm-groups="+group)))
	assert.Check(t, slices.ContainsFunc(args, func(a any) bool {
		return strings.HasPrefix(a.(string), "--loops=") && strings.Contains(a.(string), ",warm,")
	}), "%v", args)

	cold := runStack(t, devConfig(t))
	assert.Check(t, is.Len(warmPolicies(cold), 0))
	for _, a := range controllerArgs(t, cold) {
		assert.Check(t, !strings.Contains(a.(string), "warm"), "%s", a)
	}
}

// warmPolicies are the names of the stack's warm replacement policies.
func warmPolicies(res *plan.Result) []string {
	var found []string
	for _, r := range res.Cloud.ByType("aws:iam/userPolicy:UserPolicy") {
		if strings.HasPrefix(in(&r, "name").(string), "replace-stale-warm-instances-") {
			found = append(found, r.Name)
		}
	}
	return found
}

// controllerArgs are the controller container's arguments.
func controllerArgs(t *testing.T, res *plan.Result) []any {
	t.Helper()
	spec := mockcloud.PlainMap(find(t, res, "kubernetes:apps/v1:Deployment", "addons-controller").Inputs, false)["spec"]
	return asList(dig(spec, "template", "spec", "containers", 0, "args"))
}

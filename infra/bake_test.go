package infra_test

import (
	"errors"
	"net/netip"
	"regexp"
	"slices"
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
	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

const launchTemplate = "aws:ec2/launchTemplate:LaunchTemplate"

// bakedDev is the dev stack with its x86_64 pool baked (the arm64 pool stays stock).
func bakedDev(t *testing.T) map[string]any {
	t.Helper()
	c := devConfig(t)
	pool(c, 0)["image"] = "baked"
	return c
}

func out(r *mockcloud.Resource, key string) any {
	return mockcloud.Plain(r.Outputs[resource.PropertyKey(key)], true)
}

// parsed is the config the program reads from values.
func parsed(t *testing.T, values map[string]any) *config.Config {
	t.Helper()
	cfg, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	c, err := config.ParseValues(cfg.Values)
	assert.NilError(t, err)
	return c
}

// bakeID is the identity of pool i's baked image in values.
func bakeID(t *testing.T, values map[string]any, i int) string {
	t.Helper()
	c := parsed(t, values)
	id, err := infra.BakeID(c, c.NodePools[i])
	assert.NilError(t, err)
	return id
}

// runRefused runs the program on values with the mock's settings changed by mutate, and returns the config error
// it refused the stack with and what the run declared.
func runRefused(t *testing.T, values map[string]any, mutate func(*mockcloud.StackConfig)) (*config.Error, *plan.Result) {
	t.Helper()
	cfg, err := mockcloud.ConfigFromMap(values)
	assert.NilError(t, err)
	mutate(&cfg)
	res, err := plan.RunConfig("dev", cfg)
	var cfgErr *config.Error
	assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
	return cfgErr, res
}

// A baked pool boots the image the lookup found: the newest available image of this account tagged with the
// cluster, the pool and the config's BakeID, asked before anything is declared. The program declares nothing of a
// build (no Image Builder resource) and does not look up the pool's Fedora image; the stock pool beside it boots
// its Fedora image as before.
func TestBakedPoolBootsTheBakedImage(t *testing.T) {
	stock := runStack(t, devConfig(t))
	values := bakedDev(t)
	res := runStack(t, values)
	id := bakeID(t, values, 0)
	assert.Check(t, is.Regexp(`^[0-9a-f]{64}$`, id))

	lt := find(t, res, launchTemplate, "pool-builders-x86-lt")
	assert.Equal(t, in(lt, "imageId"), mockcloud.StandInBakedImage("homelab", "builders-x86", id))
	assert.Equal(t, dig(in(lt, "blockDeviceMappings"), 0, "deviceName"), "/dev/sda1", "the baked image's root device")
	arm := find(t, res, launchTemplate, "pool-builders-arm-lt")
	assert.Equal(t, in(arm, "imageId"), in(find(t, stock, launchTemplate, "pool-builders-arm-lt"), "imageId"))

	var lookups []mockcloud.Call
	for _, c := range res.Cloud.Calls() {
		if c.Token != "aws:ec2/getAmi:getAmi" {
			continue
		}
		filters := mockcloud.AMIFilters(c.Args)
		if _, ok := filters["tag:"+infra.BakeTag]; ok {
			lookups = append(lookups, c)
		}
		assert.Check(t, filters["architecture"] != "x86_64", "a baked pool looks up no Fedora image: %v", filters)
	}
	assert.Assert(t, is.Len(lookups, 1))
	args := mockcloud.PlainMap(lookups[0].Args, false)
	assert.DeepEqual(t, args["owners"], []any{"self"})
	assert.Equal(t, args["mostRecent"], true)
	assert.DeepEqual(t, mockcloud.AMIFilters(lookups[0].Args), map[string]string{
		"tag:dynk8s:cluster": "homelab", "tag:dynk8s:pool": "builders-x86", "tag:" + infra.BakeTag: id,
		"state": "available",
	})
	for _, r := range res.Cloud.Resources() {
		assert.Check(t, !strings.HasPrefix(r.Type, "aws:imagebuilder/"), "%s %s", r.Type, r.Name)
	}
}

// A baked pool's launch template boots the image it is given, on the image's own root device, without looking up
// the Fedora image; a baked pool without it is refused.
func TestNodePoolBootsItsBakedImage(t *testing.T) {
	pool := config.NodePool{Name: "x", Arch: kube.ArchX86_64, InstanceTypes: []string{"c7i.large"}, MaxSize: 1,
		VolumeSizeGiB: 30, Image: config.ImageBaked}
	declare := func(baked *infra.BakedImage) func(ctx *pulumi.Context) error {
		return func(ctx *pulumi.Context) error {
			_, err := infra.NewNodePool(ctx, "pool-x", &infra.NodePoolArgs{
				ClusterName: "lab", Pool: pool, Agent: testAgentObject(), BakedImage: baked,
				Node: nodeconfig.Node{
					APIServerEndpoint:  endpoint.HostPort{Host: "10.0.0.1", Port: 6443},
					JoinTokenParameter: "/dynk8s/lab/join-token", ClusterName: "lab", PoolName: "x",
					Join: nodeconfig.Join{Labels: pool.NodeLabels()},
					Host: nodeconfig.Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, TunnelMTU: 1420},
				},
				Render:             cloudinit.NodeRender{KubernetesVersion: kube.Version{Major: 1, Minor: 35, Patch: 1}},
				CACertHashes:       pulumi.ToStringArray([]string{"sha256:" + strings.Repeat("ab", 32)}),
				SubnetIDs:          pulumi.ToStringArray([]string{"subnet-1"}),
				SecurityGroupID:    pulumi.String("sg-1"),
				InstanceProfileARN: pulumi.String("arn:aws:iam::1:instance-profile/lab-node"),
			})
			return err
		}
	}
	cloud := runComponent(t, declare(&infra.BakedImage{ID: "ami-0baked0baked0bake", RootDeviceName: "/dev/xvda"}))
	lt := mustFind(t, cloud, launchTemplate, "pool-x-lt")
	assert.Equal(t, in(lt, "imageId"), "ami-0baked0baked0bake")
	assert.Equal(t, dig(in(lt, "blockDeviceMappings"), 0, "deviceName"), "/dev/xvda")
	assert.Equal(t, dig(in(lt, "blockDeviceMappings"), 0, "ebs", "volumeSize"), float64(30))
	assert.Check(t, is.Len(cloud.Calls(), 0), "no image lookup")

	err := mockcloud.Run(declare(nil), "test", mockcloud.StackConfig{}, mockcloud.New("us-west-2"))
	assert.Check(t, is.ErrorContains(err, `node pool "pool-x": a baked pool needs its baked image's id and root device`))
}

// Without its baked image a pool fails the preview at its image key, with the image's full identity, the region
// and the exact command that bakes it, and nothing is declared; every pool without one is a problem of the same
// error, and so is a pinned image of the wrong architecture beside them.
func TestMissingBakedImageFailsThePreview(t *testing.T) {
	values := bakedDev(t)
	id := bakeID(t, values, 0)
	cfgErr, res := runRefused(t, values, func(c *mockcloud.StackConfig) { c.NoBakedImage = []string{"builders-x86"} })
	assert.Assert(t, is.Len(cfgErr.Errors, 1))
	assert.Equal(t, cfgErr.Errors[0].Path, "dynk8s:nodePools[0].image")
	assert.Equal(t, cfgErr.Errors[0].Msg, "no baked image of pool builders-x86 for this config (tag dynk8s:bake-sha256="+
		id+") in eu-central-1: bake it with `go run ./cmd/bake -stack dev -pool builders-x86`, then run the preview again")
	assert.Equal(t, infra.BakeCommand("dev", "builders-x86"), "go run ./cmd/bake -stack dev -pool builders-x86")
	assert.Check(t, is.Len(res.Cloud.Resources(), 0), "nothing declared")
	assert.Check(t, is.Contains(cfgErr.Error(), "nothing was declared"))

	both := bakedDev(t)
	pool(both, 1)["image"] = "baked"
	cfgErr, res = runRefused(t, both, func(c *mockcloud.StackConfig) {
		c.NoBakedImage = []string{"builders-x86", "builders-arm"}
	})
	assert.Assert(t, is.Len(cfgErr.Errors, 2))
	for i, name := range []string{"builders-x86", "builders-arm"} {
		assert.Check(t, is.Equal(cfgErr.Errors[i].Path, "dynk8s:nodePools["+string(rune('0'+i))+"].image"))
		assert.Check(t, is.Contains(cfgErr.Errors[i].Msg, "`go run ./cmd/bake -stack dev -pool "+name+"`"))
		assert.Check(t, is.Contains(cfgErr.Errors[i].Msg, infra.BakeTag+"="+bakeID(t, both, i)+")"))
	}
	assert.Check(t, is.Len(res.Cloud.Resources(), 0), "nothing declared")

	pinned := bakedDev(t)
	pool(pinned, 1)["amiId"] = "ami-0123456789abcdef0" // x86_64, on the arm64 pool
	cfgErr, _ = runRefused(t, pinned, func(c *mockcloud.StackConfig) { c.NoBakedImage = []string{"builders-x86"} })
	var paths []string
	for _, e := range cfgErr.Errors {
		paths = append(paths, e.Path)
	}
	assert.DeepEqual(t, paths, []string{"dynk8s:nodePools[1].amiId", "dynk8s:nodePools[0].image"})
}

// A baked image of another architecture than its pool's fails the preview too: every launch would fail.
func TestBakedImageArchitecture(t *testing.T) {
	values := bakedDev(t)
	cfgErr, res := runRefused(t, values, func(c *mockcloud.StackConfig) {
		c.BakedArch = map[string]string{"builders-x86": "arm64"}
	})
	assert.Assert(t, is.Len(cfgErr.Errors, 1))
	assert.Equal(t, cfgErr.Errors[0].Path, "dynk8s:nodePools[0].image")
	assert.Check(t, is.Regexp(`^the baked image ami-0[0-9a-f]{16} of pool builders-x86 \(tag dynk8s:bake-sha256=[0-9a-f]{64}\) `+
		`is arm64, the pool's instance types are x86_64: bake it again with `+
		regexp.QuoteMeta("`go run ./cmd/bake -stack dev -pool builders-x86`")+`$`, cfgErr.Errors[0].Msg))
	assert.Check(t, is.Len(res.Cloud.Resources(), 0), "nothing declared")
}

// The image's identity is what the bake prepares from and starts from: a change of the pre-pull images, the
// Kubernetes version, the pause image, the fuse plugin (its image is pre-pulled), the Fedora release or the
// architecture is a new identity, hence a bake before the next preview passes. Nothing of the join is in it: a
// change of the pool's labels, taints or group, of the gateway, the tunnel, the API server, the CA pin, the DNS, a
// warm pool (the boot's launch hook) or the autoscaler's deadlines bakes nothing. The same config gives the same
// identity.
func TestBakeIDFollowsThePrepare(t *testing.T) {
	base := bakeID(t, bakedDev(t), 0)
	assert.Equal(t, bakeID(t, bakedDev(t), 0), base, "the same config, the same identity")
	assert.Check(t, bakeID(t, bakedDev(t), 1) != base, "another pool, another image")

	change := func(mutate func(c map[string]any)) string {
		c := bakedDev(t)
		mutate(c)
		return bakeID(t, c, 0)
	}
	for name, mutate := range map[string]func(c map[string]any){
		"prePullImages":      func(c map[string]any) { pool(c, 0)["prePullImages"] = []any{"quay.io/jenkins/agent:3.1"} },
		"kubernetes.version": func(c map[string]any) { obj(c, "kubernetes")["version"] = "1.36.4" },
		"fedora.release":     func(c map[string]any) { obj(c, "fedora")["release"] = 43 },
		"images.pause":       func(c map[string]any) { obj(c, "images")["pause"] = "mirror.example.com/pause:3.10.2" },
		"fuse.enabled":       func(c map[string]any) { obj(c, "fuse")["enabled"] = false },
	} {
		assert.Check(t, change(mutate) != base, "%s changed, the identity did not", name)
	}
	c := parsed(t, bakedDev(t))
	arm := c.NodePools[0]
	arm.Arch = kube.ArchArm64
	id, err := infra.BakeID(c, arm)
	assert.NilError(t, err)
	assert.Check(t, id != base, "another architecture, another image")

	for name, mutate := range map[string]func(c map[string]any){
		"labels": func(c map[string]any) { pool(c, 0)["labels"] = map[string]any{"example.com/team": "ci"} },
		"taints": func(c map[string]any) {
			pool(c, 0)["taints"] = []any{map[string]any{"key": "example.com/ci", "effect": "NoSchedule"}}
		},
		"pool sizes and types": func(c map[string]any) {
			pool(c, 0)["maxSize"], pool(c, 0)["volumeSizeGiB"] = 9, 120
			pool(c, 0)["instanceTypes"] = []any{"c7i.4xlarge"}
		},
		"warmPool":              func(c map[string]any) { pool(c, 0)["warmPool"] = map[string]any{"size": 1} },
		"wireguard.mtu":         func(c map[string]any) { obj(c, "wireguard")["mtu"] = 1380 },
		"wireguard.onPremCidrs": func(c map[string]any) { obj(c, "wireguard")["onPremCidrs"] = []any{"192.168.0.0/16"} },
		"gateway":               func(c map[string]any) { obj(c, "gateway")["idleStop"] = "0" },
		"kubernetes.apiServer":  func(c map[string]any) { obj(c, "kubernetes")["apiServerEndpoint"] = "192.168.10.11:6443" },
		"kubernetes.caCertHash": func(c map[string]any) { obj(c, "kubernetes")["caCertHash"] = "sha256:" + strings.Repeat("1", 64) },
		"network.onPremDns": func(c map[string]any) {
			obj(c, "network")["onPremDns"] = map[string]any{"servers": []any{"192.168.10.54"}, "domains": []any{"lab.lan"}}
		},
		"autoscaler.provision time":  func(c map[string]any) { obj(c, "autoscaler")["maxNodeProvisionTime"] = "40m" },
		"terminationHandler.enabled": func(c map[string]any) { obj(c, "terminationHandler")["enabled"] = false },
	} {
		assert.Check(t, is.Equal(change(mutate), base), "%s changed the identity", name)
	}
}

// The bake instances' role and profile, declared only with a baked pool: named BakeProfileName, which cmd/bake
// launches with; trusted by EC2 alone; tagged as the cluster's, as no pool's (a bake never keeps the gateway awake).
// Its only permission is the read of the baked architectures' agent objects: no managed policy, no other inline
// policy.
func TestBakeRoleReadsOnlyTheAgent(t *testing.T) {
	stock := runStack(t, devConfig(t))
	assert.Check(t, stock.Cloud.Find("aws:iam/role:Role", "bake-role") == nil, "a stock stack has no bake role")
	assert.Check(t, is.Len(stock.Cloud.ByType("dynk8s:infra:BakeProfile"), 0))

	res := runStack(t, bakedDev(t))
	role := find(t, res, "aws:iam/role:Role", "bake-role")
	assert.Equal(t, role.Parent, "bake")
	assert.Equal(t, infra.BakeProfileName("homelab"), "homelab-bake")
	assert.Equal(t, in(role, "name"), infra.BakeProfileName("homelab"))
	assert.Equal(t, in(role, "path"), "/dynk8s/")
	trust := policy(t, role, "assumeRolePolicy")
	assert.Assert(t, is.Len(trust.Statement, 1))
	assert.DeepEqual(t, trust.Statement[0].Principal, map[string][]string{"Service": {"ec2.amazonaws.com"}})
	assert.DeepEqual(t, trust.Statement[0].Action, []string{"sts:AssumeRole"})
	assert.DeepEqual(t, in(role, "tags"), map[string]any{"Name": "homelab-bake", "dynk8s:cluster": "homelab"})

	profile := find(t, res, "aws:iam/instanceProfile:InstanceProfile", "bake-profile")
	assert.Equal(t, in(profile, "name"), infra.BakeProfileName("homelab"))
	assert.Equal(t, in(profile, "path"), "/dynk8s/")
	assert.Equal(t, in(profile, "role"), out(role, "name"))

	name := out(role, "name")
	var attached, inline []string
	for _, a := range res.Cloud.ByType("aws:iam/rolePolicyAttachment:RolePolicyAttachment") {
		if in(&a, "role") == name {
			attached = append(attached, in(&a, "policyArn").(string))
		}
	}
	assert.Check(t, is.Len(attached, 0), "managed policies on the bake role: %v", attached)
	for _, p := range res.Cloud.ByType("aws:iam/rolePolicy:RolePolicy") {
		if in(&p, "role") == name {
			inline = append(inline, p.Name)
		}
	}
	assert.DeepEqual(t, inline, []string{"agent-bake-read"})
	read := policy(t, find(t, res, "aws:iam/rolePolicy:RolePolicy", "agent-bake-read"), "policy")
	bucket := out(find(t, res, "aws:s3/bucketV2:BucketV2", "agent"), "arn").(string)
	assert.Assert(t, is.Len(read.Statement, 1))
	assert.DeepEqual(t, read.Statement[0].Resource, []string{bucket + "/dynk8s-node/linux-amd64"})
	assert.DeepEqual(t, read.Statement[0].Action, []string{"s3:GetObject", "s3:GetObjectVersion"})

	// Both pools baked: the role reads both architectures' agents, still with one policy.
	both := bakedDev(t)
	pool(both, 1)["image"] = "baked"
	res = runStack(t, both)
	read = policy(t, find(t, res, "aws:iam/rolePolicy:RolePolicy", "agent-bake-read"), "policy")
	resources := slices.Clone(read.Statement[0].Resource)
	slices.Sort(resources)
	bucket = out(find(t, res, "aws:s3/bucketV2:BucketV2", "agent"), "arn").(string)
	assert.DeepEqual(t, resources, []string{bucket + "/dynk8s-node/linux-amd64", bucket + "/dynk8s-node/linux-arm64"})
	assert.Check(t, is.Len(res.Cloud.ByType("dynk8s:infra:BakeProfile"), 1), "one profile for every baked pool")
}

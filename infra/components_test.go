package infra_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/mockcloud"
)

// Each AWS component on its own, under the mock engine, with args that no example stack has: the components take
// exactly what they use, so a test can build any one of them without a whole config.

// runComponent runs declare under the mock engine and returns what it declared.
func runComponent(t *testing.T, declare func(ctx *pulumi.Context) error) *mockcloud.Cloud {
	t.Helper()
	cloud := mockcloud.New("us-west-2")
	assert.NilError(t, mockcloud.Run(declare, "test", mockcloud.StackConfig{}, cloud))
	return cloud
}

func mustFind(t *testing.T, cloud *mockcloud.Cloud, typ, name string) *mockcloud.Resource {
	t.Helper()
	r := cloud.Find(typ, name)
	assert.Assert(t, r != nil, "no %s named %s", typ, name)
	return r
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestNetworkComponent(t *testing.T) {
	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		_, err := infra.NewNetwork(ctx, "net", &infra.NetworkArgs{
			ClusterName:     "lab",
			VPCCIDR:         prefix("10.50.0.0/20"),
			Zones:           []string{"us-west-2c", "us-west-2a"},
			OnPremCIDRs:     []netip.Prefix{prefix("192.168.1.0/24"), prefix("172.20.0.0/16")},
			TunnelCIDR:      prefix("10.51.0.0/30"),
			ListenPort:      4500,
			WireGuardSource: prefix("203.0.113.9/32"),
		})
		return err
	})
	// Subnets are numbered by the zone's letter, whatever the order of the list: /20 split in 16 gives /24s.
	assert.Equal(t, in(mustFind(t, cloud, "aws:ec2/subnet:Subnet", "net-subnet-us-west-2a"), "cidrBlock"), "10.50.0.0/24")
	assert.Equal(t, in(mustFind(t, cloud, "aws:ec2/subnet:Subnet", "net-subnet-us-west-2c"), "cidrBlock"), "10.50.2.0/24")
	// The gateway's fixed address is in the first listed zone's subnet.
	eni := mustFind(t, cloud, "aws:ec2/networkInterface:NetworkInterface", "net-gateway-eni")
	assert.DeepEqual(t, in(eni, "privateIps"), []any{"10.50.2.10"})
	var routed []string
	for _, r := range cloud.ByType("aws:ec2/route:Route") {
		if in(&r, "networkInterfaceId") == eni.ID {
			routed = append(routed, in(&r, "destinationCidrBlock").(string))
		}
	}
	slices.Sort(routed)
	assert.DeepEqual(t, routed, []string{"10.51.0.0/30", "172.20.0.0/16", "192.168.1.0/24"})
	gw := mustFind(t, cloud, "aws:ec2/securityGroup:SecurityGroup", "net-gateway-sg")
	wg := asMap(asList(in(gw, "ingress"))[0])
	assert.DeepEqual(t, wg["cidrBlocks"], []any{"203.0.113.9/32"})
	assert.Equal(t, wg["fromPort"], float64(4500))
	vpc := mustFind(t, cloud, "aws:ec2/vpc:Vpc", "net-vpc")
	assert.Equal(t, asMap(in(vpc, "tags"))["dynk8s:cluster"], "lab")

	err := mockcloud.Run(func(ctx *pulumi.Context) error {
		_, err := infra.NewNetwork(ctx, "net", &infra.NetworkArgs{ClusterName: "lab", VPCCIDR: prefix("10.50.0.0/20")})
		return err
	}, "test", mockcloud.StackConfig{}, mockcloud.New("us-west-2"))
	assert.ErrorContains(t, err, "at least one zone")
}

func TestIdentityComponent(t *testing.T) {
	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		_, err := infra.NewIdentity(ctx, "id", &infra.IdentityArgs{
			ClusterName: "lab", Region: "us-west-2",
			AutoscalerKeyRotation: "2026-11", BootstrapTokenRotation: "7",
		})
		return err
	})
	assert.Check(t, is.Len(cloud.ByType("aws:iam/rolePolicyAttachment:RolePolicyAttachment"), 0),
		"the node role has no managed policy")
	mustFind(t, cloud, "aws:iam/accessKey:AccessKey", "id-autoscaler-key-2026-11")
	token := mustFind(t, cloud, "aws:ssm/parameter:Parameter", "id-join-token")
	assert.Equal(t, in(token, "name"), "/dynk8s/lab/join-token")
	assert.Check(t, token.Inputs["value"].IsSecret() || token.Inputs["value"].ContainsSecrets())
	doc := policy(t, mustFind(t, cloud, "aws:iam/userPolicy:UserPolicy", "id-autoscaler"), "policy")
	assert.DeepEqual(t, doc.Statement[1].Condition["StringEquals"],
		map[string]string{"autoscaling:ResourceTag/k8s.io/cluster-autoscaler/lab": "owned"})
}

func TestWireGuardGatewayComponent(t *testing.T) {
	ownKey, err := wgtypes.ParseKey("xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=")
	assert.NilError(t, err)
	endpoint, err := config.ParseEndpoint("vpn.example.org:41820")
	assert.NilError(t, err)
	var conf pulumi.StringOutput
	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		image, err := infra.FedoraImage(42, kube.ArchX86_64, "us-west-2")
		if err != nil {
			return err
		}
		igw, err := ec2.NewInternetGateway(ctx, "igw", &ec2.InternetGatewayArgs{VpcId: pulumi.String("vpc-1")})
		if err != nil {
			return err
		}
		gw, err := infra.NewWireGuardGateway(ctx, "gw", &infra.WireGuardGatewayArgs{
			ClusterName:  "lab",
			Region:       "us-west-2",
			InstanceType: "t3.micro",
			Image:        image,
			WireGuard: config.WireGuard{
				ListenPort: 4500, OnPremCIDRs: []netip.Prefix{prefix("192.168.1.0/24")},
				TunnelCIDR: prefix("10.51.0.0/29"), MTU: 1380, OnPremPublicKey: &ownKey, OnPremEndpoint: &endpoint,
			},
			VPCCIDR:             prefix("10.50.0.0/20"),
			InterfaceID:         pulumi.String("eni-0123"),
			InternetGateway:     igw,
			InstanceProfileName: pulumi.String("lab-gateway"),
		})
		if err != nil {
			return err
		}
		conf = gw.OnPremConfig
		return nil
	})
	assert.Equal(t, len(cloud.ByType("random:index/randomBytes:RandomBytes")), 1, "no on-prem key pair with the operator's own")
	inst := mustFind(t, cloud, "aws:ec2/instance:Instance", "gw")
	assert.Equal(t, in(inst, "instanceType"), "t3.micro")
	raw, err := cloudinit.Decode(in(inst, "userDataBase64").(string))
	assert.NilError(t, err)
	for _, want := range []string{"Endpoint = vpn.example.org:41820", "PublicKey = " + ownKey.String(),
		"AllowedIPs = 192.168.1.0/24, 10.51.0.2/32", "MTU = 1380", "Address = 10.51.0.1/29"} {
		assert.Check(t, is.Contains(string(raw), want))
	}
	text, secret, err := mockcloud.Await(conf)
	assert.NilError(t, err)
	assert.Check(t, secret)
	for _, want := range []string{"ListenPort = 41820", "AllowedIPs = 10.50.0.0/20, 10.51.0.1/32",
		"PostUp = wg set %i private-key /etc/wireguard/dynk8s.key", ":4500"} {
		assert.Check(t, is.Contains(text.(string), want))
	}
}

func TestNodePoolComponent(t *testing.T) {
	pool := config.NodePool{
		Name: "gpu", Arch: kube.ArchArm64, InstanceTypes: []string{"c7g.xlarge", "c6g.xlarge"}, MaxSize: 2,
		Spot: true, VolumeSizeGiB: 30, AMIID: "ami-0123456789abcdef0",
		Taints: []kube.Taint{{Key: "example.com/gpu", Effect: kube.NoSchedule}},
	}
	tags := []config.Tag{{Key: "Name", Value: "lab-gpu", PropagateAtLaunch: true}, {Key: "k8s.io/cluster-autoscaler/lab", Value: "owned"}}
	hash := "sha256:" + strings.Repeat("ab", 32)
	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		_, err := infra.NewNodePool(ctx, "pool-gpu", &infra.NodePoolArgs{
			ClusterName: "lab",
			Pool:        pool,
			GroupTags:   tags,
			Node: cloudinit.NodeInput{
				KubernetesVersion: kube.Version{Major: 1, Minor: 35, Patch: 1}, APIServerEndpoint: "10.0.0.1:6443",
				JoinTokenParameter: "/dynk8s/lab/join-token", ClusterName: "lab", PoolName: "gpu",
				Labels: pool.NodeLabels(), Taints: pool.Taints,
				Host: cloudinit.HostInput{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, TunnelMTU: 1420},
			},
			CACertHashes:       pulumi.ToStringArray([]string{hash}),
			SubnetIDs:          pulumi.ToStringArray([]string{"subnet-1"}),
			SecurityGroupID:    pulumi.String("sg-1"),
			InstanceProfileARN: pulumi.String("arn:aws:iam::1:instance-profile/lab-node"),
		})
		return err
	})
	lt := mustFind(t, cloud, "aws:ec2/launchTemplate:LaunchTemplate", "pool-gpu-lt")
	assert.Equal(t, in(lt, "imageId"), "ami-0123456789abcdef0")
	ud, err := cloudinit.Decode(in(lt, "userData").(string))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(ud), hash), "the CA pin reaches the join configuration")
	assert.Check(t, is.Contains(string(ud), "stable:/v1.35/rpm/"), "the node installs its own minor")
	group := mustFind(t, cloud, "aws:autoscaling/group:Group", "pool-gpu-asg")
	assert.DeepEqual(t, group.IgnoreChanges, []string{"desiredCapacity"})
	var keys []string
	for _, tag := range asList(in(group, "tags")) {
		keys = append(keys, asMap(tag)["key"].(string))
	}
	assert.DeepEqual(t, keys, []string{"Name", "k8s.io/cluster-autoscaler/lab"})
	overrides := asList(asMap(asMap(in(group, "mixedInstancesPolicy"))["launchTemplate"])["overrides"])
	assert.Equal(t, len(overrides), 2)
}

package infra_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
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
	// The gateway runs in the first listed zone's subnet; the network declares no route to it (the gateway does).
	assert.Equal(t, len(cloud.ByType("aws:ec2/route:Route")), 1, "the default route only")
	assert.Equal(t, len(cloud.ByType("aws:ec2/networkInterface:NetworkInterface")), 0)
	ip, err := infra.GatewayPrivateIP(prefix("10.50.0.0/20"), "us-west-2c")
	assert.NilError(t, err)
	assert.Equal(t, ip.String(), "10.50.2.10")
	gw := mustFind(t, cloud, "aws:ec2/securityGroup:SecurityGroup", "net-gateway-sg")
	wg := asMap(asList(in(gw, "ingress"))[0])
	assert.DeepEqual(t, wg["cidrBlocks"], []any{"203.0.113.9/32"})
	assert.Equal(t, wg["fromPort"], float64(4500))
	vpc := mustFind(t, cloud, "aws:ec2/vpc:Vpc", "net-vpc")
	assert.Equal(t, asMap(in(vpc, "tags"))["dynk8s:cluster"], "lab")

	err = mockcloud.Run(func(ctx *pulumi.Context) error {
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
	assert.DeepEqual(t, token.IgnoreChanges, []string{"value", "description"})
	mustFind(t, cloud, "aws:iam/accessKey:AccessKey", "id-token-rotator-key-7")
	rotator := policy(t, mustFind(t, cloud, "aws:iam/userPolicy:UserPolicy", "id-token-rotator"), "policy")
	assert.DeepEqual(t, rotator.Statement[0].Resource, []string{"arn:aws:ssm:us-west-2:123456789012:parameter/dynk8s/lab/join-token"})
	doc := policy(t, mustFind(t, cloud, "aws:iam/userPolicy:UserPolicy", "id-autoscaler"), "policy")
	assert.DeepEqual(t, doc.Statement[1].Condition["StringEquals"],
		map[string]string{"autoscaling:ResourceTag/k8s.io/cluster-autoscaler/lab": "owned", "aws:RequestedRegion": "us-west-2"})
	assert.DeepEqual(t, doc.Statement[0].Condition, map[string]map[string]string{
		"StringEquals": {"aws:RequestedRegion": "us-west-2"},
	}) // the read statement is region-scoped too

	// The node may hand its own boot back, on this cluster's groups only: the two write actions are scoped to the
	// stack's region and account and to the cluster's group tag; the lookup of its group cannot be scoped.
	lifecycle := mustFind(t, cloud, "aws:iam/rolePolicy:RolePolicy", "id-node-lifecycle")
	assert.Equal(t, in(lifecycle, "role"), "lab-node")
	assert.DeepEqual(t, policy(t, lifecycle, "policy"), infra.PolicyDocument{Version: "2012-10-17", Statement: []infra.PolicyStatement{
		{Sid: "FindOwnGroup", Effect: "Allow", Action: []string{"autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances"}, Resource: []string{"*"}},
		{
			Sid: "HandOwnBootBackToThisClustersGroups", Effect: "Allow",
			Action:   []string{"autoscaling:CompleteLifecycleAction", "autoscaling:SetInstanceHealth"},
			Resource: []string{"arn:aws:autoscaling:us-west-2:123456789012:autoScalingGroup:*:autoScalingGroupName/*"},
			Condition: map[string]map[string]string{
				"StringEquals": {"autoscaling:ResourceTag/k8s.io/cluster-autoscaler/lab": "owned"},
			},
		},
	}})
	// Only the node: the gateway's role gets no such policy.
	for _, p := range cloud.ByType("aws:iam/rolePolicy:RolePolicy") {
		if strings.Contains(p.Name, "gateway") {
			assert.Check(t, !strings.Contains(in(&p, "policy").(string), "autoscaling:"), p.Name)
		}
	}
}

// gatewayArgs are a gateway's args outside any example stack: a dialling-out gateway that sleeps after 20 minutes.
func gatewayArgs(t *testing.T, igw pulumi.Resource) *infra.WireGuardGatewayArgs {
	t.Helper()
	ownKey, err := wgtypes.ParseKey("xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=")
	assert.NilError(t, err)
	peer, err := endpoint.Parse("vpn.example.org:41820")
	assert.NilError(t, err)
	image, err := infra.FedoraImage(42, kube.ArchX86_64, "us-west-2")
	assert.NilError(t, err)
	return &infra.WireGuardGatewayArgs{
		ClusterName:  "lab",
		Region:       "us-west-2",
		InstanceType: "t3.micro",
		Image:        image,
		WireGuard: config.WireGuard{
			ListenPort: 4500, OnPremCIDRs: []netip.Prefix{prefix("192.168.1.0/24")},
			TunnelCIDR: prefix("10.51.0.0/29"), MTU: 1380, OnPremPublicKey: &ownKey, OnPremEndpoint: &peer,
		},
		VPCCIDR:             prefix("10.50.0.0/20"),
		IdleStop:            20 * time.Minute,
		SubnetID:            pulumi.String("subnet-1"),
		SecurityGroupID:     pulumi.String("sg-1"),
		PrivateIP:           "10.50.2.10",
		RouteTableID:        pulumi.String("rtb-1"),
		RoutedCIDRs:         []netip.Prefix{prefix("192.168.1.0/24"), prefix("10.51.0.0/29")},
		Internet:            []pulumi.Resource{igw},
		InstanceProfileName: pulumi.String("lab-gateway"),
		GatewayRoleName:     pulumi.String("lab-gateway"),
		NodeRoleName:        pulumi.String("lab-node"),
		Agent:               testAgentObject(),
	}
}

func TestWireGuardGatewayComponent(t *testing.T) {
	var conf, publicIP pulumi.StringOutput
	var args *infra.WireGuardGatewayArgs
	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		igw, err := ec2.NewInternetGateway(ctx, "igw", &ec2.InternetGatewayArgs{VpcId: pulumi.String("vpc-1")})
		if err != nil {
			return err
		}
		args = gatewayArgs(t, igw)
		gw, err := infra.NewWireGuardGateway(ctx, "gw", args)
		if err != nil {
			return err
		}
		conf, publicIP = gw.OnPremConfig, gw.PublicIP
		return nil
	})
	assert.Equal(t, len(cloud.ByType("random:index/randomBytes:RandomBytes")), 1, "no on-prem key pair with the operator's own")
	inst := mustFind(t, cloud, "aws:ec2/instance:Instance", "gw")
	assert.Equal(t, in(inst, "instanceType"), "t3.micro")
	raw, err := cloudinit.Decode(in(inst, "userDataBase64").(string))
	assert.NilError(t, err)
	for _, want := range []string{"Endpoint = vpn.example.org:41820", "PublicKey = " + args.WireGuard.OnPremPublicKey.String(),
		"AllowedIPs = 192.168.1.0/24, 10.51.0.2/32", "MTU = 1380", "Address = 10.51.0.1/29",
		`"clusterName": "lab"`, `"stop": "20m0s"`, "DYNK8S_AGENT_BUCKET=lab-agent\n", "DYNK8S_AGENT_VERSION_ID=v1\n",
		"DYNK8S_AGENT_KEY=dynk8s-node/linux-amd64\n"} {
		assert.Check(t, is.Contains(string(raw), want))
	}
	assert.Check(t, is.Equal(asMap(in(inst, "tags"))[infra.IdleStopTag], "20m0s"))
	// The smallest root volume the image allows (its snapshot's size), encrypted gp3.
	root := asMap(in(inst, "rootBlockDevice"))
	assert.Check(t, is.Equal(root["volumeSize"], float64(mockcloud.FedoraSnapshotGiB)))
	assert.Check(t, is.Equal(root["volumeType"], "gp3"))
	assert.Check(t, is.Equal(root["encrypted"], true))
	// `systemctl poweroff` stops it; it forwards; it has its own interface at the fixed address.
	assert.Check(t, is.Equal(in(inst, "instanceInitiatedShutdownBehavior"), "stop"))
	assert.Check(t, is.Equal(in(inst, "sourceDestCheck"), false))
	assert.Check(t, is.Equal(in(inst, "privateIp"), "10.50.2.10"))
	assert.Check(t, is.Equal(in(inst, "subnetId"), "subnet-1"))

	// Dialling out: no Elastic IP, and no address in the on-prem config; the on-prem peer listens.
	assert.Equal(t, len(cloud.ByType("aws:ec2/eip:Eip")), 0)
	ip, _, err := mockcloud.Await(publicIP)
	assert.NilError(t, err)
	assert.Equal(t, ip, "")
	text, secret, err := mockcloud.Await(conf)
	assert.NilError(t, err)
	assert.Check(t, secret)
	for _, want := range []string{"ListenPort = 41820", "AllowedIPs = 10.50.0.0/20, 10.51.0.1/32",
		"PostUp = wg set %i private-key /etc/wireguard/dynk8s.key"} {
		assert.Check(t, is.Contains(text.(string), want))
	}
	for _, unwanted := range []string{"Endpoint", "PersistentKeepalive"} {
		assert.Check(t, !strings.Contains(text.(string), unwanted), "dialling out, the on-prem config has %s:\n%s", unwanted, text)
	}

	// The routes point at the instance's own interface.
	eni := inst.Outputs["primaryNetworkInterfaceId"].StringValue()
	var routed []string
	for _, r := range cloud.ByType("aws:ec2/route:Route") {
		assert.Check(t, is.Equal(in(&r, "networkInterfaceId"), eni), r.Name)
		assert.Check(t, is.Equal(in(&r, "routeTableId"), "rtb-1"), r.Name)
		routed = append(routed, in(&r, "destinationCidrBlock").(string))
	}
	slices.Sort(routed)
	assert.DeepEqual(t, routed, []string{"10.51.0.0/29", "192.168.1.0/24"})

	// The nodes may start this instance and no other; the gateway may list instances, nothing else.
	wake := mustFind(t, cloud, "aws:iam/rolePolicy:RolePolicy", "gw-wake")
	assert.Equal(t, in(wake, "role"), "lab-node")
	doc := policy(t, wake, "policy")
	assert.Equal(t, len(doc.Statement), 1)
	assert.DeepEqual(t, doc.Statement[0].Action, []string{"ec2:StartInstances"})
	assert.DeepEqual(t, doc.Statement[0].Resource, []string{"arn:aws:ec2:us-west-2:" + mockcloud.Account + ":instance/" + inst.ID})
	assert.DeepEqual(t, doc.Statement[0].Condition, map[string]map[string]string{"StringEquals": {
		"aws:ResourceTag/dynk8s:cluster": "lab", "aws:ResourceTag/Name": "lab-wireguard-gateway"}})
	check := mustFind(t, cloud, "aws:iam/rolePolicy:RolePolicy", "gw-idle-check")
	assert.Equal(t, in(check, "role"), "lab-gateway")
	doc = policy(t, check, "policy")
	assert.Equal(t, len(doc.Statement), 1)
	assert.DeepEqual(t, doc.Statement[0].Action, []string{"ec2:DescribeInstances"})
	assert.DeepEqual(t, doc.Statement[0].Condition, map[string]map[string]string{"StringEquals": {"aws:RequestedRegion": "us-west-2"}})
}

// An always-on gateway (idleStop 0) gets no idle check and gives nobody the right to start it; an on-prem peer that
// dials in gets the Elastic IP on the gateway's own interface.
func TestWireGuardGatewayAlwaysOnDialIn(t *testing.T) {
	var conf pulumi.StringOutput
	cloud := runComponent(t, func(ctx *pulumi.Context) error {
		igw, err := ec2.NewInternetGateway(ctx, "igw", &ec2.InternetGatewayArgs{VpcId: pulumi.String("vpc-1")})
		if err != nil {
			return err
		}
		args := gatewayArgs(t, igw)
		args.IdleStop, args.WireGuard.OnPremEndpoint = 0, nil
		args.NodeRoleName, args.GatewayRoleName = nil, nil
		gw, err := infra.NewWireGuardGateway(ctx, "gw", args)
		if err != nil {
			return err
		}
		conf = gw.OnPremConfig
		return nil
	})
	assert.Equal(t, len(cloud.ByType("aws:iam/rolePolicy:RolePolicy")), 0)
	inst := mustFind(t, cloud, "aws:ec2/instance:Instance", "gw")
	raw, err := cloudinit.Decode(in(inst, "userDataBase64").(string))
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(raw), "gateway-idle"), "an always-on gateway runs the idle check")
	assert.Check(t, is.Equal(asMap(in(inst, "tags"))[infra.IdleStopTag], "0s"))
	eip := mustFind(t, cloud, "aws:ec2/eip:Eip", "gw-eip")
	assert.Equal(t, in(eip, "networkInterface"), inst.Outputs["primaryNetworkInterfaceId"].StringValue())
	assert.Check(t, is.Contains(eip.DependsOn, "igw"))
	text, _, err := mockcloud.Await(conf)
	assert.NilError(t, err)
	addr := eip.Outputs["publicIp"].StringValue()
	assert.Check(t, is.Contains(text.(string), "Endpoint = "+addr+":4500"))
	assert.Check(t, is.Contains(text.(string), "PersistentKeepalive = 25"))
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
			Node: nodeconfig.Node{
				APIServerEndpoint:  endpoint.HostPort{Host: "10.0.0.1", Port: 6443},
				JoinTokenParameter: "/dynk8s/lab/join-token", ClusterName: "lab", PoolName: "gpu",
				Join: nodeconfig.Join{Labels: pool.NodeLabels(), Taints: pool.Taints},
				Host: nodeconfig.Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, TunnelMTU: 1420},
			},
			Render:             cloudinit.NodeRender{KubernetesVersion: kube.Version{Major: 1, Minor: 35, Patch: 1}},
			CACertHashes:       pulumi.ToStringArray([]string{hash}),
			SubnetIDs:          pulumi.ToStringArray([]string{"subnet-1"}),
			SecurityGroupID:    pulumi.String("sg-1"),
			InstanceProfileARN: pulumi.String("arn:aws:iam::1:instance-profile/lab-node"),
			Agent:              testAgentObject(),
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
	// The autoscaler owns the desired capacity; initialLifecycleHooks forces a new group and acts only at
	// creation, so a cold group ignores it too, and a warm pool added later never replaces it.
	assert.DeepEqual(t, group.IgnoreChanges, []string{"desiredCapacity", "initialLifecycleHooks"})
	var keys []string
	for _, tag := range asList(in(group, "tags")) {
		keys = append(keys, asMap(tag)["key"].(string))
	}
	assert.DeepEqual(t, keys, []string{"Name", "k8s.io/cluster-autoscaler/lab"})
	overrides := asList(asMap(asMap(in(group, "mixedInstancesPolicy"))["launchTemplate"])["overrides"])
	assert.Equal(t, len(overrides), 2)
}

// TestNodePoolWarmPool: a pool with a warm pool declares it on its group at an absolute size, never reusing scaled-in
// nodes, with the launch hook its boot completes; hibernation is configured in the launch template only for the
// Hibernated state; a pool without one has neither.
func TestNodePoolWarmPool(t *testing.T) {
	declare := func(pool config.NodePool) func(ctx *pulumi.Context) error {
		return func(ctx *pulumi.Context) error {
			_, err := infra.NewNodePool(ctx, "pool-"+pool.Name, &infra.NodePoolArgs{
				ClusterName: "lab",
				Pool:        pool,
				GroupTags:   []config.Tag{{Key: "k8s.io/cluster-autoscaler/lab", Value: "owned"}},
				Node: nodeconfig.Node{
					APIServerEndpoint:  endpoint.HostPort{Host: "10.0.0.1", Port: 6443},
					JoinTokenParameter: "/dynk8s/lab/join-token", ClusterName: "lab", PoolName: pool.Name,
					LaunchHook: infra.LaunchHook(pool), Join: nodeconfig.Join{Labels: pool.NodeLabels()},
					Host: nodeconfig.Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, TunnelMTU: 1420},
				},
				Render:             cloudinit.NodeRender{KubernetesVersion: kube.Version{Major: 1, Minor: 34, Patch: 4}},
				CACertHashes:       pulumi.ToStringArray([]string{"sha256:" + strings.Repeat("ab", 32)}),
				SubnetIDs:          pulumi.ToStringArray([]string{"subnet-1"}),
				SecurityGroupID:    pulumi.String("sg-1"),
				InstanceProfileARN: pulumi.String("arn:aws:iam::1:instance-profile/lab-node"),
				Agent:              testAgentObject(),
			})
			return err
		}
	}
	warm := config.NodePool{
		Name: "warm", Arch: kube.ArchX86_64, InstanceTypes: []string{"m7i.xlarge"}, MaxSize: 5, VolumeSizeGiB: 60,
		AMIID: "ami-0123456789abcdef0", WarmPool: &config.WarmPool{Size: 2, State: config.WarmHibernated},
	}
	assert.Equal(t, infra.LaunchHook(warm), infra.LaunchHookName)
	cloud := runComponent(t, declare(warm))
	group := mustFind(t, cloud, "aws:autoscaling/group:Group", "pool-warm-asg")
	// No instance reuse policy (the API's default terminates a scaled-in node): one spelled out as false may not be
	// echoed back, and would diff at every update (AWS N16).
	assert.DeepEqual(t, in(group, "warmPool"), map[string]any{
		"poolState": "Hibernated", "minSize": float64(2), "maxGroupPreparedCapacity": float64(2),
	})
	assert.Equal(t, in(group, "forceDeleteWarmPool"), true)
	assert.DeepEqual(t, in(mustFind(t, cloud, "aws:ec2/launchTemplate:LaunchTemplate", "pool-warm-lt"), "hibernationOptions"),
		map[string]any{"configured": true})
	hook := mustFind(t, cloud, "aws:autoscaling/lifecycleHook:LifecycleHook", "pool-warm-launch")
	assert.Equal(t, hook.Parent, "pool-warm")
	assert.Equal(t, in(hook, "autoscalingGroupName"), mockcloud.Plain(group.Outputs["name"], true))
	assert.Equal(t, in(hook, "name"), infra.LaunchHookName)
	assert.Equal(t, in(hook, "lifecycleTransition"), "autoscaling:EC2_INSTANCE_LAUNCHING")
	assert.Equal(t, in(hook, "defaultResult"), "CONTINUE", "an instance whose boot never completes is left to the autoscaler")
	heartbeat := in(hook, "heartbeatTimeout").(float64)
	assert.Check(t, heartbeat > nodeconfig.BootWorstCase().Seconds() && heartbeat <= 7200,
		"the hook outlasts the boot's own deadline, within AWS's 7200 s: %v", heartbeat)
	// The group is created with the same hook, so it holds the warm pool's first fill too (AWS N4); the option
	// forces a new group when it changes, so it is ignored after creation and never replaces a running group.
	assert.DeepEqual(t, in(group, "initialLifecycleHooks"), []any{map[string]any{
		"name": infra.LaunchHookName, "lifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
		"heartbeatTimeout": heartbeat, "defaultResult": "CONTINUE",
	}})
	assert.Check(t, is.Contains(group.IgnoreChanges, "initialLifecycleHooks"))

	stopped := warm
	stopped.Name, stopped.WarmPool = "stopped", &config.WarmPool{Size: 1, State: config.WarmStopped}
	cloud = runComponent(t, declare(stopped))
	assert.Equal(t, asMap(in(mustFind(t, cloud, "aws:autoscaling/group:Group", "pool-stopped-asg"), "warmPool"))["poolState"], "Stopped")
	assert.Check(t, in(mustFind(t, cloud, "aws:ec2/launchTemplate:LaunchTemplate", "pool-stopped-lt"), "hibernationOptions") == nil,
		"hibernation only for the Hibernated state")

	cold := warm
	cold.Name, cold.WarmPool = "cold", nil
	assert.Equal(t, infra.LaunchHook(cold), "")
	cloud = runComponent(t, declare(cold))
	assert.Check(t, in(mustFind(t, cloud, "aws:autoscaling/group:Group", "pool-cold-asg"), "warmPool") == nil)
	assert.Check(t, cloud.Find("aws:autoscaling/lifecycleHook:LifecycleHook", "pool-cold-launch") == nil,
		"no launch hook: nothing would complete it")
	assert.Check(t, in(mustFind(t, cloud, "aws:autoscaling/group:Group", "pool-cold-asg"), "initialLifecycleHooks") == nil)
	mustFind(t, cloud, "aws:autoscaling/lifecycleHook:LifecycleHook", "pool-cold-drain")

	mixed := warm
	mixed.InstanceTypes = []string{"m7i.xlarge", "m6i.xlarge"}
	err := mockcloud.Run(declare(mixed), "test", mockcloud.StackConfig{}, mockcloud.New("us-west-2"))
	assert.ErrorContains(t, err, "a warm pool needs an on-demand pool of one instance type")
}

// testAgentObject is a node agent object outside any agent bucket.
func testAgentObject() infra.AgentObject {
	return infra.AgentObject{Bucket: pulumi.String("lab-agent").ToStringOutput(), Key: "dynk8s-node/linux-amd64",
		VersionID: pulumi.String("v1").ToStringOutput(), SHA256: infra.StandInSHA256}
}

package infra

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/autoscaling"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/iam"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// NodePoolType is the type token of the NodePool component.
const NodePoolType = "dynk8s:infra:NodePool"

// drainMarginSeconds is how much longer than the drain a terminating instance waits: the handler polls IMDS every
// two seconds and cordons first.
const drainMarginSeconds = 60

// LaunchHookName is the launch lifecycle hook of a pool with a warm pool. A launching instance waits in
// Warmed:Pending:Wait (entering the warm pool) and again in Pending:Wait (entering service, from the warm pool or
// launched directly when the pool is empty) until its boot completes the action for this hook (node.json's
// launchHook, set from LaunchHook), or the heartbeat ends and the default result, CONTINUE, lets it go on.
// Without the hook the group would stop a warm instance as soon as it launched, in the middle of its preparation
// (EC2 Auto Scaling User Guide, "Use lifecycle hooks with a warm pool in Auto Scaling group").
const LaunchHookName = "dynk8s-launch"

// launchHookHeartbeatSeconds is how long a launching instance may hold its hook: the boot's worst case
// (nodeconfig.BootWorstCase, from its units' hard timeouts) and a margin, so the hook's default result never ends a
// boot that is still within its deadlines.
var launchHookHeartbeatSeconds = int(nodeconfig.BootWorstCase()/time.Second) + drainMarginSeconds

// The launch hook's transition, and its result when the heartbeat ends: CONTINUE, the group keeps the instance. A
// boot that never completes the action (its agent never ran: an agent fetch inside S3's versioning window, an
// expired object version, a missing permission) is then left to the autoscaler, which removes it once it has been
// unregistered for max-node-provision-time and lowers the group, as the agent's own failure path does; ABANDON
// would have the group replace it every heartbeat for as long as the pod is pending. A stale warm instance is
// handed back by the agent, which abandons its action explicitly.
const (
	launchTransition    = "autoscaling:EC2_INSTANCE_LAUNCHING"
	launchDefaultResult = "CONTINUE"
)

// LaunchHook is the launch lifecycle hook a pool's boot must complete: LaunchHookName with a warm pool, "" without
// one (then the group has no launch hook and nothing waits for the boot).
func LaunchHook(pool config.NodePool) string {
	if pool.WarmPool == nil {
		return ""
	}
	return LaunchHookName
}

// NodePool is one entry of dynk8s:nodePools: a Fedora image lookup, a launch template and an Auto Scaling Group
// that the Cluster Autoscaler discovers by its tags and scales, from zero, between the pool's min and max.
type NodePool struct {
	pulumi.ResourceState

	// Name is the pool's name from the config.
	Name             string
	ImageID          pulumi.StringOutput `pulumi:"imageId"`
	LaunchTemplateID pulumi.StringOutput `pulumi:"launchTemplateId"`
	GroupName        pulumi.StringOutput `pulumi:"groupName"`
}

// NodePoolArgs are the inputs of a NodePool.
type NodePoolArgs struct {
	// ClusterName names and tags the pool's resources (required).
	ClusterName string
	// Pool is the pool's validated config entry (required).
	Pool config.NodePool
	// Image is the Fedora image the pool boots (required unless Pool.AMIID is set or the pool is baked).
	Image FedoraImageQuery
	// GroupTags are the Auto Scaling Group's tags, discovery and node-template tags included (required).
	GroupTags []config.Tag
	// Node is the pool's node.json as NodeConfig builds it, without the CA pins and the gateway's id, which come
	// from CACertHashes and GatewayInstanceID (required); Render is what the user data holds beside it, without the
	// agent's object, which comes from Agent.
	Node   nodeconfig.Node
	Render cloudinit.NodeRender
	// CACertHashes pin the cluster CA for kubeadm's token discovery (required, at least one).
	CACertHashes pulumi.StringArrayInput
	// GatewayInstanceID is the WireGuard gateway a booting node starts (optional; nil when it never sleeps).
	GatewayInstanceID pulumi.StringInput
	// SubnetIDs are the subnets the group launches into, one per zone (required).
	SubnetIDs pulumi.StringArrayInput
	// SecurityGroupID is the node security group (required).
	SecurityGroupID pulumi.StringInput
	// InstanceProfileARN is the node instance profile (required).
	InstanceProfileARN pulumi.StringInput
	// GatewayAddress reserves the gateway's address in one of the subnets (optional): the group is created after it,
	// so that no instance it launches takes that address.
	GatewayAddress pulumi.Resource
	// Agent is the node agent's object for the pool's architecture (AgentBucket.Objects; required).
	Agent AgentObject
	// BakedImage is the image a baked pool boots, as checkBakedImages found it (required with Pool.Image baked,
	// ignored otherwise).
	BakedImage *BakedImage
	// WarmReplacer is the IAM user of dynk8s-controller's warm loop, which a pool with a warm pool lets replace its
	// stale warm instances (optional; nil: no loop replaces them, only their own boot hands them back).
	WarmReplacer *WarmReplacer
}

// WarmReplacer is who replaces a warm pool's stale instances: dynk8s-controller's IAM user, with the stack's region
// and the ARN pattern of its instances (Identity.InstanceARNs).
type WarmReplacer struct {
	UserName     pulumi.StringInput
	InstanceARNs pulumi.StringInput
	Region       string
}

// NewNodePool declares one node pool.
func NewNodePool(ctx *pulumi.Context, name string, args *NodePoolArgs, opts ...pulumi.ResourceOption) (*NodePool, error) {
	if args == nil || args.Agent.Key == "" {
		return nil, errors.New("node pool: args with the agent's object are required")
	}
	pool := args.Pool
	if pool.Baked() && (args.BakedImage == nil || args.BakedImage.ID == "" || args.BakedImage.RootDeviceName == "") {
		return nil, fmt.Errorf("node pool %q: a baked pool needs its baked image's id and root device", name)
	}
	mixed := pool.Spot || len(pool.InstanceTypes) > 1
	if pool.WarmPool != nil && mixed {
		return nil, fmt.Errorf("node pool %q: a warm pool needs an on-demand pool of one instance type", name)
	}
	comp := &NodePool{Name: pool.Name}
	if err := ctx.RegisterComponentResource(NodePoolType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)

	imageID, rootDevice := poolImage(ctx, args, parent)

	gatewayID := pulumi.String("").ToStringOutput()
	if args.GatewayInstanceID != nil {
		gatewayID = args.GatewayInstanceID.ToStringOutput()
	}
	agent := pulumix.Apply2(args.Agent.Bucket, args.Agent.VersionID, func(bucket, version string) cloudinit.Agent {
		return cloudinit.Agent{Bucket: bucket, Key: args.Agent.Key, VersionID: version, SHA256: args.Agent.SHA256}
	})
	userData := pulumix.Apply3Err(args.CACertHashes.ToStringArrayOutput(), gatewayID, agent,
		func(hashes []string, gateway string, a cloudinit.Agent) (string, error) {
			node, render := args.Node, args.Render
			node.Join.CACertHashes = hashes
			node.GatewayInstanceID = gateway
			render.Agent = &a
			raw, err := cloudinit.Node(node, render)
			if err != nil {
				return "", fmt.Errorf("node pool %q: user data: %w", name, err)
			}
			return cloudinit.Encode(raw)
		})

	instanceTags := awsTags(config.IdentityTags(args.ClusterName, pool.Name, args.ClusterName+"-"+pool.Name))
	ltArgs := &ec2.LaunchTemplateArgs{
		Description:          pulumi.Sprintf("dynk8s %s node pool %s", args.ClusterName, pool.Name),
		ImageId:              imageID,
		UpdateDefaultVersion: pulumi.Bool(true),
		UserData:             pulumix.Cast[pulumi.StringOutput](userData),
		// IMDSv2 only, and one hop: a pod in its own network namespace cannot complete the IMDSv2 handshake.
		// Host-network pods are one hop away like the host; the node's nftables lockdown after the join covers
		// them (cloudinit, imds-lock).
		MetadataOptions: &ec2.LaunchTemplateMetadataOptionsArgs{
			HttpEndpoint:            pulumi.String("enabled"),
			HttpTokens:              pulumi.String("required"),
			HttpPutResponseHopLimit: pulumi.Int(1),
			InstanceMetadataTags:    pulumi.String("disabled"),
		},
		BlockDeviceMappings: ec2.LaunchTemplateBlockDeviceMappingArray{
			&ec2.LaunchTemplateBlockDeviceMappingArgs{
				DeviceName: rootDevice,
				Ebs: &ec2.LaunchTemplateBlockDeviceMappingEbsArgs{
					VolumeType:          pulumi.String("gp3"),
					VolumeSize:          pulumi.Int(pool.VolumeSizeGiB),
					Encrypted:           pulumi.String("true"),
					DeleteOnTermination: pulumi.String("true"),
				},
			},
		},
		VpcSecurityGroupIds: pulumi.StringArray{args.SecurityGroupID},
		IamInstanceProfile:  &ec2.LaunchTemplateIamInstanceProfileArgs{Arn: args.InstanceProfileARN},
		TagSpecifications: ec2.LaunchTemplateTagSpecificationArray{
			&ec2.LaunchTemplateTagSpecificationArgs{ResourceType: pulumi.String("instance"), Tags: instanceTags},
			&ec2.LaunchTemplateTagSpecificationArgs{ResourceType: pulumi.String("volume"), Tags: instanceTags},
		},
		Tags: instanceTags,
		// The cluster and pool lead the name, so that two stacks in one account can be told apart in the console
		// and in `aws autoscaling` output; Pulumi appends a unique suffix, so a replacement can be created first.
		NamePrefix: pulumi.String(args.ClusterName + "-" + pool.Name + "-"),
	}
	if pool.WarmPool != nil && pool.WarmPool.State == config.WarmHibernated {
		// A warm pool hibernates only instances launched with hibernation configured.
		ltArgs.HibernationOptions = &ec2.LaunchTemplateHibernationOptionsArgs{Configured: pulumi.Bool(true)}
	}
	if !mixed {
		ltArgs.InstanceType = pulumi.String(pool.InstanceTypes[0])
	}
	lt, err := ec2.NewLaunchTemplate(ctx, name+"-lt", ltArgs, parent)
	if err != nil {
		return nil, fmt.Errorf("node pool %q: launch template: %w", name, err)
	}
	// The group follows the template's newest version by number, not "$Latest": a new version then changes the
	// group, so instances launched after `pulumi up` boot the new image and user data. A warm instance launched
	// before keeps the old ones; its boot compares its version with the group's and hands itself back when older
	// (cloudinit, the node agent).
	version := lt.LatestVersion.ApplyT(strconv.Itoa).(pulumi.StringOutput)

	var tags autoscaling.GroupTagArray
	for _, t := range args.GroupTags {
		tags = append(tags, &autoscaling.GroupTagArgs{
			Key: pulumi.String(t.Key), Value: pulumi.String(t.Value), PropagateAtLaunch: pulumi.Bool(t.PropagateAtLaunch),
		})
	}
	groupArgs := &autoscaling.GroupArgs{
		NamePrefix:         pulumi.String(args.ClusterName + "-" + pool.Name + "-"),
		MinSize:            pulumi.Int(pool.MinSize),
		MaxSize:            pulumi.Int(pool.MaxSize),
		VpcZoneIdentifiers: args.SubnetIDs,
		Tags:               tags,
		// Nothing to wait for: the group starts at its minimum, usually zero, and nodes join on their own.
		WaitForCapacityTimeout: pulumi.String("0"),
		// AZRebalance terminates running nodes to even out zones, without draining them (CA README gotchas).
		SuspendedProcesses: pulumi.StringArray{pulumi.String("AZRebalance")},
		// No Capacity Rebalancing: it launches a replacement and then terminates the at-risk spot node itself,
		// without notice; the two-minute interruption notice and the termination handler's drain cover spot.
		CapacityRebalance: pulumi.Bool(false),
		// Warm instances never joined the cluster: removing the warm pool (or the group) need not wait for them.
		ForceDeleteWarmPool: pulumi.Bool(true),
	}
	if w := pool.WarmPool; w != nil {
		// MinSize and MaxGroupPreparedCapacity both at Size: the warm pool then has that absolute size (PutWarmPool
		// API reference) and refills after every scale-up, rather than shrinking as the group grows. The
		// Cluster Autoscaler neither counts nor sees warm instances: it reads the group's Instances from
		// DescribeAutoScalingGroups, which lists no warm pool instance (see docs/warm-pools.md).
		groupArgs.WarmPool = &autoscaling.GroupWarmPoolArgs{
			PoolState:                pulumi.String(w.State),
			MinSize:                  pulumi.Int(w.Size),
			MaxGroupPreparedCapacity: pulumi.Int(w.Size),
			// No instance reuse policy: without one a scaled-in node is terminated, never returned to the pool
			// (PutWarmPool API reference; config refuses reuseOnScaleIn). A policy spelled out as false may not be
			// echoed by DescribeWarmPool, and would then diff at every `pulumi up`.
		}
	}
	launch := LaunchHook(pool)
	if launch != "" {
		// The launch hook is in place before the group launches anything: declared with the group, CreateAutoScalingGroup
		// attaches it before the warm pool's first fill (pulumi-aws autoscaling.Group, initialLifecycleHooks), so
		// no first instance is stopped in the middle of its preparation.
		groupArgs.InitialLifecycleHooks = autoscaling.GroupInitialLifecycleHookArray{
			&autoscaling.GroupInitialLifecycleHookArgs{
				Name:                pulumi.String(launch),
				LifecycleTransition: pulumi.String(launchTransition),
				HeartbeatTimeout:    pulumi.Int(launchHookHeartbeatSeconds),
				DefaultResult:       pulumi.String(launchDefaultResult),
			},
		}
	}
	if mixed {
		var overrides autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArray
		for _, it := range pool.InstanceTypes {
			overrides = append(overrides, &autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs{
				InstanceType: pulumi.String(it),
			})
		}
		distribution := &autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs{
			OnDemandBaseCapacity:                pulumi.Int(0),
			OnDemandPercentageAboveBaseCapacity: pulumi.Int(100),
			OnDemandAllocationStrategy:          pulumi.String("prioritized"),
		}
		if pool.Spot {
			distribution.OnDemandPercentageAboveBaseCapacity = pulumi.Int(0)
			distribution.SpotAllocationStrategy = pulumi.String("price-capacity-optimized")
		}
		groupArgs.MixedInstancesPolicy = &autoscaling.GroupMixedInstancesPolicyArgs{
			InstancesDistribution: distribution,
			LaunchTemplate: &autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs{
				LaunchTemplateSpecification: &autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs{
					LaunchTemplateId: lt.ID(),
					Version:          version,
				},
				Overrides: overrides,
			},
		}
	} else {
		groupArgs.LaunchTemplate = &autoscaling.GroupLaunchTemplateArgs{Id: lt.ID(), Version: version}
	}
	if pool.InstanceRefresh {
		// Opt-in only: a refresh replaces every node of the pool, drained (see the lifecycle hook) but still
		// ending the builds that ran there.
		groupArgs.InstanceRefresh = &autoscaling.GroupInstanceRefreshArgs{
			Strategy: pulumi.String("Rolling"),
			Preferences: &autoscaling.GroupInstanceRefreshPreferencesArgs{
				MinHealthyPercentage: pulumi.Int(90),
				SkipMatching:         pulumi.Bool(true),
			},
		}
	}
	// The Cluster Autoscaler owns the desired capacity: dynk8s never sets it, and a later `pulumi up` must not
	// reset what the autoscaler chose. The option sits on the group itself; a component's
	// ignoreChanges would not reach it.
	// initialLifecycleHooks forces a new group when it changes (terraform-provider-aws, aws_autoscaling_group
	// schema: ForceNew), and it acts only at creation: ignored afterwards, so that adding it, or a warm pool, to a
	// running group never replaces the group and terminates its nodes. The hook resource below owns the hook after
	// creation.
	group, err := autoscaling.NewGroup(ctx, name+"-asg", groupArgs, parent,
		pulumi.IgnoreChanges([]string{"desiredCapacity", "initialLifecycleHooks"}),
		pulumi.DependsOn(launchAfter(nil, args.GatewayAddress)))
	if err != nil {
		return nil, fmt.Errorf("node pool %q: auto scaling group: %w", name, err)
	}

	// Whatever the group terminates itself (instance refresh, health replacement, a lowered maxSize) waits in
	// Terminating:Wait, which IMDS shows as the target lifecycle state Terminated: the termination handler drains
	// the node on it, and the heartbeat gives the drain its time before the group goes on. A resource of its own,
	// not the group's initialLifecycleHooks, which apply only when a group is created.
	if _, err := autoscaling.NewLifecycleHook(ctx, name+"-drain", &autoscaling.LifecycleHookArgs{
		AutoscalingGroupName: group.Name,
		Name:                 pulumi.String("dynk8s-drain"),
		LifecycleTransition:  pulumi.String("autoscaling:EC2_INSTANCE_TERMINATING"),
		HeartbeatTimeout:     pulumi.Int(config.DrainGraceSeconds + drainMarginSeconds),
		DefaultResult:        pulumi.String("CONTINUE"),
	}, parent); err != nil {
		return nil, fmt.Errorf("node pool %q: termination hook: %w", name, err)
	}

	// The launch hook, also a resource of its own, which owns it after the group's creation (PutLifecycleHook
	// creates or updates). A warm pool added to a group that already runs gets its hook only after PutWarmPool:
	// the instances of that first fill may be stopped in the middle of their preparation, and prepare again on
	// their next start, which is then slower, not wrong (docs/warm-pools.md).
	if launch != "" {
		if _, err := autoscaling.NewLifecycleHook(ctx, name+"-launch", &autoscaling.LifecycleHookArgs{
			AutoscalingGroupName: group.Name,
			Name:                 pulumi.String(launch),
			LifecycleTransition:  pulumi.String(launchTransition),
			HeartbeatTimeout:     pulumi.Int(launchHookHeartbeatSeconds),
			DefaultResult:        pulumi.String(launchDefaultResult),
		}, parent); err != nil {
			return nil, fmt.Errorf("node pool %q: launch hook: %w", name, err)
		}
	}

	if err := warmReplacement(ctx, name, args, group.Name, parent); err != nil {
		return nil, fmt.Errorf("node pool %q: warm replacement policy: %w", name, err)
	}

	comp.ImageID = imageID
	comp.LaunchTemplateID = lt.ID().ToStringOutput()
	comp.GroupName = group.Name
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"imageId":          comp.ImageID,
		"launchTemplateId": comp.LaunchTemplateID,
		"groupName":        comp.GroupName,
	}); err != nil {
		return nil, fmt.Errorf("node pool %q: outputs: %w", name, err)
	}
	return comp, nil
}

// poolImage is the image the pool boots and its root device name: a baked pool's image as checkBakedImages found it,
// or the lookup of the pool's Fedora image or of its amiId (lookupImage).
func poolImage(ctx *pulumi.Context, args *NodePoolArgs, parent pulumi.ResourceOrInvokeOption) (pulumi.StringOutput,
	pulumi.StringOutput) {
	if args.Pool.Baked() {
		return pulumi.String(args.BakedImage.ID).ToStringOutput(),
			pulumi.String(args.BakedImage.RootDeviceName).ToStringOutput()
	}
	image := lookupImage(ctx, args.Image, args.Pool.AMIID, parent)
	return image.Id(), image.RootDeviceName()
}

// warmReplacement lets args.WarmReplacer replace the stale instances of the pool's warm pool (group), when it has
// one (ReplaceStaleWarmInstancesPolicy).
func warmReplacement(ctx *pulumi.Context, name string, args *NodePoolArgs, group pulumi.StringOutput,
	parent pulumi.ResourceOption) error {
	r := args.WarmReplacer
	if r == nil || args.Pool.WarmPool == nil {
		return nil
	}
	policy := pulumix.Apply2Err(r.InstanceARNs.ToStringOutput(), group, func(arns, group string) (string, error) {
		return ReplaceStaleWarmInstancesPolicy(arns, r.Region, args.ClusterName, group).JSON()
	})
	_, err := iam.NewUserPolicy(ctx, name+"-warm-replace", &iam.UserPolicyArgs{
		User:   r.UserName,
		Name:   pulumi.String("replace-stale-warm-instances-" + args.Pool.Name),
		Policy: pulumix.Cast[pulumi.StringOutput](policy),
	}, parent)
	return err
}

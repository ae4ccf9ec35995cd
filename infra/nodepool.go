package infra

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/autoscaling"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
)

// NodePoolType is the type token of the NodePool component.
const NodePoolType = "dynk8s:infra:NodePool"

// drainMarginSeconds is how much longer than the drain a terminating instance waits: the handler polls IMDS every
// two seconds and cordons first.
const drainMarginSeconds = 60

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
	// Image is the Fedora image the pool boots (required unless Pool.AMIID is set).
	Image FedoraImageQuery
	// GroupTags are the Auto Scaling Group's tags, discovery and node-template tags included (required).
	GroupTags []config.Tag
	// Node is the node user data's input, without CACertHashes (required).
	Node cloudinit.NodeInput
	// CACertHashes pin the cluster CA for kubeadm's token discovery (required, at least one).
	CACertHashes pulumi.StringArrayInput
	// SubnetIDs are the subnets the group launches into, one per zone (required).
	SubnetIDs pulumi.StringArrayInput
	// SecurityGroupID is the node security group (required).
	SecurityGroupID pulumi.StringInput
	// InstanceProfileARN is the node instance profile (required).
	InstanceProfileARN pulumi.StringInput
}

// NewNodePool declares one node pool.
func NewNodePool(ctx *pulumi.Context, name string, args *NodePoolArgs, opts ...pulumi.ResourceOption) (*NodePool, error) {
	if args == nil {
		return nil, errors.New("node pool: args are required")
	}
	pool := args.Pool
	comp := &NodePool{Name: pool.Name}
	if err := ctx.RegisterComponentResource(NodePoolType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)

	image := lookupImage(ctx, args.Image, pool.AMIID, parent)

	userData := args.CACertHashes.ToStringArrayOutput().ApplyT(func(hashes []string) (string, error) {
		in := args.Node
		in.CACertHashes = hashes
		raw, err := cloudinit.Node(in)
		if err != nil {
			return "", fmt.Errorf("node pool %q: user data: %w", name, err)
		}
		return cloudinit.Encode(raw)
	}).(pulumi.StringOutput)

	instanceTags := awsTags(config.IdentityTags(args.ClusterName, pool.Name, args.ClusterName+"-"+pool.Name))
	ltArgs := &ec2.LaunchTemplateArgs{
		Description:          pulumi.Sprintf("dynk8s %s node pool %s", args.ClusterName, pool.Name),
		ImageId:              image.Id(),
		UpdateDefaultVersion: pulumi.Bool(true),
		UserData:             userData,
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
				DeviceName: image.RootDeviceName(),
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
	}
	mixed := pool.Spot || len(pool.InstanceTypes) > 1
	if !mixed {
		ltArgs.InstanceType = pulumi.String(pool.InstanceTypes[0])
	}
	lt, err := ec2.NewLaunchTemplate(ctx, name+"-lt", ltArgs, parent)
	if err != nil {
		return nil, fmt.Errorf("node pool %q: launch template: %w", name, err)
	}
	// The group follows the template's newest version by number, not "$Latest": a new version then changes the
	// group, so instances launched after `pulumi up` boot the new image and user data.
	version := lt.LatestVersion.ApplyT(strconv.Itoa).(pulumi.StringOutput)

	var tags autoscaling.GroupTagArray
	for _, t := range args.GroupTags {
		tags = append(tags, &autoscaling.GroupTagArgs{
			Key: pulumi.String(t.Key), Value: pulumi.String(t.Value), PropagateAtLaunch: pulumi.Bool(t.PropagateAtLaunch),
		})
	}
	groupArgs := &autoscaling.GroupArgs{
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
	group, err := autoscaling.NewGroup(ctx, name+"-asg", groupArgs, parent,
		pulumi.IgnoreChanges([]string{"desiredCapacity"}))
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

	comp.ImageID = image.Id()
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

package infra

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/autoscaling"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/cloudinit"
)

// NodePoolType is the type token of the NodePool component.
const NodePoolType = "dynk8s:infra:NodePool"

// NodePool is one entry of dynk8s:nodePools: a Fedora image lookup, a launch template and an Auto Scaling Group
// that the Cluster Autoscaler discovers by its tags and scales, from zero, between the pool's min and max.
type NodePool struct {
	pulumi.ResourceState

	ImageID          pulumi.StringOutput `pulumi:"imageId"`
	LaunchTemplateID pulumi.StringOutput `pulumi:"launchTemplateId"`
	GroupName        pulumi.StringOutput `pulumi:"groupName"`
}

// NodePoolArgs are the inputs of a NodePool.
type NodePoolArgs struct {
	// Config is the validated stack config: cluster name, region, Fedora release, Kubernetes and fuse settings
	// (required).
	Config *Config
	// Pool is the pool's entry of Config.NodePools (required).
	Pool NodePoolConfig
	// SubnetIDs are the subnets the group launches into, one per zone (required).
	SubnetIDs pulumi.StringArrayInput
	// SecurityGroupID is the node security group (required).
	SecurityGroupID pulumi.StringInput
	// InstanceProfileARN is the node instance profile (required).
	InstanceProfileARN pulumi.StringInput
	// CACertHashes pin the cluster CA for kubeadm's token discovery (required, at least one).
	CACertHashes pulumi.StringArrayInput
	// JoinTokenParameter is the name of the SSM SecureString the join script reads the token from (required).
	JoinTokenParameter string
}

// NewNodePool declares one node pool.
func NewNodePool(ctx *pulumi.Context, name string, args *NodePoolArgs, opts ...pulumi.ResourceOption) (*NodePool, error) {
	if args == nil || args.Config == nil {
		return nil, errors.New("node pool: args and args.Config are required")
	}
	cfg, pool := args.Config, args.Pool
	comp := &NodePool{}
	if err := ctx.RegisterComponentResource(NodePoolType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)

	query, err := FedoraImage(cfg.Fedora.Release, pool.Arch, cfg.Region)
	if err != nil && pool.AMIID == "" {
		return nil, fmt.Errorf("node pool %q: image: %w", name, err)
	}
	image := lookupImage(ctx, query, pool.AMIID, pulumi.Parent(comp))

	userData := args.CACertHashes.ToStringArrayOutput().ApplyT(func(hashes []string) (string, error) {
		raw, err := cloudinit.Node(NodeInput(cfg, pool, hashes, args.JoinTokenParameter))
		if err != nil {
			return "", fmt.Errorf("node pool %q: user data: %w", name, err)
		}
		return cloudinit.Encode(raw)
	}).(pulumi.StringOutput)

	instanceTags := pulumi.StringMap{
		"Name":           pulumi.String(cfg.ClusterName + "-" + pool.Name),
		"dynk8s:cluster": pulumi.String(cfg.ClusterName),
		"dynk8s:pool":    pulumi.String(pool.Name),
	}
	ltArgs := &ec2.LaunchTemplateArgs{
		Description:          pulumi.Sprintf("dynk8s %s node pool %s", cfg.ClusterName, pool.Name),
		ImageId:              image.Id(),
		UpdateDefaultVersion: pulumi.Bool(true),
		UserData:             userData,
		// IMDSv2 only, and one hop: pods cannot reach the node role's credentials through IMDS.
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
	for _, t := range ASGTags(cfg, pool) {
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
		CapacityRebalance:  pulumi.Bool(pool.Spot),
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
		// Opt-in only: a refresh replaces nodes without draining them, killing running builds.
		groupArgs.InstanceRefresh = &autoscaling.GroupInstanceRefreshArgs{
			Strategy: pulumi.String("Rolling"),
			Preferences: &autoscaling.GroupInstanceRefreshPreferencesArgs{
				MinHealthyPercentage: pulumi.Int(90),
				SkipMatching:         pulumi.Bool(true),
			},
		}
	}
	// The Cluster Autoscaler owns the desired capacity: dynk8s never sets it, and a later `pulumi up` must not
	// reset what the autoscaler chose (pitfall 1). The option sits on the group itself; a component's
	// ignoreChanges would not reach it.
	group, err := autoscaling.NewGroup(ctx, name+"-asg", groupArgs, parent,
		pulumi.IgnoreChanges([]string{"desiredCapacity"}))
	if err != nil {
		return nil, fmt.Errorf("node pool %q: auto scaling group: %w", name, err)
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

// NodeInput is what the node renderer needs of a pool: plain values only. The e2e join test renders through it too,
// so the script it runs gets exactly what a pool's launch template carries.
func NodeInput(cfg *Config, pool NodePoolConfig, caHashes []string, tokenParameter string) cloudinit.NodeInput {
	taints := make([]cloudinit.Taint, 0, len(pool.Taints))
	for _, t := range pool.Taints {
		taints = append(taints, cloudinit.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
	}
	return cloudinit.NodeInput{
		KubernetesVersion:  cfg.Kubernetes.Version,
		APIServerEndpoint:  cfg.Kubernetes.APIServerEndpoint,
		CACertHashes:       caHashes,
		JoinTokenParameter: tokenParameter,
		ClusterName:        cfg.ClusterName,
		PoolName:           pool.Name,
		Labels:             PoolNodeLabels(pool),
		Taints:             taints,
	}
}

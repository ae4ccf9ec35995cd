package infra

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/iam"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
)

// A pool with nodePools[i].image baked boots an image that cmd/bake builds outside the program, before `pulumi up`
// (Packer's pattern, without Packer): it launches one instance of the pool's Fedora image with cloudinit.Bake's user
// data, whose agent prepares the node, removes the instance's identity and powers off; it then images the stopped
// instance, tags the image with BakeID and terminates the instance. The program only looks the image up by its
// tags, so a `pulumi up` never waits on a build, and a missing image fails the preview with the command to run.

// Tags of a baked image and its snapshots (cmd/bake writes them, the program and cmd/bake find images by them);
// the cluster's and pool's are config.IdentityTags'.
const (
	// BakeTag is the image's identity: BakeID of the config it was baked from.
	BakeTag = "dynk8s:bake-sha256"
	// ParentImageTag is the Fedora image the bake started from.
	ParentImageTag = "dynk8s:parent-image"
	// KubernetesVersionTag is the Kubernetes version the image holds: an operator finds the images of a version by
	// it.
	KubernetesVersionTag = "dynk8s:kubernetes-version"
)

// BakeKeep is how many baked images of a pool cmd/bake keeps by default, the newest: the one the pool boots, and
// those a `pulumi up` rolling back a config change would boot again. Each bills its snapshot.
const BakeKeep = 3

// BakeID is the identity of pool's baked image: the sha256 of what the bake instance prepares from (its user data
// without the agent's pin: the repositories, the prepare files, bake.json and the bake's unit) and of what it starts
// from (the Fedora release and the architecture). Nothing of the join is in it (the gateway, the CA pins, the API
// server, labels, taints, deadlines), nor the agent build, nor which respin of the release EC2 has: a change of those
// rebuilds no image. The program and cmd/bake compute it from the same config, so they agree without a stack output.
func BakeID(cfg *config.Config, pool config.NodePool) (string, error) {
	node, render := NodeConfig(cfg, pool, nil, JoinTokenParameter(cfg.ClusterName))
	userData, err := cloudinit.Bake(node, render)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "fedora %d\narch %s\n", cfg.Fedora.Release, pool.Arch)
	h.Write(userData)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// BakeCommand is the command an operator runs, from the repository's root, to bake pool's image for stack.
func BakeCommand(stack, pool string) string {
	return fmt.Sprintf("go run ./cmd/bake -stack %s -pool %s", stack, pool)
}

// BakeProfileName is the name of the IAM role a bake instance of cluster runs as, and of its instance profile, by
// which cmd/bake launches the instance.
func BakeProfileName(cluster string) string { return cluster + "-bake" }

// bakeProfileType is the type token of the bakeProfile component.
const bakeProfileType = "dynk8s:infra:BakeProfile"

// bakeProfile is what a bake instance runs as: a role that EC2 may assume, and its instance profile, both named
// BakeProfileName. The role's one permission is the agent bucket's read of the baked architectures' agent objects
// (an AgentReader of the stack): the bake instance downloads the agent with the role's credentials and installs
// packages and images from the internet, and needs nothing else of AWS. It reads no SSM parameter and runs no Systems
// Manager agent, so no managed policy is attached, and nothing it runs (third-party package scriptlets, as root) can
// read the join token or the gateway's key.
type bakeProfile struct {
	pulumi.ResourceState

	// RoleName is the role's name, which the agent bucket lets read the baked architectures' objects.
	RoleName pulumi.StringOutput `pulumi:"roleName"`
	// ProfileName is the instance profile's name, BakeProfileName.
	ProfileName pulumi.StringOutput `pulumi:"profileName"`
}

// newBakeProfile declares the bake role and its instance profile of cluster. The stack declares it only when a pool
// is baked.
func newBakeProfile(ctx *pulumi.Context, name, cluster string, opts ...pulumi.ResourceOption) (*bakeProfile, error) {
	if cluster == "" {
		return nil, errors.New("bake profile: a cluster name is required")
	}
	comp := &bakeProfile{}
	if err := ctx.RegisterComponentResource(bakeProfileType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)
	fail := func(what string, err error) (*bakeProfile, error) {
		return nil, fmt.Errorf("bake profile %q: %s: %w", name, what, err)
	}
	iamName := BakeProfileName(cluster)
	// The cluster's tag but no pool's: the gateway's idle check counts only pool instances, so a bake never keeps
	// the gateway awake.
	tags := awsTags(config.IdentityTags(cluster, "", iamName))
	partition := aws.GetPartitionOutput(ctx, aws.GetPartitionOutputArgs{}, parent)
	trust := pulumix.ApplyErr(partition.DnsSuffix(), func(suffix string) (string, error) {
		return AssumeRolePolicy("ec2." + suffix).JSON()
	})
	role, err := iam.NewRole(ctx, name+"-role", &iam.RoleArgs{
		Name:             pulumi.String(iamName),
		Path:             pulumi.String("/dynk8s/"),
		AssumeRolePolicy: pulumix.Cast[pulumi.StringOutput](trust),
		Tags:             tags,
	}, parent)
	if err != nil {
		return fail("role", err)
	}
	profile, err := iam.NewInstanceProfile(ctx, name+"-profile", &iam.InstanceProfileArgs{
		Name: pulumi.String(iamName),
		Path: pulumi.String("/dynk8s/"),
		Role: role.Name,
		Tags: tags,
	}, parent)
	if err != nil {
		return fail("instance profile", err)
	}
	comp.RoleName, comp.ProfileName = role.Name, profile.Name
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{
		"roleName": comp.RoleName, "profileName": comp.ProfileName,
	}); err != nil {
		return fail("outputs", err)
	}
	return comp, nil
}

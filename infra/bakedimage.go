package infra

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/iam"
	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/imagebuilder"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumix"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// A pool with nodePools[i].image baked boots an image the stack builds with EC2 Image Builder: from the pool's
// pinned Fedora image, a build instance lays out the pool's prepare files (taken from its rendered user data),
// fetches the pool's node agent with the node's own bootstrap, runs `dynk8s-node prepare` and then
// `dynk8s-node clean-identity` (the agent's contract, docs/baked-images.md), and Image Builder snapshots it. The
// pool's launch template boots the result. Every input that reaches the build (the Kubernetes version, the Fedora
// image, the agent, the pool's node config) is hashed into the component's and the recipe's versions, so a change
// builds a new image and the same config declares the same resources.

// ImageBuilderType is the type token of the ImageBuilder component.
const ImageBuilderType = "dynk8s:infra:ImageBuilder"

// BuildInstanceTypes are the build instances' types, by architecture: two vCPUs of the dev stack's families. The
// build downloads and installs (network and disk, not CPU, bound), so a larger type would not be much faster.
var BuildInstanceTypes = map[kube.Arch]string{kube.ArchX86_64: "c7i.large", kube.ArchArm64: "c7g.large"}

// BuildVolumeGiB is the build instance's root volume, and so the baked image's: the stock image's 5 GiB and room
// for the packages and the pre-pulled images. A pool's launch template grows it to the pool's volumeSizeGiB (at
// least 20). Its snapshot bills the blocks written, not this size.
const BuildVolumeGiB = 10

// BuildTimeout bounds the image's creation in `pulumi up`: Image Builder launches the build instance, installs its
// Systems Manager agent, runs the component and snapshots the volume (docs/baked-images.md: roughly 20-35 minutes,
// an estimate); the provider's own default is 60 minutes.
const BuildTimeout = "90m"

// Where the build finds the agent's files (the agent's baked-image contract, docs/baked-images.md).
const (
	bakedMarker = "/etc/dynk8s/baked.json"
	nodeAgent   = "/usr/local/bin/dynk8s-node"
	// reposConfig is the cloud-config of the pool's yum_repos, for cloud-init's yum_add_repo; under /run, so it
	// never reaches the snapshot.
	reposConfig = "/run/dynk8s-image/repos.yaml"
)

// KubernetesVersionTag is the tag of a baked pool's Image Builder resources and AMI: the Kubernetes version the
// image holds.
const KubernetesVersionTag = "dynk8s:kubernetes-version"

// maxComponentData is the most an Image Builder component's inline document may hold (CreateComponent API
// reference: data, maximum length 16000).
const maxComponentData = 16000

// Image Builder's AWS managed policies for a build instance's role (EC2 Image Builder User Guide, "Prerequisites":
// the instance profile needs EC2InstanceProfileForImageBuilder and AmazonSSMManagedInstanceCore: Image Builder
// drives the build through Systems Manager). The second allows ssm:GetParameter(s) on "*": the role's inline
// NoStackParametersPolicy takes the stack's parameters back out.
var buildManagedPolicies = []string{"EC2InstanceProfileForImageBuilder", "AmazonSSMManagedInstanceCore"}

// ImageBuilder is what a stack's baked images share: the build instances' role and profile, and one
// infrastructure configuration per architecture (its instance type, the stack's subnet and node security group).
type ImageBuilder struct {
	pulumi.ResourceState

	// RoleName is the build instances' role, which the agent bucket lets read the baked architectures' objects.
	RoleName pulumi.StringOutput `pulumi:"roleName"`
	// Infrastructure are the infrastructure configurations' ARNs, by architecture.
	Infrastructure map[kube.Arch]pulumi.StringOutput
}

// ImageBuilderArgs are the inputs of ImageBuilder.
type ImageBuilderArgs struct {
	// ClusterName names and tags the resources (required).
	ClusterName string
	// Region is the stack's, where its SSM parameters are, which the build role may not read (required).
	Region string
	// Arches are the architectures of the baked pools (required, at least one).
	Arches []kube.Arch
	// SubnetID is where the build instances launch: a subnet of the stack, whose public address reaches Fedora's
	// mirrors, the upstream repositories, the registries, S3 and Systems Manager (required).
	SubnetID pulumi.StringInput
	// SecurityGroupID is the nodes' security group: nothing in from the internet, everything out (required).
	SecurityGroupID pulumi.StringInput
}

// NewImageBuilder declares the build role, its instance profile and the infrastructure configurations.
func NewImageBuilder(ctx *pulumi.Context, name string, args *ImageBuilderArgs, opts ...pulumi.ResourceOption) (*ImageBuilder, error) {
	if args == nil || len(args.Arches) == 0 || args.Region == "" {
		return nil, errors.New("image builder: args with a region and at least one architecture are required")
	}
	comp := &ImageBuilder{Infrastructure: map[kube.Arch]pulumi.StringOutput{}}
	if err := ctx.RegisterComponentResource(ImageBuilderType, name, comp, opts...); err != nil {
		return nil, err
	}
	parent := pulumi.Parent(comp)
	fail := func(what string, err error) (*ImageBuilder, error) {
		return nil, fmt.Errorf("image builder %q: %s: %w", name, what, err)
	}
	iamName := args.ClusterName + "-image-build"
	tags := awsTags(config.IdentityTags(args.ClusterName, "", iamName))

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
	for _, p := range buildManagedPolicies {
		if _, err := iam.NewRolePolicyAttachment(ctx, name+"-"+p, &iam.RolePolicyAttachmentArgs{
			Role:      role.Name,
			PolicyArn: pulumi.Sprintf("arn:%s:iam::aws:policy/%s", partition.Partition(), p),
		}, parent); err != nil {
			return fail("policy "+p, err)
		}
	}
	// The build runs third-party package scriptlets as root: it must not read the join token or the gateway key,
	// which the managed policy above would allow with SSM's own key. The deny is in place before the instance
	// profile exists, so before any build instance can launch with the role.
	account := aws.GetCallerIdentityOutput(ctx, aws.GetCallerIdentityOutputArgs{}, parent).AccountId()
	noParameters := pulumix.Apply2Err(partition.Partition(), account, func(p, acct string) (string, error) {
		return NoStackParametersPolicy(ParameterARN(p, args.Region, acct, ParameterPath(args.ClusterName)+"/*")).JSON()
	})
	deny, err := iam.NewRolePolicy(ctx, name+"-no-stack-parameters", &iam.RolePolicyArgs{
		Role:   role.Name,
		Name:   pulumi.String("no-stack-parameters"),
		Policy: pulumix.Cast[pulumi.StringOutput](noParameters),
	}, parent)
	if err != nil {
		return fail("parameter deny", err)
	}
	profile, err := iam.NewInstanceProfile(ctx, name+"-profile", &iam.InstanceProfileArgs{
		Name: pulumi.String(iamName),
		Path: pulumi.String("/dynk8s/"),
		Role: role.Name,
		Tags: tags,
	}, parent, pulumi.DependsOn([]pulumi.Resource{deny}))
	if err != nil {
		return fail("instance profile", err)
	}
	for _, arch := range slices.Compact(slices.Sorted(slices.Values(args.Arches))) {
		infra, err := imagebuilder.NewInfrastructureConfiguration(ctx, name+"-"+string(arch),
			&imagebuilder.InfrastructureConfigurationArgs{
				Name:                pulumi.String(iamName + "-" + string(arch)),
				Description:         pulumi.Sprintf("dynk8s %s: the %s build instance of the baked node images", args.ClusterName, arch),
				InstanceProfileName: profile.Name,
				InstanceTypes:       pulumi.StringArray{pulumi.String(BuildInstanceTypes[arch])},
				SubnetId:            args.SubnetID,
				SecurityGroupIds:    pulumi.StringArray{args.SecurityGroupID},
				// A failed build's instance is terminated, not left running (and billing) for a look at it; the
				// steps' output is in CloudWatch Logs, group /aws/imagebuilder/<recipe name> (Image Builder's
				// default), and the reason in the image's state.
				TerminateInstanceOnFailure: pulumi.Bool(true),
				// As the nodes: IMDSv2 only, one hop (the bootstrap asks IMDS with a token).
				InstanceMetadataOptions: &imagebuilder.InfrastructureConfigurationInstanceMetadataOptionsArgs{
					HttpTokens:              pulumi.String("required"),
					HttpPutResponseHopLimit: pulumi.Int(1),
				},
				// The build instance carries the cluster's tag but no pool's: the gateway's idle check counts only
				// pool instances, so a build never keeps the gateway awake.
				ResourceTags: tags,
				Tags:         tags,
			}, parent)
		if err != nil {
			return fail("infrastructure configuration "+string(arch), err)
		}
		comp.Infrastructure[arch] = infra.Arn
	}
	comp.RoleName = role.Name
	if err := ctx.RegisterResourceOutputs(comp, pulumi.Map{"roleName": comp.RoleName}); err != nil {
		return fail("outputs", err)
	}
	return comp, nil
}

// BakeArgs are what a baked pool's image needs besides the pool's own inputs.
type BakeArgs struct {
	// Region is the stack's: the image is distributed there.
	Region string
	// InfrastructureARN is the build's infrastructure configuration for the pool's architecture (ImageBuilder).
	InfrastructureARN pulumi.StringInput
}

// ComponentDocument is an AWS Task Orchestrator and Executor (AWSTOE) component document, the YAML an Image Builder
// component runs (EC2 Image Builder User Guide, "Use the AWSTOE component document framework for custom
// components"): phases of steps, each an action module with its inputs.
type ComponentDocument struct {
	Name          string           `json:"name"`
	Description   string           `json:"description"`
	SchemaVersion string           `json:"schemaVersion"`
	Phases        []ComponentPhase `json:"phases"`
}

// ComponentPhase is one phase of a component document: build runs on the build instance, validate after it on the
// same instance, before the snapshot.
type ComponentPhase struct {
	Name  string          `json:"name"`
	Steps []ComponentStep `json:"steps"`
}

// ComponentStep is one step: an ExecuteBash step runs its commands as one bash script and fails on a non-zero exit.
type ComponentStep struct {
	Name   string          `json:"name"`
	Action string          `json:"action"`
	Inputs ComponentInputs `json:"inputs"`
}

// ComponentInputs are an ExecuteBash step's inputs.
type ComponentInputs struct {
	Commands []string `json:"commands"`
}

// bakeInput is what a pool's build runs from: the pool's rendered user data (not encoded) and its agent's pin.
type bakeInput struct {
	Name     string // the component's name
	UserData []byte
	Agent    cloudinit.Agent
}

// heredocEnd closes the files the build writes; no file may hold the line.
const heredocEnd = "DYNK8S_FILE_END"

// componentDocument is a pool's build: the prepare files of its user data, the agent by the node's bootstrap, the
// prepare step and the identity cleanup, then a check that the image holds what this config baked.
func componentDocument(in bakeInput) (ComponentDocument, error) {
	prepare, repos, err := cloudinit.PrepareFiles(in.UserData)
	if err != nil {
		return ComponentDocument{}, err
	}
	agentFiles, fetch, err := cloudinit.AgentFetch(in.Agent)
	if err != nil {
		return ComponentDocument{}, err
	}
	write := []string{"set -euo pipefail"}
	nodeJSON := ""
	for _, f := range slices.Concat(prepare, agentFiles,
		[]cloudinit.File{{Path: reposConfig, Content: string(repos), Permissions: 0o600}}) {
		cmd, err := writeFileCommand(f)
		if err != nil {
			return ComponentDocument{}, err
		}
		write = append(write, cmd)
		if f.Path == nodeconfig.Path {
			nodeJSON = f.Content
		}
	}
	configSum := sha256.Sum256([]byte(nodeJSON))
	bash := func(name string, commands ...string) ComponentStep {
		return ComponentStep{Name: name, Action: "ExecuteBash",
			Inputs: ComponentInputs{Commands: append([]string{"set -euo pipefail"}, commands...)}}
	}
	return ComponentDocument{
		Name:          in.Name,
		Description:   "dynk8s: the node's prepare step, run by its own agent, then the instance's identity removed",
		SchemaVersion: "1.0",
		Phases: []ComponentPhase{
			{Name: "build", Steps: []ComponentStep{
				{Name: "WritePoolFiles", Action: "ExecuteBash", Inputs: ComponentInputs{Commands: write}},
				// The .repo files exactly as a node's cloud-init writes them: by cloud-init's own module.
				bash("AddRepositories", cloudinit.AddRepositories(reposConfig)),
				bash("FetchAgent", fetch),
				bash("Prepare", nodeAgent+" prepare --config "+nodeconfig.Path),
				// Last: the instance is stopped and snapshotted after the validate phase, which only reads.
				bash("CleanIdentity", nodeAgent+" clean-identity"),
			}},
			{Name: "validate", Steps: []ComponentStep{
				// The agent reads the marker: no JSON is parsed by a script.
				bash("CheckBakedImage",
					fmt.Sprintf("test \"$(sha256sum %s | cut -d' ' -f1)\" = %s", nodeAgent, in.Agent.SHA256),
					fmt.Sprintf("%s check-image --config-sha256 %s", nodeAgent, hex.EncodeToString(configSum[:]))),
			}},
		},
	}, nil
}

// writeFileCommand writes one file, byte for byte, with its mode.
func writeFileCommand(f cloudinit.File) (string, error) {
	switch {
	case !strings.HasSuffix(f.Content, "\n"):
		return "", fmt.Errorf("%s: a heredoc writes a final newline the file lacks", f.Path)
	case strings.Contains("\n"+f.Content, "\n"+heredocEnd+"\n"):
		return "", fmt.Errorf("%s: holds the line %s", f.Path, heredocEnd)
	case strings.Contains(f.Content, "{{"):
		// AWSTOE expands {{ ... }} in a step's inputs.
		return "", fmt.Errorf("%s: holds {{, which AWSTOE would expand", f.Path)
	}
	return fmt.Sprintf("install -d -m 0755 %s\ncat > %s <<'%s'\n%s%s\nchmod %04o %s", path.Dir(f.Path), f.Path,
		heredocEnd, f.Content, heredocEnd, f.Permissions.Perm(), f.Path), nil
}

// imageVersion is a content-derived semantic version: the Kubernetes minor and patch, then 30 bits of the content's
// sha256 (Image Builder allows 0..2^30-1 per node). A change of any content is a new version: Image Builder's
// components and recipes are immutable, and Pulumi creates the replacement before it deletes the old one.
func imageVersion(k kube.Version, content ...string) string {
	h := sha256.New()
	for _, c := range content {
		fmt.Fprintf(h, "%d:%s;", len(c), c)
	}
	return fmt.Sprintf("%d.%d.%d", k.Minor, k.Patch, binary.BigEndian.Uint32(h.Sum(nil))>>2)
}

// bakedImage declares a pool's component, recipe, distribution and image, children of the pool, and returns the
// baked AMI's id. parentImage is the pool's Fedora image lookup; userData the pool's rendered cloud-config.
func bakedImage(ctx *pulumi.Context, name string, args *NodePoolArgs, parentImage ec2.LookupAmiResultOutput,
	userData pulumix.Output[string], agent pulumix.Output[cloudinit.Agent], parent pulumi.ResourceOption) (pulumi.StringOutput, error) {
	pool := args.Pool
	// Named as the pool's launch template and group are: the image is the pool's.
	imageName := args.ClusterName + "-" + pool.Name
	// The Kubernetes version it holds, also on the AMI: an operator finds the images of a version by it.
	tags := awsTags(append(config.IdentityTags(args.ClusterName, pool.Name, imageName),
		config.Tag{Key: KubernetesVersionTag, Value: args.Render.KubernetesVersion.String()}))
	fail := func(what string, err error) (pulumi.StringOutput, error) {
		return pulumi.StringOutput{}, fmt.Errorf("node pool %q: baked image: %s: %w", pool.Name, what, err)
	}

	data := pulumix.Apply2Err(userData, agent, func(ud string, a cloudinit.Agent) (string, error) {
		doc, err := componentDocument(bakeInput{Name: imageName, UserData: []byte(ud), Agent: a})
		if err != nil {
			return "", fmt.Errorf("node pool %q: component: %w", pool.Name, err)
		}
		out, err := yaml.Marshal(doc)
		if err != nil {
			return "", err
		}
		if len(out) > maxComponentData {
			return "", fmt.Errorf("node pool %q: the component document is %d characters, over Image Builder's %d",
				pool.Name, len(out), maxComponentData)
		}
		return string(out), nil
	})
	k := args.Render.KubernetesVersion
	componentVersion := pulumix.Apply(data, func(d string) string { return imageVersion(k, d) })
	component, err := imagebuilder.NewComponent(ctx, name+"-image-component", &imagebuilder.ComponentArgs{
		Name:        pulumi.String(imageName),
		Description: pulumi.Sprintf("dynk8s %s node pool %s: prepare, then clean the identity", args.ClusterName, pool.Name),
		Platform:    pulumi.String("Linux"),
		Version:     pulumix.Cast[pulumi.StringOutput](componentVersion),
		Data:        pulumix.Cast[pulumi.StringOutput](data),
		Tags:        tags,
	}, parent)
	if err != nil {
		return fail("component", err)
	}

	recipeVersion := pulumix.Apply2(componentVersion, parentImage.Id(), func(c, parentID string) string {
		return imageVersion(k, c, parentID, fmt.Sprint(BuildVolumeGiB))
	})
	recipe, err := imagebuilder.NewImageRecipe(ctx, name+"-image-recipe", &imagebuilder.ImageRecipeArgs{
		Name:        pulumi.String(imageName),
		Description: pulumi.Sprintf("dynk8s %s node pool %s, from the pinned Fedora image", args.ClusterName, pool.Name),
		Version:     pulumix.Cast[pulumi.StringOutput](recipeVersion),
		ParentImage: parentImage.Id(),
		Components:  imagebuilder.ImageRecipeComponentArray{&imagebuilder.ImageRecipeComponentArgs{ComponentArn: component.Arn}},
		BlockDeviceMappings: imagebuilder.ImageRecipeBlockDeviceMappingArray{&imagebuilder.ImageRecipeBlockDeviceMappingArgs{
			DeviceName: parentImage.RootDeviceName(),
			Ebs: &imagebuilder.ImageRecipeBlockDeviceMappingEbsArgs{
				VolumeType:          pulumi.String("gp3"),
				VolumeSize:          pulumi.Int(BuildVolumeGiB),
				Encrypted:           pulumi.String("true"),
				DeleteOnTermination: pulumi.String("true"),
			},
		}},
		// Fedora Cloud ships no Systems Manager agent: Image Builder installs one to drive the build, and removes
		// it again, so the nodes boot without it, as from the stock image.
		SystemsManagerAgent: &imagebuilder.ImageRecipeSystemsManagerAgentArgs{UninstallAfterBuild: pulumi.Bool(true)},
		Tags:                tags,
	}, parent)
	if err != nil {
		return fail("recipe", err)
	}

	distribution, err := imagebuilder.NewDistributionConfiguration(ctx, name+"-image-distribution",
		&imagebuilder.DistributionConfigurationArgs{
			Name:        pulumi.String(imageName),
			Description: pulumi.Sprintf("dynk8s %s node pool %s: the baked image, in the stack's region", args.ClusterName, pool.Name),
			Distributions: imagebuilder.DistributionConfigurationDistributionArray{
				&imagebuilder.DistributionConfigurationDistributionArgs{
					Region: pulumi.String(args.Bake.Region),
					AmiDistributionConfiguration: &imagebuilder.DistributionConfigurationDistributionAmiDistributionConfigurationArgs{
						// AMI names are unique per account and region: the build's date tells two builds apart.
						Name: pulumi.String(imageName + "-{{ imagebuilder:buildDate }}"),
						// The AMI (and its snapshot) outlive the image resource (DeleteImage keeps them): the tags
						// find them.
						AmiTags: tags,
					},
				},
			},
			Tags: tags,
		}, parent)
	if err != nil {
		return fail("distribution", err)
	}

	image, err := imagebuilder.NewImage(ctx, name+"-image", &imagebuilder.ImageArgs{
		ImageRecipeArn:                 recipe.Arn,
		InfrastructureConfigurationArn: args.Bake.InfrastructureARN,
		DistributionConfigurationArn:   distribution.Arn,
		// No test phase (the component has none; it would launch a second instance) and no inventory collection
		// through Systems Manager, which the image does not keep.
		ImageTestsConfiguration:      &imagebuilder.ImageImageTestsConfigurationArgs{ImageTestsEnabled: pulumi.Bool(false)},
		EnhancedImageMetadataEnabled: pulumi.Bool(false),
		Tags:                         tags,
	}, parent, pulumi.Timeouts(&pulumi.CustomTimeouts{Create: BuildTimeout}))
	if err != nil {
		return fail("image", err)
	}
	return image.OutputResources.ApplyT(func(rs []imagebuilder.ImageOutputResource) (string, error) {
		for _, r := range rs {
			for _, a := range r.Amis {
				if a.Image != nil && *a.Image != "" {
					return *a.Image, nil
				}
			}
		}
		return "", fmt.Errorf("node pool %q: the baked image has no AMI", pool.Name)
	}).(pulumi.StringOutput), nil
}

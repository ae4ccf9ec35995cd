// Package bake builds a baked pool's image outside `pulumi up`, the way images are usually built before an
// infrastructure apply (Packer's pattern): one instance of the pool's Fedora image boots cloudinit.Bake's user data,
// whose node agent prepares the node, removes the instance's identity and powers off; the stopped instance is
// imaged, the image tagged with the pool's bake identity (infra.BakeID), the instance terminated, and the pool's
// older images beyond the newest few deregistered with their snapshots. The program only looks the image up by its
// tags. A pool whose image for the current config exists is left as it is, so a second run does nothing.
package bake

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
)

// EC2 is what a bake asks of EC2.
type EC2 interface {
	ec2.DescribeImagesAPIClient
	DescribeSubnets(context.Context, *ec2.DescribeSubnetsInput, ...func(*ec2.Options)) (*ec2.DescribeSubnetsOutput, error)
	DescribeSecurityGroups(context.Context, *ec2.DescribeSecurityGroupsInput, ...func(*ec2.Options)) (*ec2.DescribeSecurityGroupsOutput, error)
	RunInstances(context.Context, *ec2.RunInstancesInput, ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	GetConsoleOutput(context.Context, *ec2.GetConsoleOutputInput, ...func(*ec2.Options)) (*ec2.GetConsoleOutputOutput, error)
	CreateImage(context.Context, *ec2.CreateImageInput, ...func(*ec2.Options)) (*ec2.CreateImageOutput, error)
	CreateTags(context.Context, *ec2.CreateTagsInput, ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
	TerminateInstances(context.Context, *ec2.TerminateInstancesInput, ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
	DeregisterImage(context.Context, *ec2.DeregisterImageInput, ...func(*ec2.Options)) (*ec2.DeregisterImageOutput, error)
	DeleteSnapshot(context.Context, *ec2.DeleteSnapshotInput, ...func(*ec2.Options)) (*ec2.DeleteSnapshotOutput, error)
}

// S3 is what a bake asks of S3: where the stack's agent bucket is, and the agent object's current version.
type S3 interface {
	ListBuckets(context.Context, *s3.ListBucketsInput, ...func(*s3.Options)) (*s3.ListBucketsOutput, error)
	GetBucketTagging(context.Context, *s3.GetBucketTaggingInput, ...func(*s3.Options)) (*s3.GetBucketTaggingOutput, error)
	HeadObject(context.Context, *s3.HeadObjectInput, ...func(*s3.Options)) (*s3.HeadObjectOutput, error)
}

// VolumeGiB is the bake instance's root volume, and so the image's: Fedora Cloud's 5 GiB and room for the
// packages and the pre-pulled images. A pool's launch template grows it to the pool's volumeSizeGiB (at least 20).
// Its snapshot bills the blocks written, not this size.
const VolumeGiB = 10

// Baker bakes the images of one stack's pools.
type Baker struct {
	EC2 EC2
	S3  S3
	// Config is the stack's validated configuration; Stack its name.
	Config *config.Config
	Stack  string
	// Log gets one line per step.
	Log io.Writer
	// Keep is how many of a pool's images stay, the newest (infra.BakeKeep).
	Keep int
	// Timeout bounds a bake from its launch to its image's availability; Poll is how often its state is read.
	Timeout, Poll time.Duration
	// KeepFailed leaves a failed bake's instance running, for a look (it bills until terminated).
	KeepFailed bool
	// Now is the clock that names the image.
	Now func() time.Time
}

// Result is what a pool's bake left.
type Result struct {
	Pool, BakeID, ImageID string
	// Built is false when the image for the config existed already.
	Built bool
	// Pruned are the older images deregistered.
	Pruned []string
}

func (b *Baker) logf(pool, format string, args ...any) {
	fmt.Fprintf(b.Log, "bake: pool %s: %s\n", pool, fmt.Sprintf(format, args...))
}

// Bake makes sure pool has an image for the current config, and prunes its older ones.
func (b *Baker) Bake(ctx context.Context, pool config.NodePool) (Result, error) {
	if !pool.Baked() {
		return Result{}, fmt.Errorf("pool %s boots image %s, not a baked one (nodePools[].image)", pool.Name, pool.Image)
	}
	id, err := infra.BakeID(b.Config, pool)
	if err != nil {
		return Result{}, fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	res := Result{Pool: pool.Name, BakeID: id}
	images, err := b.images(ctx, pool.Name)
	if err != nil {
		return res, err
	}
	if img := current(images, id); img != nil {
		res.ImageID = aws.ToString(img.ImageId)
		if img.State != ec2types.ImageStateAvailable {
			b.logf(pool.Name, "image %s for bake %s is %s: waiting for it", res.ImageID, short(id), img.State)
			if err := b.waitImage(ctx, res.ImageID); err != nil {
				return res, err
			}
			if err := b.tagSnapshots(ctx, res.ImageID); err != nil {
				return res, err
			}
		} else {
			b.logf(pool.Name, "image %s is baked for this config (%s=%s): nothing to bake", res.ImageID, infra.BakeTag, id)
		}
	} else {
		b.logf(pool.Name, "no image for this config (%s=%s): baking one", infra.BakeTag, id)
		if res.ImageID, err = b.build(ctx, pool, id); err != nil {
			return res, err
		}
		res.Built = true
		if images, err = b.images(ctx, pool.Name); err != nil {
			return res, err
		}
	}
	res.Pruned, err = b.prune(ctx, pool.Name, images, res.ImageID)
	return res, err
}

// Check says whether pool's image for the current config is there (available), without baking: a preview's gate.
func (b *Baker) Check(ctx context.Context, pool config.NodePool) (Result, bool, error) {
	id, err := infra.BakeID(b.Config, pool)
	if err != nil {
		return Result{}, false, fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	res := Result{Pool: pool.Name, BakeID: id}
	images, err := b.images(ctx, pool.Name)
	if err != nil {
		return res, false, err
	}
	img := current(images, id)
	if img == nil || img.State != ec2types.ImageStateAvailable {
		return res, false, nil
	}
	res.ImageID = aws.ToString(img.ImageId)
	return res, true, nil
}

// images are pool's baked images, every state.
func (b *Baker) images(ctx context.Context, pool string) ([]ec2types.Image, error) {
	var images []ec2types.Image
	pages := ec2.NewDescribeImagesPaginator(b.EC2, &ec2.DescribeImagesInput{
		Owners: []string{"self"},
		Filters: []ec2types.Filter{
			filter("tag:"+names.TagCluster, b.Config.ClusterName),
			filter("tag:"+names.TagPool, pool),
			filter("tag-key", infra.BakeTag),
		},
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("pool %s: list its baked images: %w", pool, err)
		}
		images = append(images, page.Images...)
	}
	return images, nil
}

// current is the image baked for id, available first, then pending; a failed one is not.
func current(images []ec2types.Image, id string) *ec2types.Image {
	var found *ec2types.Image
	for i := range images {
		img := &images[i]
		if tag(img.Tags, infra.BakeTag) != id {
			continue
		}
		switch img.State {
		case ec2types.ImageStateAvailable:
			return img
		case ec2types.ImageStatePending:
			found = img
		}
	}
	return found
}

// parts are what a bake instance launches into: the stack's subnets, its nodes' security group, the bake's
// instance profile, and the agent's pin.
type parts struct {
	subnets       []string
	securityGroup string
	profile       string
	agent         cloudinit.Agent
}

// errNotUp is the stack's parts missing: its first `pulumi up` has not run.
func errNotUp(what string, cluster string) error {
	return fmt.Errorf("the stack of cluster %s has no %s yet: a bake launches into the stack's own subnets with its "+
		"agent, so bring the stack up first (on a new stack, with the baked pools at image: stock for that first up)",
		cluster, what)
}

func (b *Baker) parts(ctx context.Context, arch kube.Arch) (parts, error) {
	cluster := b.Config.ClusterName
	var p parts
	subnets, err := b.EC2.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{
		Filters: []ec2types.Filter{filter("tag:"+names.TagCluster, cluster)}})
	if err != nil {
		return p, fmt.Errorf("list the stack's subnets: %w", err)
	}
	sorted := slices.Clone(subnets.Subnets)
	slices.SortFunc(sorted, func(a, c ec2types.Subnet) int {
		return cmp.Compare(aws.ToString(a.AvailabilityZone), aws.ToString(c.AvailabilityZone))
	})
	for _, s := range sorted {
		p.subnets = append(p.subnets, aws.ToString(s.SubnetId))
	}
	if len(p.subnets) == 0 {
		return p, errNotUp("subnets (tag "+names.TagCluster+")", cluster)
	}
	groups, err := b.EC2.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{
		Filters: []ec2types.Filter{filter("tag:"+names.TagCluster, cluster), filter("tag:Name", cluster+"-node-sg")}})
	if err != nil {
		return p, fmt.Errorf("find the nodes' security group: %w", err)
	}
	if len(groups.SecurityGroups) != 1 {
		return p, errNotUp("nodes' security group ("+cluster+"-node-sg)", cluster)
	}
	p.securityGroup = aws.ToString(groups.SecurityGroups[0].GroupId)
	p.profile = infra.BakeProfileName(cluster)
	p.agent, err = b.agent(ctx, arch)
	return p, err
}

// agent is the pin of the node agent the stack's last `pulumi up` uploaded for arch: the bake instance fetches and
// checks it exactly as a node does. The image's identity does not depend on it: a node fetches its own agent at
// every boot.
func (b *Baker) agent(ctx context.Context, arch kube.Arch) (cloudinit.Agent, error) {
	cluster := b.Config.ClusterName
	list, err := b.S3.ListBuckets(ctx, &s3.ListBucketsInput{Prefix: aws.String(infra.AgentBucketPrefix(cluster))})
	if err != nil {
		return cloudinit.Agent{}, fmt.Errorf("find the stack's agent bucket: %w", err)
	}
	var bucket string
	for _, bk := range list.Buckets {
		name := aws.ToString(bk.Name)
		if !strings.HasPrefix(name, infra.AgentBucketPrefix(cluster)) {
			continue
		}
		tags, err := b.S3.GetBucketTagging(ctx, &s3.GetBucketTaggingInput{Bucket: aws.String(name)})
		if err != nil {
			continue // another stack's, or untagged: not this cluster's
		}
		for _, t := range tags.TagSet {
			if aws.ToString(t.Key) == names.TagCluster && aws.ToString(t.Value) == cluster {
				bucket = name
			}
		}
	}
	if bucket == "" {
		return cloudinit.Agent{}, errNotUp("agent bucket ("+infra.AgentBucketPrefix(cluster)+"*)", cluster)
	}
	key := infra.AgentPrefix + "linux-" + arch.Label()
	head, err := b.S3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return cloudinit.Agent{}, fmt.Errorf("the stack's agent s3://%s/%s: %w", bucket, key, err)
	}
	if why, standIn := head.Metadata["stand-in"]; standIn {
		return cloudinit.Agent{}, fmt.Errorf("the stack's agent s3://%s/%s is a stand-in (%s): `make build`, then "+
			"`pulumi up`, then bake", bucket, key, why)
	}
	return cloudinit.Agent{Bucket: bucket, Key: key, VersionID: aws.ToString(head.VersionId),
		SHA256: head.Metadata["sha256"]}, nil
}

// parent is the newest GA image of the config's Fedora release for arch: what the pool's stock nodes boot.
func (b *Baker) parent(ctx context.Context, arch kube.Arch) (ec2types.Image, error) {
	q, err := infra.FedoraImage(b.Config.Fedora.Release, arch, b.Config.Region)
	if err != nil {
		return ec2types.Image{}, err
	}
	out, err := b.EC2.DescribeImages(ctx, &ec2.DescribeImagesInput{
		Owners: []string{infra.FedoraOwner},
		Filters: []ec2types.Filter{filter("name", q.NameFilter), filter("architecture", string(arch)),
			filter("virtualization-type", "hvm"), filter("root-device-type", "ebs"), filter("state", "available")},
	})
	if err != nil {
		return ec2types.Image{}, fmt.Errorf("find the Fedora %d image: %w", b.Config.Fedora.Release, err)
	}
	var newest *ec2types.Image
	for i, img := range out.Images {
		if q.Matches(aws.ToString(img.Name)) &&
			(newest == nil || aws.ToString(img.CreationDate) > aws.ToString(newest.CreationDate)) {
			newest = &out.Images[i]
		}
	}
	if newest == nil {
		return ec2types.Image{}, fmt.Errorf("EC2 has no Fedora %d GA image for %s in %s (%s)", b.Config.Fedora.Release,
			arch, b.Config.Region, q.NameFilter)
	}
	return *newest, nil
}

// userData is the bake instance's, encoded as RunInstances takes it.
func (b *Baker) userData(pool config.NodePool, agent cloudinit.Agent) (string, error) {
	node, render := infra.NodeConfig(b.Config, pool, nil, infra.JoinTokenParameter(b.Config.ClusterName))
	render.Agent = &agent
	raw, err := cloudinit.Bake(node, render)
	if err != nil {
		return "", err
	}
	return cloudinit.Encode(raw)
}

// build launches the bake, waits for it to power off, images it and terminates it.
func (b *Baker) build(ctx context.Context, pool config.NodePool, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	p, err := b.parts(ctx, pool.Arch)
	if err != nil {
		return "", fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	parent, err := b.parent(ctx, pool.Arch)
	if err != nil {
		return "", fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	userData, err := b.userData(pool, p.agent)
	if err != nil {
		return "", fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	instance, err := b.launch(ctx, pool, id, p, parent, userData)
	if err != nil {
		return "", fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	keep := false
	defer func() {
		if keep {
			b.logf(pool.Name, "left instance %s running for a look (-keep-failed): it bills until you terminate it: "+
				"aws ec2 terminate-instances --region %s --instance-ids %s", instance, b.Config.Region, instance)
			return
		}
		// Terminated even when the caller's context is done: a bake instance left running bills.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := b.EC2.TerminateInstances(tctx, &ec2.TerminateInstancesInput{InstanceIds: []string{instance}}); err != nil {
			b.logf(pool.Name, "could not terminate bake instance %s: %v: terminate it yourself, it bills", instance, err)
			return
		}
		b.logf(pool.Name, "terminated bake instance %s", instance)
	}()
	if err := b.waitStopped(ctx, pool.Name, instance); err != nil {
		keep = b.KeepFailed
		return "", fmt.Errorf("pool %s: bake instance %s: %w", pool.Name, instance, err)
	}
	image, err := b.image(ctx, pool, id, instance, aws.ToString(parent.ImageId))
	if err != nil {
		return "", fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	return image, nil
}

// launchRetryable are RunInstances' answers that another instance type or subnet (zone) may not get: no capacity
// there, or the type not offered in that zone (EC2 API reference, "Error codes").
var launchRetryable = []string{"InsufficientInstanceCapacity", "Unsupported", "InstanceLimitExceeded"}

// launch starts the bake instance: the pool's instance types in turn, each in the stack's subnets in turn.
func (b *Baker) launch(ctx context.Context, pool config.NodePool, id string, p parts, parent ec2types.Image,
	userData string) (string, error) {
	tags := []ec2types.Tag{
		{Key: aws.String("Name"), Value: aws.String(b.Config.ClusterName + "-" + pool.Name + "-bake")},
		{Key: aws.String(names.TagCluster), Value: aws.String(b.Config.ClusterName)},
		// Not the pool's tag: a bake instance is no node (the gateway's idle check, the controller's loops and
		// the autoscaler count the pool's tagged instances).
		{Key: aws.String(infra.BakeTag), Value: aws.String(id)},
	}
	var errs []error
	for _, typ := range pool.InstanceTypes {
		for _, subnet := range p.subnets {
			out, err := b.runInstance(ctx, typ, subnet, p, parent, userData, tags)
			if err == nil {
				instance := aws.ToString(out.Instances[0].InstanceId)
				b.logf(pool.Name, "launched bake instance %s (%s in %s) from %s (%s)", instance, typ, subnet,
					aws.ToString(parent.ImageId), aws.ToString(parent.Name))
				return instance, nil
			}
			var api smithy.APIError
			if !errors.As(err, &api) || !slices.Contains(launchRetryable, api.ErrorCode()) {
				return "", fmt.Errorf("launch a bake instance: %w", err)
			}
			b.logf(pool.Name, "%s in %s: %s: trying the next", typ, subnet, api.ErrorCode())
			errs = append(errs, fmt.Errorf("%s in %s: %w", typ, subnet, err))
		}
	}
	return "", fmt.Errorf("no instance type of the pool could be launched in any of the stack's subnets: %w", errors.Join(errs...))
}

// runInstance is one RunInstances, retried for a minute while IAM has not yet made a new instance profile visible
// to EC2 (IAM User Guide, "Troubleshoot IAM roles": a profile can take a few seconds to be usable).
func (b *Baker) runInstance(ctx context.Context, typ, subnet string, p parts, parent ec2types.Image, userData string,
	tags []ec2types.Tag) (*ec2.RunInstancesOutput, error) {
	in := &ec2.RunInstancesInput{
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		ImageId:      parent.ImageId,
		InstanceType: ec2types.InstanceType(typ),
		SubnetId:     aws.String(subnet), SecurityGroupIds: []string{p.securityGroup},
		IamInstanceProfile: &ec2types.IamInstanceProfileSpecification{Name: aws.String(p.profile)},
		UserData:           aws.String(userData),
		// The agent powers the instance off when it is done: stopped, not terminated, so it can be imaged.
		InstanceInitiatedShutdownBehavior: ec2types.ShutdownBehaviorStop,
		// As the nodes: IMDSv2 only, one hop.
		MetadataOptions: &ec2types.InstanceMetadataOptionsRequest{
			HttpEndpoint: ec2types.InstanceMetadataEndpointStateEnabled,
			HttpTokens:   ec2types.HttpTokensStateRequired, HttpPutResponseHopLimit: aws.Int32(1)},
		BlockDeviceMappings: []ec2types.BlockDeviceMapping{{
			DeviceName: parent.RootDeviceName,
			Ebs: &ec2types.EbsBlockDevice{VolumeSize: aws.Int32(VolumeGiB), VolumeType: ec2types.VolumeTypeGp3,
				Encrypted: aws.Bool(true), DeleteOnTermination: aws.Bool(true)},
		}},
		TagSpecifications: []ec2types.TagSpecification{
			{ResourceType: ec2types.ResourceTypeInstance, Tags: tags},
			{ResourceType: ec2types.ResourceTypeVolume, Tags: tags},
		},
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := b.EC2.RunInstances(ctx, in)
		var api smithy.APIError
		if err == nil || !errors.As(err, &api) || api.ErrorCode() != "InvalidParameterValue" ||
			!strings.Contains(api.ErrorMessage(), "iamInstanceProfile") || time.Now().After(deadline) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// consoleFailure is the agent's or its bootstrap's one reason, as the units print it to the console.
var consoleFailure = regexp.MustCompile(`dynk8s[a-z-]*(\[\d+\])?: (FAILED: .*)`)

// waitStopped waits for the bake instance to power itself off, and fails at its console's FAILED line, at a state
// other than running or stopping, or at the deadline.
func (b *Baker) waitStopped(ctx context.Context, pool, instance string) error {
	start := time.Now()
	last := ec2types.InstanceStateName("")
	for {
		out, err := b.EC2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{instance}})
		switch {
		case err != nil:
			b.logf(pool, "describe %s: %v (trying again)", instance, err)
		case len(out.Reservations) == 0 || len(out.Reservations[0].Instances) == 0:
			b.logf(pool, "describe %s: not listed yet (trying again)", instance)
		default:
			state := out.Reservations[0].Instances[0].State.Name
			if state != last {
				b.logf(pool, "bake instance %s is %s (%s)", instance, state, time.Since(start).Round(time.Second))
				last = state
			}
			switch state {
			case ec2types.InstanceStateNameStopped:
				return nil
			case ec2types.InstanceStateNameShuttingDown, ec2types.InstanceStateNameTerminated:
				return fmt.Errorf("was %s instead of stopping: %s", state,
					aws.ToString(out.Reservations[0].Instances[0].StateReason.Message))
			}
			if reason := b.consoleFailure(ctx, instance); reason != "" {
				return fmt.Errorf("the bake failed: %s", reason)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not stopped after %s (-timeout): its console (aws ec2 get-console-output --latest "+
				"--instance-id %s) says why", time.Since(start).Round(time.Second), instance)
		case <-time.After(b.Poll):
		}
	}
}

// consoleFailure is the FAILED line on the instance's console, if any.
func (b *Baker) consoleFailure(ctx context.Context, instance string) string {
	out, err := b.EC2.GetConsoleOutput(ctx, &ec2.GetConsoleOutputInput{InstanceId: aws.String(instance), Latest: aws.Bool(true)})
	if err != nil || out.Output == nil {
		return ""
	}
	text, err := base64.StdEncoding.DecodeString(aws.ToString(out.Output))
	if err != nil {
		return ""
	}
	return FailureLine(string(text))
}

// FailureLine is the first FAILED line of the agent or its bootstrap in console text.
func FailureLine(console string) string {
	if m := consoleFailure.FindStringSubmatch(console); m != nil {
		return strings.TrimSpace(m[2])
	}
	return ""
}

// image creates the image of the stopped bake instance, tags it and its snapshots, and waits for it to be available.
func (b *Baker) image(ctx context.Context, pool config.NodePool, id, instance, parent string) (string, error) {
	name := fmt.Sprintf("%s-%s-%s-%s", b.Config.ClusterName, pool.Name, short(id), b.Now().UTC().Format("20060102T150405Z"))
	tags := []ec2types.Tag{
		{Key: aws.String("Name"), Value: aws.String(name)},
		{Key: aws.String(names.TagCluster), Value: aws.String(b.Config.ClusterName)},
		{Key: aws.String(names.TagPool), Value: aws.String(pool.Name)},
		{Key: aws.String(infra.BakeTag), Value: aws.String(id)},
		{Key: aws.String(infra.KubernetesVersionTag), Value: aws.String(b.Config.Kubernetes.Version.String())},
		{Key: aws.String(infra.ParentImageTag), Value: aws.String(parent)},
	}
	out, err := b.EC2.CreateImage(ctx, &ec2.CreateImageInput{
		InstanceId: aws.String(instance), Name: aws.String(name),
		Description:       aws.String(fmt.Sprintf("dynk8s %s node pool %s, baked from %s", b.Config.ClusterName, pool.Name, parent)),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeImage, Tags: tags}},
	})
	if err != nil {
		return "", fmt.Errorf("create the image of %s: %w", instance, err)
	}
	image := aws.ToString(out.ImageId)
	b.logf(pool.Name, "creating image %s (%s)", image, name)
	if err := b.waitImage(ctx, image); err != nil {
		return "", err
	}
	if err := b.tagSnapshots(ctx, image); err != nil {
		return "", err
	}
	b.logf(pool.Name, "image %s is available (%s=%s)", image, infra.BakeTag, id)
	return image, nil
}

// tagSnapshots gives an available image's snapshots the image's tags: they bill, and an operator finds them by
// cluster and pool. (CreateImage's tag specifications could tag them at once, but moto, which the tests run
// against, does not take a snapshot's; tagging after also serves an image an interrupted bake left pending.)
func (b *Baker) tagSnapshots(ctx context.Context, image string) error {
	desc, err := b.EC2.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{image}})
	if err != nil || len(desc.Images) != 1 {
		return fmt.Errorf("read image %s back: %w", image, err)
	}
	var tags []ec2types.Tag
	for _, t := range desc.Images[0].Tags {
		if !strings.HasPrefix(aws.ToString(t.Key), "aws:") {
			tags = append(tags, t)
		}
	}
	if snaps := snapshots(desc.Images[0]); len(snaps) > 0 && len(tags) > 0 {
		if _, err := b.EC2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: snaps, Tags: tags}); err != nil {
			return fmt.Errorf("tag the snapshots of %s: %w", image, err)
		}
	}
	return nil
}

// waitImage waits for an image to be available, with the SDK's waiter (it fails on a failed image).
func (b *Baker) waitImage(ctx context.Context, image string) error {
	w := ec2.NewImageAvailableWaiter(b.EC2, func(o *ec2.ImageAvailableWaiterOptions) {
		o.MinDelay = b.Poll
		o.MaxDelay = max(b.Poll, 30*time.Second)
	})
	wait := b.Timeout
	if deadline, ok := ctx.Deadline(); ok {
		wait = time.Until(deadline)
	}
	if err := w.Wait(ctx, &ec2.DescribeImagesInput{ImageIds: []string{image}}, wait); err != nil {
		return fmt.Errorf("image %s did not become available: %w", image, err)
	}
	return nil
}

// prune deregisters pool's images beyond the newest b.Keep, keep among them, and deletes their snapshots.
func (b *Baker) prune(ctx context.Context, pool string, images []ec2types.Image, keep string) ([]string, error) {
	var pruned []string
	for _, img := range Stale(images, keep, b.Keep) {
		image := aws.ToString(img.ImageId)
		if _, err := b.EC2.DeregisterImage(ctx, &ec2.DeregisterImageInput{ImageId: img.ImageId}); err != nil {
			return pruned, fmt.Errorf("pool %s: deregister image %s: %w", pool, image, err)
		}
		for _, snap := range snapshots(img) {
			if _, err := b.EC2.DeleteSnapshot(ctx, &ec2.DeleteSnapshotInput{SnapshotId: aws.String(snap)}); err != nil {
				return pruned, fmt.Errorf("pool %s: delete snapshot %s of image %s: %w", pool, snap, image, err)
			}
		}
		b.logf(pool, "deregistered image %s (%s, %s) and its snapshots %s", image, aws.ToString(img.CreationDate),
			short(tag(img.Tags, infra.BakeTag)), strings.Join(snapshots(img), " "))
		pruned = append(pruned, image)
	}
	return pruned, nil
}

// Stale are the images to deregister: all but keep of them, current (which the stack boots) and the newest others
// (by creation date); a failed image goes whatever its age, a pending one is another bake's and is left alone.
func Stale(images []ec2types.Image, current string, keep int) []ec2types.Image {
	sorted := slices.Clone(images)
	slices.SortFunc(sorted, func(a, c ec2types.Image) int {
		return cmp.Or(cmp.Compare(aws.ToString(c.CreationDate), aws.ToString(a.CreationDate)),
			cmp.Compare(aws.ToString(a.ImageId), aws.ToString(c.ImageId)))
	})
	var stale []ec2types.Image
	kept := 0
	if slices.ContainsFunc(sorted, func(img ec2types.Image) bool { return aws.ToString(img.ImageId) == current }) {
		kept = 1 // the current image is one of the keep, whatever its age
	}
	for _, img := range sorted {
		switch {
		case aws.ToString(img.ImageId) == current:
		case img.State == ec2types.ImageStatePending:
		case kept < keep && img.State == ec2types.ImageStateAvailable:
			kept++
		default:
			stale = append(stale, img)
		}
	}
	return stale
}

func snapshots(img ec2types.Image) []string {
	var ids []string
	for _, m := range img.BlockDeviceMappings {
		if m.Ebs != nil && m.Ebs.SnapshotId != nil {
			ids = append(ids, aws.ToString(m.Ebs.SnapshotId))
		}
	}
	return ids
}

func filter(name, value string) ec2types.Filter {
	return ec2types.Filter{Name: aws.String(name), Values: []string{value}}
}

func tag(tags []ec2types.Tag, key string) string {
	for _, t := range tags {
		if aws.ToString(t.Key) == key {
			return aws.ToString(t.Value)
		}
	}
	return ""
}

func short(id string) string { return id[:min(12, len(id))] }

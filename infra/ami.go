package infra

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
)

// FedoraOwner is the AWS account of the Fedora Project's official images.
const FedoraOwner = "125523088429"

// firstKiwiRelease is the first Fedora release whose cloud images are named by the Kiwi-based uploader.
const firstKiwiRelease = 40

// FedoraImageQuery is how one Fedora Cloud image is found: an EC2 name filter (a glob evaluated by the API) and a
// regular expression evaluated on the result, which is what pins the release and keeps the wrong images out.
type FedoraImageQuery struct {
	NameFilter   string
	NameRegex    string
	Architecture kube.Arch // the EC2 architecture filter
}

// FedoraImage returns the query for the GA Fedora Cloud Base image of release and arch (x86_64 or arm64) in region.
//
// Only GA images match. Prerelease (beta) images are refused, and so are date-labelled compose images
// (...-42-20250911.0): Fedora release engineering makes those private and deletes them about ten days after upload,
// and a launch template pointing at a deleted image makes every scale-up fail.
//
// Two naming schemes exist (Fedora's cloud image uploaders: fedimg up to 39, the Kiwi-based one from 40):
//   - F40 and later: Fedora-Cloud-Base-AmazonEC2.<arch>-<release>-<n.n>, e.g. ...AmazonEC2.aarch64-42-1.1
//   - F39 and older: Fedora-Cloud-Base-<release>-<n.n>.<arch>-hvm-<region>-gp3-0; the gp2 and "standard" volume
//     variants of the same image are not matched.
func FedoraImage(release int, arch kube.Arch, region string) (FedoraImageQuery, error) {
	nameArch := arch.Fedora()
	if release < config.OldestFedoraRelease || release > config.NewestFedoraRelease {
		return FedoraImageQuery{}, fmt.Errorf("no known cloud image naming scheme for Fedora %d", release)
	}
	q := FedoraImageQuery{Architecture: arch}
	if release >= firstKiwiRelease {
		q.NameFilter = fmt.Sprintf("Fedora-Cloud-Base-AmazonEC2.%s-%d-*", nameArch, release)
		q.NameRegex = fmt.Sprintf(`^Fedora-Cloud-Base-AmazonEC2\.%s-%d-\d{1,3}\.\d{1,3}$`, nameArch, release)
	} else {
		q.NameFilter = fmt.Sprintf("Fedora-Cloud-Base-%d-*.%s-hvm-%s-gp3-0", release, nameArch, region)
		q.NameRegex = fmt.Sprintf(`^Fedora-Cloud-Base-%d-\d{1,3}\.\d{1,3}\.%s-hvm-%s-gp3-0$`, release, nameArch,
			regexp.QuoteMeta(region))
	}
	return q, nil
}

// Matches reports whether an image name is one the query accepts (the API's glob is looser than the regex).
func (q FedoraImageQuery) Matches(name string) bool {
	return regexp.MustCompile(q.NameRegex).MatchString(name)
}

// checkPinnedImages asks EC2 about every pool's amiId before anything is declared: an image of another
// architecture than its pool's would fail every launch of the group (RunInstances refuses the mismatch), and the
// autoscaler would only back the group off; an image the account cannot see would fail at the first launch.
func checkPinnedImages(ctx *pulumi.Context, cfg *config.Config) error {
	var problems []config.FieldError
	for i, pool := range cfg.NodePools {
		if pool.AMIID == "" {
			continue
		}
		path := fmt.Sprintf("%s:nodePools[%d].amiId", config.Namespace, i)
		image, err := ec2.LookupAmi(ctx, &ec2.LookupAmiArgs{
			Filters: []ec2.GetAmiFilter{{Name: "image-id", Values: []string{pool.AMIID}}},
		})
		switch {
		case noImage(err):
			problems = append(problems, config.FieldError{Path: path,
				Msg: fmt.Sprintf("EC2 knows no image %s in %s that this account may launch", pool.AMIID, cfg.Region)})
		case err != nil:
			// Not a configuration problem: EC2 could not be asked.
			return fmt.Errorf("%s: asking EC2 about image %s: %w", path, pool.AMIID, err)
		case kube.Arch(image.Architecture) != pool.Arch:
			problems = append(problems, config.FieldError{Path: path,
				Msg: fmt.Sprintf("image %s is %s, the pool's instance types are %s", pool.AMIID, image.Architecture,
					pool.Arch)})
		}
	}
	if len(problems) > 0 {
		return &config.Error{Errors: problems}
	}
	return nil
}

// noImage reports whether an image lookup failed because nothing matched: the aws_ami data source fails with "Your
// query returned no results" rather than answering an empty image.
func noImage(err error) bool {
	return err != nil && strings.Contains(err.Error(), "returned no results")
}

// BakedImage is a baked pool's image as EC2 reports it: what the pool's launch template boots, and the name of its
// root device, which the template's root volume mapping resizes.
type BakedImage struct {
	ID             string
	RootDeviceName string
}

// checkBakedImages finds every baked pool's image before anything is declared: the newest available image of this
// account tagged with the cluster, the pool and the pool's BakeID (cmd/bake's tags). A pool without one is a
// configuration problem, reported with the command that bakes it, so that the preview fails with what to do instead
// of `pulumi up` creating a launch template that no instance can boot; an image of another architecture than the
// pool's is one too (RunInstances refuses the mismatch, as for amiId). Every problem is reported at once. It returns
// the images by pool name.
func checkBakedImages(ctx *pulumi.Context, cfg *config.Config) (map[string]BakedImage, error) {
	images := map[string]BakedImage{}
	var problems []config.FieldError
	for i, pool := range cfg.NodePools {
		if !pool.Baked() {
			continue
		}
		path := fmt.Sprintf("%s:nodePools[%d].image", config.Namespace, i)
		id, err := BakeID(cfg, pool)
		if err != nil {
			return nil, fmt.Errorf("%s: the baked image's identity: %w", path, err)
		}
		image, err := ec2.LookupAmi(ctx, bakedImageQuery(cfg.ClusterName, pool.Name, id))
		switch {
		case noImage(err):
			problems = append(problems, config.FieldError{Path: path, Msg: fmt.Sprintf(
				"no baked image of pool %s for this config (tag %s=%s) in %s: bake it with `%s`, then run the "+
					"preview again", pool.Name, BakeTag, id, cfg.Region, BakeCommand(ctx.Stack(), pool.Name))})
		case err != nil:
			// Not a configuration problem: EC2 could not be asked.
			return nil, fmt.Errorf("%s: asking EC2 for the baked image of pool %s (tag %s=%s): %w", path, pool.Name,
				BakeTag, id, err)
		case kube.Arch(image.Architecture) != pool.Arch:
			problems = append(problems, config.FieldError{Path: path, Msg: fmt.Sprintf(
				"the baked image %s of pool %s (tag %s=%s) is %s, the pool's instance types are %s: bake it again "+
					"with `%s`", image.Id, pool.Name, BakeTag, id, image.Architecture, pool.Arch,
				BakeCommand(ctx.Stack(), pool.Name))})
		default:
			images[pool.Name] = BakedImage{ID: image.Id, RootDeviceName: image.RootDeviceName}
		}
	}
	if len(problems) > 0 {
		return nil, &config.Error{Errors: problems}
	}
	return images, nil
}

// bakedImageQuery is the lookup of a pool's baked image by its tags: this account's own images (owner "self"), the
// newest of those that match (a re-bake of the same config tags a second image with the same identity), and only an
// available one (CreateImage's image is pending until its snapshot completes).
func bakedImageQuery(cluster, pool, bakeID string) *ec2.LookupAmiArgs {
	filter := func(name, value string) ec2.GetAmiFilter {
		return ec2.GetAmiFilter{Name: name, Values: []string{value}}
	}
	return &ec2.LookupAmiArgs{
		Owners:     []string{"self"},
		MostRecent: pulumi.BoolRef(true),
		Filters: []ec2.GetAmiFilter{
			filter("tag:"+names.TagCluster, cluster),
			filter("tag:"+names.TagPool, pool),
			filter("tag:"+BakeTag, bakeID),
			filter("state", "available"),
		},
	}
}

// lookupImage finds the image a pool or the gateway boots: the newest GA Fedora image of the pinned release and
// arch, or the image given by id. Both return the image's own root device name, so the root volume mapping resizes
// the image's root disk instead of adding a second one.
func lookupImage(ctx *pulumi.Context, q FedoraImageQuery, amiID string, opts ...pulumi.InvokeOption) ec2.LookupAmiResultOutput {
	args := ec2.LookupAmiOutputArgs{}
	if amiID != "" {
		args.Filters = ec2.GetAmiFilterArray{
			ec2.GetAmiFilterArgs{Name: pulumi.String("image-id"), Values: pulumi.StringArray{pulumi.String(amiID)}},
		}
		return ec2.LookupAmiOutput(ctx, args, opts...)
	}
	filter := func(name, value string) ec2.GetAmiFilterInput {
		return ec2.GetAmiFilterArgs{Name: pulumi.String(name), Values: pulumi.StringArray{pulumi.String(value)}}
	}
	args.Owners = pulumi.StringArray{pulumi.String(FedoraOwner)}
	args.MostRecent = pulumi.Bool(true)
	args.NameRegex = pulumi.String(q.NameRegex)
	args.Filters = ec2.GetAmiFilterArray{
		filter("name", q.NameFilter),
		filter("architecture", string(q.Architecture)),
		filter("virtualization-type", "hvm"),
		filter("root-device-type", "ebs"),
		filter("state", "available"),
	}
	return ec2.LookupAmiOutput(ctx, args, opts...)
}

package infra

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
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
		case err != nil && strings.Contains(err.Error(), "returned no results"):
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

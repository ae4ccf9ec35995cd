// Package cloud is the controller's AWS: the API calls it makes, as small interfaces the SDK's clients satisfy
// (EC2's DescribeInstances, SSM's PutParameter), the clients built from the pod's environment, and a typed view
// of the instances EC2 describes.
package cloud

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dynk8s/dynk8s/internal/names"
)

// EC2 is the EC2 API the controller calls: the approver and the cleanup describe instances, the wake-up starts the
// gateway, the warm pools' loop terminates stale warm instances, the cache loop lists, marks and deletes the cache
// volumes, nothing else.
type EC2 interface {
	DescribeVolumes(ctx context.Context, in *ec2.DescribeVolumesInput, opts ...func(*ec2.Options)) (*ec2.DescribeVolumesOutput, error)
	DeleteVolume(ctx context.Context, in *ec2.DeleteVolumeInput, opts ...func(*ec2.Options)) (*ec2.DeleteVolumeOutput, error)
	CreateTags(ctx context.Context, in *ec2.CreateTagsInput, opts ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	StartInstances(ctx context.Context, in *ec2.StartInstancesInput, opts ...func(*ec2.Options)) (*ec2.StartInstancesOutput, error)
	TerminateInstances(ctx context.Context, in *ec2.TerminateInstancesInput, opts ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
}

// AutoScaling is the EC2 Auto Scaling API the controller calls: the warm pools' loop reads each group's launch
// template version and its warm instances.
type AutoScaling interface {
	DescribeAutoScalingGroups(ctx context.Context, in *autoscaling.DescribeAutoScalingGroupsInput, opts ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
	DescribeWarmPool(ctx context.Context, in *autoscaling.DescribeWarmPoolInput, opts ...func(*autoscaling.Options)) (*autoscaling.DescribeWarmPoolOutput, error)
}

// SSM is the SSM API the controller calls: the rotator overwrites the join token parameter.
type SSM interface {
	PutParameter(ctx context.Context, in *ssm.PutParameterInput, opts ...func(*ssm.Options)) (*ssm.PutParameterOutput, error)
}

// The tags the controller reads on an instance besides names.TagCluster and names.TagPool.
const (
	// TagGroup is the tag EC2 Auto Scaling puts on every instance it launches.
	TagGroup = "aws:autoscaling:groupName"
)

// Instance is an instance as DescribeInstances answers it.
type Instance struct {
	ID    string
	State ec2types.InstanceStateName
	Tags  map[string]string
}

// Live reports whether the instance is pending or running.
func (i Instance) Live() bool {
	return i.State == ec2types.InstanceStateNamePending || i.State == ec2types.InstanceStateNameRunning
}

// Gone reports whether the instance is shutting down or terminated: it will never be a node again.
func (i Instance) Gone() bool {
	return i.State == ec2types.InstanceStateNameShuttingDown || i.State == ec2types.InstanceStateNameTerminated
}

// Filter is one DescribeInstances filter: a name (instance-id, instance-state-name, tag:<key>) and its values.
type Filter struct {
	Name   string
	Values []string
}

// Describe returns every instance that passes all filters, over every page, sorted by id.
func Describe(ctx context.Context, c EC2, filters ...Filter) ([]Instance, error) {
	in := &ec2.DescribeInstancesInput{MaxResults: aws.Int32(1000)}
	for _, f := range filters {
		in.Filters = append(in.Filters, ec2types.Filter{Name: aws.String(f.Name), Values: f.Values})
	}
	var out []Instance
	p := ec2.NewDescribeInstancesPaginator(c, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("ec2:DescribeInstances: %w", err)
		}
		for _, r := range page.Reservations {
			for _, i := range r.Instances {
				inst := Instance{ID: aws.ToString(i.InstanceId), Tags: map[string]string{}}
				if i.State != nil {
					inst.State = i.State.Name
				}
				for _, t := range i.Tags {
					inst.Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
				}
				out = append(out, inst)
			}
		}
	}
	slices.SortFunc(out, func(a, b Instance) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out, nil
}

// LiveOfCluster returns the pending and running instances that carry cluster's names.TagCluster, by id: one call
// for every claim a batch of CSRs makes.
func LiveOfCluster(ctx context.Context, c EC2, cluster string) (map[string]Instance, error) {
	list, err := Describe(ctx, c,
		Filter{"instance-state-name", []string{string(ec2types.InstanceStateNamePending), string(ec2types.InstanceStateNameRunning)}},
		Filter{"tag:" + names.TagCluster, []string{cluster}})
	if err != nil {
		return nil, err
	}
	return byID(list), nil
}

// ByID describes the instances of ids, in one call per 200 of them (EC2's limit for a filter's values); an id EC2
// no longer knows (an hour or so after its termination) is missing from the answer.
func ByID(ctx context.Context, c EC2, ids []string) (map[string]Instance, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	found := map[string]Instance{}
	for chunk := range slices.Chunk(ids, 200) {
		list, err := Describe(ctx, c, Filter{"instance-id", chunk})
		if err != nil {
			return nil, err
		}
		maps.Copy(found, byID(list))
	}
	return found, nil
}

func byID(list []Instance) map[string]Instance {
	m := make(map[string]Instance, len(list))
	for _, i := range list {
		m[i.ID] = i
	}
	return m
}

// Endpoints override the services' endpoints (tests and e2e point them at fakes or moto); "" is the region's.
type Endpoints struct {
	EC2, SSM, AutoScaling string
}

// Clients are the controller's AWS clients.
type Clients struct {
	EC2         EC2
	SSM         SSM
	AutoScaling AutoScaling
}

// NewClients are the SDK's clients for the region, with the credentials of the SDK's default chain (in the pod:
// the IAM user's key from the environment, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), and for SSM ssmCreds when
// not nil (the one key the join token's KMS key policy lets encrypt). The SDK resolves each service's endpoint for
// the region's partition (aws, aws-cn, aws-us-gov), so no host name is written here.
func NewClients(ctx context.Context, region string, ep Endpoints, ssmCreds aws.CredentialsProvider) (Clients, error) {
	if region == "" {
		return Clients{}, errors.New("no AWS region")
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(region),
		awsconfig.WithRetryer(func() aws.Retryer { return retry.AddWithMaxAttempts(retry.NewStandard(), 3) }))
	if err != nil {
		return Clients{}, fmt.Errorf("AWS configuration: %w", err)
	}
	e := ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if ep.EC2 != "" {
			o.BaseEndpoint = aws.String(ep.EC2)
		}
	})
	s := ssm.NewFromConfig(cfg, func(o *ssm.Options) {
		if ssmCreds != nil {
			o.Credentials = ssmCreds
		}
		if ep.SSM != "" {
			o.BaseEndpoint = aws.String(ep.SSM)
		}
	})
	a := autoscaling.NewFromConfig(cfg, func(o *autoscaling.Options) {
		if ep.AutoScaling != "" {
			o.BaseEndpoint = aws.String(ep.AutoScaling)
		}
	})
	return Clients{EC2: e, SSM: s, AutoScaling: a}, nil
}

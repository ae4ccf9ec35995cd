package explain

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra/config"
)

// fakeGroups answers as the Auto Scaling API would for the stack's groups; it applies the tag-key filter.
type fakeGroups struct {
	groups     []types.AutoScalingGroup
	activities map[string][]types.Activity
	failOn     string
	filters    [][]types.Filter
}

func (f *fakeGroups) DescribeAutoScalingGroups(_ context.Context, in *autoscaling.DescribeAutoScalingGroupsInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error) {
	f.filters = append(f.filters, in.Filters)
	var out []types.AutoScalingGroup
	for _, g := range f.groups {
		for _, t := range g.Tags {
			if len(in.Filters) == 1 && aws.ToString(t.Key) == in.Filters[0].Values[0] {
				out = append(out, g)
			}
		}
	}
	return &autoscaling.DescribeAutoScalingGroupsOutput{AutoScalingGroups: out}, nil
}

func (f *fakeGroups) DescribeScalingActivities(_ context.Context, in *autoscaling.DescribeScalingActivitiesInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.DescribeScalingActivitiesOutput, error) {
	name := aws.ToString(in.AutoScalingGroupName)
	if name == f.failOn {
		return nil, errors.New("AccessDenied")
	}
	if aws.ToInt32(in.MaxRecords) != 1 {
		return nil, errors.New("want MaxRecords 1: the latest activity only")
	}
	return &autoscaling.DescribeScalingActivitiesOutput{Activities: f.activities[name]}, nil
}

func group(name, cluster, pool string, desired int32) types.AutoScalingGroup {
	return types.AutoScalingGroup{AutoScalingGroupName: aws.String(name), DesiredCapacity: aws.Int32(desired),
		MinSize: aws.Int32(0), MaxSize: aws.Int32(4), Tags: []types.TagDescription{
			{Key: aws.String(config.AutoscalerClusterTag(cluster)), Value: aws.String("owned")},
			{Key: aws.String("dynk8s:pool"), Value: aws.String(pool)}}}
}

// TestGroupsViewShowsAWSsWord: each pool's group with its latest scaling activity, a failed spot launch with AWS's
// message; another cluster's group is not shown; a pool without a group says so.
func TestGroupsViewShowsAWSsWord(t *testing.T) {
	cfg, _ := devStack(t, func(map[string]any) {})
	start := time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)
	api := &fakeGroups{
		groups: []types.AutoScalingGroup{
			group("pool-builders-arm-asg", cfg.ClusterName, "builders-arm", 1),
			group("other-cluster-asg", "elsewhere", "builders-x86", 3),
		},
		activities: map[string][]types.Activity{"pool-builders-arm-asg": {{
			StatusCode: types.ScalingActivityStatusCodeFailed, StartTime: aws.Time(start),
			Description:   aws.String("Launching a new EC2 instance.  Status Reason: Could not launch Spot Instances."),
			StatusMessage: aws.String("InsufficientInstanceCapacity - There is no Spot capacity available that matches your request."),
		}}},
	}
	var out bytes.Buffer
	assert.NilError(t, GroupsView(context.Background(), api, cfg, &out))
	assert.Check(t, is.Equal(out.String(), ""+
		"aws: pool builders-x86: no Auto Scaling group tagged for cluster homelab in eu-central-1\n"+
		"aws: pool builders-arm: group pool-builders-arm-asg, desired 1 (min 0, max 4), 0 instance(s)\n"+
		"  last scaling activity: Failed at 2026-12-01T17:00:00Z: Launching a new EC2 instance.  Status Reason: "+
		"Could not launch Spot Instances. (InsufficientInstanceCapacity - There is no Spot capacity available that "+
		"matches your request.)\n"))
	assert.Check(t, is.Len(api.filters, 1))
}

// TestGroupsViewReportsAPIErrors: a refused call is an error naming the group, and the other pools still print.
func TestGroupsViewReportsAPIErrors(t *testing.T) {
	cfg, _ := devStack(t, func(map[string]any) {})
	api := &fakeGroups{
		groups: []types.AutoScalingGroup{group("x86-asg", cfg.ClusterName, "builders-x86", 0),
			group("arm-asg", cfg.ClusterName, "builders-arm", 0)},
		failOn: "x86-asg",
	}
	var out bytes.Buffer
	err := GroupsView(context.Background(), api, cfg, &out)
	assert.Check(t, is.ErrorContains(err, "DescribeScalingActivities x86-asg: AccessDenied"))
	assert.Check(t, is.Contains(out.String(), "aws: pool builders-arm: group arm-asg, desired 0"))
	assert.Check(t, is.Contains(out.String(), "  last scaling activity: none\n"))
}

package explain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling/types"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/names"
)

// GroupsAPI is the part of the Auto Scaling API the AWS view reads (autoscaling.Client; a fake in tests).
type GroupsAPI interface {
	DescribeAutoScalingGroups(context.Context, *autoscaling.DescribeAutoScalingGroupsInput,
		...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
	DescribeScalingActivities(context.Context, *autoscaling.DescribeScalingActivitiesInput,
		...func(*autoscaling.Options)) (*autoscaling.DescribeScalingActivitiesOutput, error)
}

// GroupsView prints, for each of the stack's pools, its Auto Scaling group's desired capacity and instances and its
// latest scaling activity with AWS's own words on it: where a launch failed (no spot capacity, a quota, a bad
// launch template), the autoscaler's events only say that the group was raised. The groups are found by the tags
// the stack puts on them: the cluster's autoscaler tag and dynk8s:pool.
func GroupsView(ctx context.Context, api GroupsAPI, cfg *config.Config, out io.Writer) error {
	groups := map[string]types.AutoScalingGroup{}
	p := autoscaling.NewDescribeAutoScalingGroupsPaginator(api, &autoscaling.DescribeAutoScalingGroupsInput{
		Filters: []types.Filter{{Name: aws.String("tag-key"),
			Values: []string{config.AutoscalerClusterTag(cfg.ClusterName)}}}})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("DescribeAutoScalingGroups: %w", err)
		}
		for _, g := range page.AutoScalingGroups {
			if pool := tagValue(g.Tags, names.TagPool); pool != "" {
				groups[pool] = g
			}
		}
	}
	var errs []error
	for _, pool := range cfg.NodePools {
		g, ok := groups[pool.Name]
		if !ok {
			fmt.Fprintf(out, "aws: pool %s: no Auto Scaling group tagged for cluster %s in %s\n", pool.Name,
				cfg.ClusterName, cfg.Region)
			continue
		}
		name := aws.ToString(g.AutoScalingGroupName)
		fmt.Fprintf(out, "aws: pool %s: group %s, desired %d (min %d, max %d), %d instance(s)\n", pool.Name, name,
			aws.ToInt32(g.DesiredCapacity), aws.ToInt32(g.MinSize), aws.ToInt32(g.MaxSize), len(g.Instances))
		acts, err := api.DescribeScalingActivities(ctx, &autoscaling.DescribeScalingActivitiesInput{
			AutoScalingGroupName: aws.String(name), MaxRecords: aws.Int32(1)})
		if err != nil {
			errs = append(errs, fmt.Errorf("DescribeScalingActivities %s: %w", name, err))
			continue
		}
		if len(acts.Activities) == 0 {
			fmt.Fprintln(out, "  last scaling activity: none")
			continue
		}
		fmt.Fprintf(out, "  last scaling activity: %s\n", activityLine(acts.Activities[0]))
	}
	return errors.Join(errs...)
}

// activityLine is one scaling activity as the console shows it: status, start, what, and AWS's message on a failure.
func activityLine(a types.Activity) string {
	line := fmt.Sprintf("%s at %s: %s", a.StatusCode, aws.ToTime(a.StartTime).UTC().Format(time.RFC3339),
		aws.ToString(a.Description))
	if msg := strings.TrimSpace(aws.ToString(a.StatusMessage)); msg != "" {
		line += " (" + msg + ")"
	}
	return line
}

func tagValue(tags []types.TagDescription, key string) string {
	i := slices.IndexFunc(tags, func(t types.TagDescription) bool { return aws.ToString(t.Key) == key })
	if i < 0 {
		return ""
	}
	return aws.ToString(tags[i].Value)
}

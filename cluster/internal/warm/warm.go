// Package warm is the controller's replacement of stale warm instances: when a `pulumi up` gives a pool's launch
// template a new version, the instances already in the pool's warm pool keep the user data they were launched with
// (EC2 Auto Scaling User Guide, "Update the instances in a warm pool"), and each would otherwise be found stale only
// when a scale-up takes it, after it has started and booted, to be handed back and the next one tried: N stale
// instances delay the first scale-up after the change about N times.
//
// Every Every, for each of the stack's groups with a warm pool, the loop reads the group's launch template version
// (DescribeAutoScalingGroups) and its warm instances (DescribeWarmPool), and terminates, in one
// ec2:TerminateInstances, the warm instances launched from an older version that have finished their preparation
// (Warmed:Stopped, Warmed:Running, Warmed:Hibernated; one still preparing is taken at a later round). The group
// launches their replacements into the warm pool from the current version. Auto Scaling's own
// TerminateInstanceInAutoScalingGroup cannot be called on a warm instance (its API reference), and an instance
// refresh replaces the group's in-service nodes first (the same guide), which run builds; EC2's terminate is what
// the guide's earlier edition describes ("Updating instances in a warm pool": Auto Scaling "immediately starts
// launching new instances to replace the instances that you terminated"). The node's own check at its entry into
// service stays, for a stale instance this loop has not reached yet.
//
// The versions are compared as numbers: the stack sets each group's template version, never $Latest or $Default; a
// group that names no version number is left alone.
package warm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	astypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/names"
)

// Name is the loop's name in logs and metrics.
const Name = "warm"

// DefaultEvery is how often each group is looked at by default: a stale warm instance is replaced within about a
// minute of the `pulumi up` that made it stale, for two free Describe calls per group a minute.
const DefaultEvery = time.Minute

// maxTerminate is the most instance ids one TerminateInstances takes (EC2 API reference: up to 1000).
const maxTerminate = 1000

// settled are the lifecycle states of a warm instance that has finished its preparation and waits in the pool
// (LifecycleState in the Auto Scaling API reference).
var settled = []astypes.LifecycleState{
	astypes.LifecycleStateWarmedStopped, astypes.LifecycleStateWarmedRunning, astypes.LifecycleStateWarmedHibernated,
}

// The replaced_total result label values.
const (
	// ResultTerminated: EC2 accepted the instance's termination.
	ResultTerminated = "terminated"
	// ResultFailed: EC2 refused it; the next round tries again.
	ResultFailed = "failed"
)

// Terminator is the EC2 call the loop makes.
type Terminator interface {
	TerminateInstances(ctx context.Context, in *ec2.TerminateInstancesInput, opts ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
}

// Config is the loop's configuration.
type Config struct {
	// Groups are the names of the stack's Auto Scaling groups that have a warm pool; required.
	Groups []string
	// Every is how often each group is looked at; default DefaultEvery.
	Every time.Duration
	// AutoScaling reads the groups and their warm pools; EC2 terminates the stale instances. Both required.
	AutoScaling cloud.AutoScaling
	EC2         Terminator
}

func (cfg *Config) validate() error {
	var errs []error
	if len(cfg.Groups) == 0 || slices.Contains(cfg.Groups, "") {
		errs = append(errs, fmt.Errorf("warm: Groups must name the stack's groups with a warm pool, got %q", cfg.Groups))
	}
	if cfg.AutoScaling == nil {
		errs = append(errs, errors.New("warm: AutoScaling is required"))
	}
	if cfg.EC2 == nil {
		errs = append(errs, errors.New("warm: EC2 is required"))
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Every < 0 {
		errs = append(errs, fmt.Errorf("warm: Every must not be negative, got %s", cfg.Every))
	}
	return errors.Join(errs...)
}

// Controller is the warm pools' loop.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	clock clock.WithTicker
	queue workqueue.TypedRateLimitingInterface[string]

	stale    *prometheus.GaugeVec
	replaced *prometheus.CounterVec
}

// New builds the loop from cfg and its metrics on d.Metrics.
func New(cfg Config, d loop.Deps) (*Controller, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Groups = slices.Compact(slices.Sorted(slices.Values(cfg.Groups)))
	c := &Controller{
		cfg:   cfg,
		log:   d.Log.With("loop", Name),
		clock: d.Clock,
		queue: loop.NewQueue(Name, d.Clock),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynk8s_controller_warm_stale_instances",
			Help: "Warm instances launched from an older launch template version than their group launches, " +
				"at the group's last look, by group.",
		}, []string{"group"}),
		replaced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynk8s_controller_warm_replaced_total",
			Help: "Stale warm instances terminated for their group to replace, by result: terminated, " +
				"failed (EC2 refused; tried again at the next look).",
		}, []string{"result"}),
	}
	for _, r := range []string{ResultTerminated, ResultFailed} {
		c.replaced.WithLabelValues(r)
	}
	for _, g := range cfg.Groups {
		c.stale.WithLabelValues(g)
	}
	for _, m := range []prometheus.Collector{c.stale, c.replaced} {
		if err := d.Metrics.Register(m); err != nil {
			return nil, fmt.Errorf("warm: registering metrics: %w", err)
		}
	}
	return c, nil
}

// Name is the loop's name.
func (c *Controller) Name() string { return Name }

// Run looks at every group at once, then each again every Every, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.log.Info("started", "groups", strings.Join(c.cfg.Groups, ","), "every", c.cfg.Every.String())
	for _, g := range c.cfg.Groups {
		c.queue.Add(g)
	}
	loop.Work(ctx, c.log, c.queue, 1, c.sync)
	return nil
}

// sync is one look at group; whatever it finds, the group is looked at again in Every (a refusal is not retried
// sooner: the API limits are shared with the autoscaler).
func (c *Controller) sync(ctx context.Context, group string) error {
	if err := c.Replace(ctx, group); err != nil {
		c.log.Warn("cannot replace the group's stale warm instances: trying again", "group", group,
			"error", err.Error(), "in", c.cfg.Every.String())
	}
	return loop.Requeue{After: c.cfg.Every}
}

// Replace terminates group's stale warm instances that have finished their preparation.
func (c *Controller) Replace(ctx context.Context, group string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	current, warm, err := c.group(ctx, group)
	if err != nil || !warm {
		return err
	}
	instances, err := c.warmPool(ctx, group)
	if err != nil {
		return err
	}
	var stale, ready []string
	versions := map[string]int{}
	for _, i := range instances {
		version := ""
		if i.LaunchTemplate != nil {
			version = aws.ToString(i.LaunchTemplate.Version)
		}
		if !names.OlderTemplateVersion(version, current) {
			continue
		}
		stale = append(stale, aws.ToString(i.InstanceId))
		if slices.Contains(settled, i.LifecycleState) {
			ready = append(ready, aws.ToString(i.InstanceId))
			versions[version]++
		}
	}
	c.stale.WithLabelValues(group).Set(float64(len(stale)))
	if len(ready) == 0 {
		if len(stale) > 0 {
			c.log.Info("stale warm instances are still preparing: replacing them when they are done", "group", group,
				"instances", strings.Join(stale, ","), "version", current)
		}
		return nil
	}
	slices.Sort(ready)
	for chunk := range slices.Chunk(ready, maxTerminate) {
		if err := c.terminate(ctx, chunk); err != nil {
			c.replaced.WithLabelValues(ResultFailed).Add(float64(len(chunk)))
			return err
		}
		c.replaced.WithLabelValues(ResultTerminated).Add(float64(len(chunk)))
		c.log.Info("terminated stale warm instances: the group replaces them from the current launch template",
			"group", group, "instances", strings.Join(chunk, ","), "version", current,
			"from", versionList(versions))
	}
	return nil
}

// group is the launch template version group launches and whether it has a warm pool; a group that is gone or
// names no version number has nothing to compare with (current "").
func (c *Controller) group(ctx context.Context, group string) (current string, warm bool, err error) {
	out, err := c.cfg.AutoScaling.DescribeAutoScalingGroups(ctx, &autoscaling.DescribeAutoScalingGroupsInput{
		AutoScalingGroupNames: []string{group}})
	if err != nil {
		return "", false, fmt.Errorf("autoscaling:DescribeAutoScalingGroups %s: %w", group, err)
	}
	i := slices.IndexFunc(out.AutoScalingGroups, func(g astypes.AutoScalingGroup) bool {
		return aws.ToString(g.AutoScalingGroupName) == group
	})
	if i < 0 {
		return "", false, fmt.Errorf("no group %s", group)
	}
	g := out.AutoScalingGroups[i]
	if g.WarmPoolConfiguration == nil {
		return "", false, nil
	}
	if g.LaunchTemplate != nil {
		current = aws.ToString(g.LaunchTemplate.Version)
	}
	if !names.IsTemplateVersion(current) {
		return "", false, fmt.Errorf("the group launches launch template version %q, not a version number", current)
	}
	return current, true, nil
}

// warmPool is every instance of group's warm pool, over every page.
func (c *Controller) warmPool(ctx context.Context, group string) ([]astypes.Instance, error) {
	var all []astypes.Instance
	p := autoscaling.NewDescribeWarmPoolPaginator(c.cfg.AutoScaling,
		&autoscaling.DescribeWarmPoolInput{AutoScalingGroupName: aws.String(group)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("autoscaling:DescribeWarmPool %s: %w", group, err)
		}
		all = append(all, page.Instances...)
	}
	return all, nil
}

func (c *Controller) terminate(ctx context.Context, ids []string) error {
	if _, err := c.cfg.EC2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: ids}); err != nil {
		return fmt.Errorf("ec2:TerminateInstances %s: %w", strings.Join(ids, ","), err)
	}
	return nil
}

// versionList is "3 (2), 4 (1)": the older versions the terminated instances were launched from, with how many.
func versionList(versions map[string]int) string {
	var parts []string
	for v, n := range versions {
		parts = append(parts, fmt.Sprintf("%s (%d)", v, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// Package caches is the controller's keeper of the pools' build cache volumes (the node agent's node/internal/cache
// attaches them): they outlive the nodes, so something must delete those nobody will use, and bill no longer.
//
// Every Every, the loop lists the cluster's cache volumes (tags dynk8s:cluster and dynk8s:cache, the pool's name),
// marks those in use with the time it saw them so (names.TagCacheUsed), and deletes, of those available (attached to
// nothing):
//   - a volume of a pool that keeps no cache (the pool is gone, or its cache is turned off);
//   - a volume unused for longer than its pool's most idle time, counted from its mark, or from its creation when it
//     has none;
//   - the least recently used beyond the pool's most volumes, which a lower maxVolumes leaves.
//
// It never deletes an attached volume: EC2 refuses it (VolumeInUse), which is what happens when a node attaches one
// between the list and the delete, and the next round looks again.
package caches

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/names"
)

// Name is the loop's name in logs and metrics.
const Name = "cache"

// DefaultEvery is how often the volumes are looked at by default: a day's idle limit is kept within minutes, for a
// Describe call (and rarely a CreateTags or a DeleteVolume) every ten.
const DefaultEvery = 10 * time.Minute

// markAgain is how old a volume's mark may grow while it stays in use before the loop writes it again: a mark to the
// hour is enough for idle limits in days, and spares a CreateTags every round.
const markAgain = time.Hour

// maxResources is the most resource ids one CreateTags takes (EC2 API reference: up to 1000).
const maxResources = 1000

// The deleted_total reason label values.
const (
	ReasonNoPool = "no-pool"
	ReasonIdle   = "idle"
	ReasonMost   = "beyond-most"
	// ReasonRefused: EC2 refused the delete (a node attached the volume meanwhile, or the API said no).
	ReasonRefused = "refused"
)

// Volumes is the EC2 calls the loop makes.
type Volumes interface {
	ec2.DescribeVolumesAPIClient
	DeleteVolume(context.Context, *ec2.DeleteVolumeInput, ...func(*ec2.Options)) (*ec2.DeleteVolumeOutput, error)
	CreateTags(context.Context, *ec2.CreateTagsInput, ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
}

// Pool is what a pool keeps: at most Max volumes, none unused for longer than MaxIdle.
type Pool struct {
	Max     int
	MaxIdle time.Duration
}

// ParsePools reads --cache-pools: "POOL:MAX:IDLE_DAYS" by commas, e.g. "builders:4:14".
func ParsePools(s string) (map[string]Pool, error) {
	pools := map[string]Pool{}
	if s == "" {
		return pools, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		f := strings.Split(item, ":")
		if len(f) != 3 || f[0] == "" {
			return nil, fmt.Errorf("%q is not POOL:MAX:IDLE_DAYS", item)
		}
		most, err := strconv.Atoi(f[1])
		if err != nil || most < 1 {
			return nil, fmt.Errorf("%q: the most volumes is a positive number", item)
		}
		days, err := strconv.Atoi(f[2])
		if err != nil || days < 1 {
			return nil, fmt.Errorf("%q: the idle days are a positive number", item)
		}
		if _, dup := pools[f[0]]; dup {
			return nil, fmt.Errorf("pool %s is named twice", f[0])
		}
		pools[f[0]] = Pool{Max: most, MaxIdle: time.Duration(days) * 24 * time.Hour}
	}
	return pools, nil
}

// Config is the loop's configuration.
type Config struct {
	// Cluster is the stack's cluster name; required.
	Cluster string
	// Pools are the pools that keep a cache, by name; a volume of any other pool is deleted once available.
	Pools map[string]Pool
	// Every is how often the volumes are looked at; default DefaultEvery.
	Every time.Duration
	// EC2 lists, marks and deletes the volumes; required.
	EC2 Volumes
}

func (cfg *Config) validate() error {
	var errs []error
	if cfg.Cluster == "" {
		errs = append(errs, errors.New("cache: Cluster is required"))
	}
	if cfg.EC2 == nil {
		errs = append(errs, errors.New("cache: EC2 is required"))
	}
	for name, p := range cfg.Pools {
		if name == "" || p.Max < 1 || p.MaxIdle <= 0 {
			errs = append(errs, fmt.Errorf("cache: pool %q needs a positive most and idle time, got %+v", name, p))
		}
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Every < 0 {
		errs = append(errs, fmt.Errorf("cache: Every must not be negative, got %s", cfg.Every))
	}
	return errors.Join(errs...)
}

// Controller is the cache volumes' loop.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	clock clock.WithTicker
	queue workqueue.TypedRateLimitingInterface[string]

	volumes *prometheus.GaugeVec
	deleted *prometheus.CounterVec
}

// New builds the loop from cfg and its metrics on d.Metrics.
func New(cfg Config, d loop.Deps) (*Controller, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:   cfg,
		log:   d.Log.With("loop", Name),
		clock: d.Clock,
		queue: loop.NewQueue(Name, d.Clock),
		volumes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynk8s_controller_cache_volumes",
			Help: "The cluster's build cache volumes at the last look, by pool and state (in-use, available).",
		}, []string{"pool", "state"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynk8s_controller_cache_deleted_total",
			Help: "Cache volumes deleted, by reason: no-pool, idle, beyond-most; refused: EC2 refused the delete.",
		}, []string{"reason"}),
	}
	for _, r := range []string{ReasonNoPool, ReasonIdle, ReasonMost, ReasonRefused} {
		c.deleted.WithLabelValues(r)
	}
	for _, m := range []prometheus.Collector{c.volumes, c.deleted} {
		if err := d.Metrics.Register(m); err != nil {
			return nil, fmt.Errorf("cache: registering metrics: %w", err)
		}
	}
	return c, nil
}

// Name is the loop's name.
func (c *Controller) Name() string { return Name }

// Run looks at the volumes at once, then every Every, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.log.Info("started", "cluster", c.cfg.Cluster, "pools", poolList(c.cfg.Pools), "every", c.cfg.Every.String())
	c.queue.Add(c.cfg.Cluster)
	loop.Work(ctx, c.log, c.queue, 1, func(ctx context.Context, _ string) error {
		if err := c.Keep(ctx); err != nil {
			c.log.Warn("cannot keep the cache volumes in order: trying again", "error", err.Error(),
				"in", c.cfg.Every.String())
		}
		return loop.Requeue{After: c.cfg.Every}
	})
	return nil
}

// volume is a cache volume as the loop judges it.
type volume struct {
	id, pool string
	inUse    bool
	used     time.Time // its mark, or its creation
	marked   bool
}

// Keep is one look: it marks the volumes in use and deletes those nobody will use.
func (c *Controller) Keep(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	all, err := c.list(ctx)
	if err != nil {
		return err
	}
	now := c.clock.Now()
	if err := c.mark(ctx, all, now); err != nil {
		return err
	}
	c.count(all)
	byPool := map[string][]volume{}
	var errs []error
	for _, v := range all {
		p, keeps := c.cfg.Pools[v.pool]
		switch {
		case v.inUse:
			byPool[v.pool] = append(byPool[v.pool], v)
		case !keeps:
			errs = append(errs, c.delete(ctx, v, ReasonNoPool, "its pool keeps no cache"))
		case now.Sub(v.used) > p.MaxIdle:
			errs = append(errs, c.delete(ctx, v, ReasonIdle, fmt.Sprintf("unused for %s, over the pool's %s",
				now.Sub(v.used).Round(time.Hour), p.MaxIdle)))
		default:
			byPool[v.pool] = append(byPool[v.pool], v)
		}
	}
	for _, pool := range slices.Sorted(maps.Keys(byPool)) {
		vols, p := byPool[pool], c.cfg.Pools[pool]
		// The least recently used first; those in use are never taken, so a pool over its most only by volumes in
		// use keeps them until they are detached.
		slices.SortFunc(vols, func(a, b volume) int { return a.used.Compare(b.used) })
		excess := len(vols) - p.Max
		for _, v := range vols {
			if excess <= 0 {
				break
			}
			if v.inUse {
				continue
			}
			errs = append(errs, c.delete(ctx, v, ReasonMost, fmt.Sprintf("the pool keeps %d at most, and has %d",
				p.Max, len(vols))))
			excess--
		}
	}
	return errors.Join(errs...)
}

// list is the cluster's cache volumes, over every page.
func (c *Controller) list(ctx context.Context) ([]volume, error) {
	var out []volume
	pages := ec2.NewDescribeVolumesPaginator(c.cfg.EC2, &ec2.DescribeVolumesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag:" + names.TagCluster), Values: []string{c.cfg.Cluster}},
		{Name: aws.String("tag-key"), Values: []string{names.TagCache}},
	}})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("ec2:DescribeVolumes: %w", err)
		}
		for _, v := range page.Volumes {
			vol := volume{id: aws.ToString(v.VolumeId), used: aws.ToTime(v.CreateTime),
				inUse: v.State == ec2types.VolumeStateInUse || len(v.Attachments) > 0}
			for _, t := range v.Tags {
				switch aws.ToString(t.Key) {
				case names.TagCache:
					vol.pool = aws.ToString(t.Value)
				case names.TagCacheUsed:
					if at, err := time.Parse(time.RFC3339, aws.ToString(t.Value)); err == nil && at.After(vol.used) {
						vol.used, vol.marked = at, true
					}
				}
			}
			out = append(out, vol)
		}
	}
	return out, nil
}

// mark writes now on the volumes in use whose mark is older than markAgain, in as few calls as it can.
func (c *Controller) mark(ctx context.Context, all []volume, now time.Time) error {
	var ids []string
	for i := range all {
		if all[i].inUse && (!all[i].marked || now.Sub(all[i].used) > markAgain) {
			ids = append(ids, all[i].id)
			all[i].used, all[i].marked = now, true
		}
	}
	stamp := now.UTC().Format(time.RFC3339)
	for chunk := range slices.Chunk(ids, maxResources) {
		if _, err := c.cfg.EC2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: chunk,
			Tags: []ec2types.Tag{{Key: aws.String(names.TagCacheUsed), Value: aws.String(stamp)}}}); err != nil {
			return fmt.Errorf("ec2:CreateTags %s on %s: %w", names.TagCacheUsed, strings.Join(chunk, ","), err)
		}
	}
	return nil
}

func (c *Controller) count(all []volume) {
	c.volumes.Reset()
	for _, v := range all {
		state := "available"
		if v.inUse {
			state = "in-use"
		}
		c.volumes.WithLabelValues(v.pool, state).Inc()
	}
}

func (c *Controller) delete(ctx context.Context, v volume, reason, why string) error {
	if _, err := c.cfg.EC2.DeleteVolume(ctx, &ec2.DeleteVolumeInput{VolumeId: aws.String(v.id)}); err != nil {
		c.deleted.WithLabelValues(ReasonRefused).Inc()
		return fmt.Errorf("ec2:DeleteVolume %s (pool %s, %s): %w", v.id, v.pool, why, err)
	}
	c.deleted.WithLabelValues(reason).Inc()
	c.log.Info("deleted a cache volume", "volume", v.id, "pool", v.pool, "reason", reason, "why", why,
		"used", v.used.UTC().Format(time.RFC3339))
	return nil
}

func poolList(pools map[string]Pool) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(pools)) {
		p := pools[name]
		parts = append(parts, fmt.Sprintf("%s:%d:%s", name, p.Max, p.MaxIdle))
	}
	return strings.Join(parts, ",")
}

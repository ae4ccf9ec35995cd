// Package untaint is the controller's fuse startup-taint removal: a pool Node registers with the fuse startup taint,
// and once the fuse device plugin has made it advertise the fuse resource the loop removes that taint, and nothing
// else. Until then the Cluster Autoscaler counts the Node as still starting (a taint with its startup-taint prefix,
// kubernetes/autoscaler cluster-autoscaler/utils/taints/taints.go at cluster-autoscaler-1.34.5), not as a Node that
// lacks what the pending pods request, and adds no other node for them.
//
// A plugin that never advertises (an image that cannot be pulled, say) must not keep every other pod off the Node:
// Config.GiveUp after the Node's creation (or the taint's timeAdded, when whoever added it wrote one) the taint goes
// anyway, with a Warning Event.
//
// The only write is an Update of the Node: the cached copy minus the taint, with its resourceVersion, so that an
// admission policy can hold the loop to removing that one taint (the object sent is the old one minus it); a
// conflict re-reads the Node and judges it again.
package untaint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// Name is the loop's name in logs and metrics.
const Name = "untaint"

// DefaultGiveUp is Config.GiveUp's default: five minutes, the old untaint container's GIVE_UP_SECONDS, well past
// the plugin's start on a node that pulled its image at boot, short enough that a broken plugin costs a scale-up
// little.
const DefaultGiveUp = 5 * time.Minute

// workers is how many Nodes the loop updates at once: each sync is one Update, so two keep up with a burst.
const workers = 2

// The untaint_total outcome label values.
const (
	// OutcomeAdvertised: the Node advertised the resource, the taint was removed.
	OutcomeAdvertised = "advertised"
	// OutcomeGaveUp: the Node did not advertise it within GiveUp, the taint was removed anyway.
	OutcomeGaveUp = "gave_up"
)

// ReasonGaveUp is the reason of the Warning Event on a Node whose taint was removed without the resource.
const ReasonGaveUp = "FuseNotAdvertised"

// latencyBuckets are the untaint latency histogram's buckets, in seconds: from a Node that comes up with the plugin
// ready (a few seconds after registering) to one that waits out the give-up time, and a little past it.
var latencyBuckets = []float64{5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300, 360, 480, 600}

// Config is the loop's configuration.
type Config struct {
	// PoolLabel is the label key every dynk8s pool node carries (kube.LabelPool); required. Other Nodes are never
	// updated.
	PoolLabel string
	// TaintKey is the startup taint's key (kube.FuseStartupTaint.Key); required. Every taint with this key goes.
	TaintKey string
	// Resource is the extended resource whose allocatable count lifts the taint (kube.FuseResource); required.
	Resource string
	// GiveUp is how long after the Node's creation the taint goes without the resource; optional, default
	// DefaultGiveUp.
	GiveUp time.Duration
}

// validate checks cfg and fills in its defaults; an error names the field.
func (cfg *Config) validate() error {
	var errs []error
	for _, f := range []struct{ field, value string }{
		{"PoolLabel", cfg.PoolLabel}, {"TaintKey", cfg.TaintKey}, {"Resource", cfg.Resource},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("untaint: %s is required", f.field))
		} else if problems := validation.IsQualifiedName(f.value); len(problems) > 0 {
			errs = append(errs, fmt.Errorf("untaint: %s %q is not a qualified name: %v", f.field, f.value, problems))
		}
	}
	switch {
	case cfg.GiveUp == 0:
		cfg.GiveUp = DefaultGiveUp
	case cfg.GiveUp < 0:
		errs = append(errs, fmt.Errorf("untaint: GiveUp must not be negative, got %s", cfg.GiveUp))
	}
	return errors.Join(errs...)
}

// Controller is the untaint loop.
type Controller struct {
	cfg    Config
	client kubernetes.Interface
	*loop.NodeWatch
	recorder record.EventRecorder
	log      *slog.Logger
	clock    clock.WithTicker

	latency prometheus.Histogram
	total   *prometheus.CounterVec
}

// New builds the untaint loop from cfg and d: it registers its handler on d.Informers' Node informer and its
// metrics on d.Metrics.
func New(cfg Config, d loop.Deps) (*Controller, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:      cfg,
		client:   d.Client,
		recorder: d.Recorder,
		log:      d.Log.With("loop", Name),
		clock:    d.Clock,
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dynk8s_controller_untaint_latency_seconds",
			Help:    "Time from a pool Node's creation to the removal of its fuse startup taint.",
			Buckets: latencyBuckets,
		}),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynk8s_controller_untaint_total",
			Help: "Fuse startup taints removed, by outcome: advertised (the Node offered the resource) or " +
				"gave_up (it did not within the give-up time).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{OutcomeAdvertised, OutcomeGaveUp} {
		c.total.WithLabelValues(o)
	}
	for _, m := range []prometheus.Collector{c.latency, c.total} {
		if err := d.Metrics.Register(m); err != nil {
			return nil, fmt.Errorf("untaint: registering metrics: %w", err)
		}
	}
	w, err := loop.WatchNodes(Name, d, c.ours)
	if err != nil {
		return nil, err
	}
	c.NodeWatch = w
	return c, nil
}

// ours says whether n is a pool Node that carries the taint.
func (c *Controller) ours(n *corev1.Node) bool {
	_, pool := n.Labels[c.cfg.PoolLabel]
	return pool && c.taint(n) != nil
}

// taint is n's first taint with the key, nil when it has none.
func (c *Controller) taint(n *corev1.Node) *corev1.Taint {
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == c.cfg.TaintKey {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// Name is the loop's name.
func (c *Controller) Name() string { return Name }

// Run starts the informers, waits for the Node cache and removes taints until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	return c.NodeWatch.Run(ctx, c.log, workers, c.sync, "taint", c.cfg.TaintKey, "resource", c.cfg.Resource,
		"giveUp", c.cfg.GiveUp.String())
}

// sync judges the Node of key from the cache and, when its taint is due to go, removes it; a conflict re-reads the
// Node from the API server and judges it again.
func (c *Controller) sync(ctx context.Context, key string) error {
	node, err := c.Nodes.Get(key)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("node %s: reading the cache: %w", key, err)
	}
	var wait time.Duration
	first := true
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			fresh, err := c.client.CoreV1().Nodes().Get(ctx, key, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("reading the node again: %w", err)
			}
			node = fresh
		}
		first = false
		var err error
		wait, err = c.untaint(ctx, node)
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("node %s: removing the %s taint: %w", key, c.cfg.TaintKey, err)
	case wait > 0:
		return loop.Requeue{After: wait}
	}
	return nil
}

// untaint removes node's taint when it is due: at once when the Node advertises the resource, at the give-up
// deadline otherwise; until then it returns the time left. A conflict is returned as is, for RetryOnConflict.
func (c *Controller) untaint(ctx context.Context, node *corev1.Node) (time.Duration, error) {
	if !c.ours(node) {
		return 0, nil
	}
	now := c.clock.Now()
	outcome, have := OutcomeAdvertised, node.Status.Allocatable[corev1.ResourceName(c.cfg.Resource)]
	if have.Sign() <= 0 {
		deadline := c.since(node).Add(c.cfg.GiveUp)
		if now.Before(deadline) {
			c.log.Debug("keep", "node", node.Name, "reason", "no "+c.cfg.Resource+" yet", "giveUpAt",
				deadline.UTC().Format(time.RFC3339))
			return deadline.Sub(now), nil
		}
		outcome = OutcomeGaveUp
	}
	if _, err := c.client.CoreV1().Nodes().Update(ctx, c.without(node), metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	latency := now.Sub(node.CreationTimestamp.Time)
	c.latency.Observe(latency.Seconds())
	c.total.WithLabelValues(outcome).Inc()
	if outcome == OutcomeGaveUp {
		c.log.Warn("removed the startup taint without the resource", "node", node.Name, "taint", c.cfg.TaintKey,
			"resource", c.cfg.Resource, "after", latency.Round(time.Second).String())
		c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonGaveUp,
			"node advertises no %s after %s (is the device plugin running?): removed the startup taint %s so that "+
				"other pods can run", c.cfg.Resource, c.cfg.GiveUp, c.cfg.TaintKey)
		return 0, nil
	}
	c.log.Info("removed the startup taint", "node", node.Name, "taint", c.cfg.TaintKey, "resource", c.cfg.Resource,
		"have", have.String(), "after", latency.Round(time.Second).String())
	return 0, nil
}

// since is when the give-up time starts: the taint's timeAdded when set (k8s.io/api core/v1 types.go at v0.34,
// Taint.TimeAdded, written by whoever adds the taint; a kubelet registers its Node's taints without it), else the
// Node's creation.
func (c *Controller) since(node *corev1.Node) time.Time {
	if t := c.taint(node); t != nil && t.TimeAdded != nil && !t.TimeAdded.IsZero() {
		return t.TimeAdded.Time
	}
	return node.CreationTimestamp.Time
}

// without is a copy of node with every taint of the key gone and nothing else changed, resourceVersion included: the
// Update that an admission policy allowing only this taint's removal admits, and that conflicts when the Node
// changed since it was read.
func (c *Controller) without(node *corev1.Node) *corev1.Node {
	out := node.DeepCopy()
	out.Spec.Taints = slices.DeleteFunc(out.Spec.Taints, func(t corev1.Taint) bool { return t.Key == c.cfg.TaintKey })
	if len(out.Spec.Taints) == 0 {
		out.Spec.Taints = nil
	}
	return out
}

// Package cleanup is the controller's stale Node cleanup: it deletes the Node of a pool instance that EC2 says is
// gone, so that Nodes the Cluster Autoscaler left behind do not count towards its unready limits (above 45% unready
// it stops acting) and clutter the cluster.
//
// The Cluster Autoscaler terminates instances but never deletes their Node objects, and an on-prem cluster has no
// cloud controller manager whose node lifecycle controller would (k8s.io/cloud-provider
// controllers/nodelifecycle/node_lifecycle_controller.go at v1.34 deletes a Node once its cloud says the instance
// no longer exists). This loop is that part of it, held to the rules of the CronJob it replaces: a Node is deleted
// only when all of these hold:
//   - it carries the pool label, and its providerID is an AWS one, aws:///<zone>/<instance id>, so an on-prem node
//     is never touched even if someone labels it;
//   - that zone is in the region whose EC2 the loop asks (another region's EC2 would not know the instance, and the
//     Node of a live instance would look gone);
//   - its Ready condition is False or Unknown (a Node with no Ready condition yet is left alone);
//   - that condition last changed more than Config.NotReadyAfter ago;
//   - and EC2 says the instance is gone: DescribeInstances answers shutting-down or terminated, or no longer knows
//     the instance id (about an hour after its termination).
//
// The Node of an instance that still exists (pending, running, stopping, stopped) is never deleted, however long it
// has been NotReady: a tunnel outage makes every node NotReady, and a kubelet does not re-create its Node once it
// has registered (kubernetes/kubernetes#71398), so deleting it would strand a live instance. When EC2 cannot be
// asked, the Node is kept.
//
// The loop is driven by the Node informer, with no polling: a NotReady pool Node is looked at again when it comes
// due, and then every Recheck while its instance exists; a Ready Node costs no EC2 call, and the Nodes that come due
// together share one DescribeInstances.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// Name is the loop's name in logs and metrics.
const Name = "cleanup"

// Recheck is how often a due Node whose instance still exists is asked about again while it stays NotReady: an
// instance the autoscaler terminates goes shutting-down within seconds, so a few minutes is what a stale Node costs at
// most, and a long tunnel outage costs one DescribeInstances per NotReady Node per Recheck.
const Recheck = 5 * time.Minute

// defaultWorkers is how many Nodes are judged at once when Config.Workers is 0.
const defaultWorkers = 2

// The errors_total op label values: what failed.
const (
	// opDescribe is an ec2:DescribeInstances call that failed; the Node is kept and asked about again, rate-limited.
	opDescribe = "describe"
	// opDelete is a Node delete the API server refused (other than for a Node that changed or is gone).
	opDelete = "delete"
	// opJudge is a pool Node with an AWS providerID that cannot be judged: the providerID names no instance, or the
	// Ready condition has no lastTransitionTime.
	opJudge = "judge"
)

// Event reasons on the Node.
const (
	// ReasonDeleting is the Normal Event recorded just before the Node is deleted, saying why.
	ReasonDeleting = "DeletingStaleNode"
	// ReasonEC2Failed is the Warning Event of a Node whose instance EC2 could not be asked about: it is kept.
	ReasonEC2Failed = "StaleNodeCheckFailed"
	// ReasonUnjudgeable is the Warning Event of a pool Node the rules cannot read (see opJudge).
	ReasonUnjudgeable = "StaleNodeUnjudgeable"
)

// Config is the cleanup's configuration.
type Config struct {
	// PoolLabel is the label key every dynk8s pool node carries (kube.LabelPool); required. Only Nodes with it are
	// ever deleted.
	PoolLabel string
	// Region is the AWS region whose EC2 is asked (EC2's region); required. Nodes of other regions' zones are left
	// alone.
	Region string
	// NotReadyAfter is how long a Node's Ready condition must have been False or Unknown before EC2 is asked about
	// its instance; required, positive (config cleanup.notReadyAfter).
	NotReadyAfter time.Duration
	// Workers is how many Nodes are judged at once; optional, default 2.
	Workers int
	// EC2 answers DescribeInstances for Region; required.
	EC2 cloud.EC2
}

// validate checks cfg and fills in its defaults; an error names the field.
func (cfg *Config) validate() error {
	var errs []error
	if cfg.PoolLabel == "" {
		errs = append(errs, errors.New("cleanup: PoolLabel is required"))
	} else if problems := validation.IsQualifiedName(cfg.PoolLabel); len(problems) > 0 {
		errs = append(errs, fmt.Errorf("cleanup: PoolLabel %q is not a label key: %v", cfg.PoolLabel, problems))
	}
	if cfg.Region == "" {
		errs = append(errs, errors.New("cleanup: Region is required"))
	}
	if cfg.NotReadyAfter <= 0 {
		errs = append(errs, fmt.Errorf("cleanup: NotReadyAfter must be positive, got %s", cfg.NotReadyAfter))
	}
	switch {
	case cfg.Workers == 0:
		cfg.Workers = defaultWorkers
	case cfg.Workers < 0:
		errs = append(errs, fmt.Errorf("cleanup: Workers must not be negative, got %d", cfg.Workers))
	}
	if cfg.EC2 == nil {
		errs = append(errs, errors.New("cleanup: EC2 is required"))
	}
	return errors.Join(errs...)
}

// Controller is the cleanup loop.
type Controller struct {
	cfg    Config
	client kubernetes.Interface
	*loop.NodeWatch
	recorder record.EventRecorder
	log      *slog.Logger
	clock    clock.WithTicker

	// answers is the last DescribeInstances answer, shared by the Nodes that come due together.
	answers answers

	deleted prometheus.Counter
	errors  *prometheus.CounterVec
}

// New builds the cleanup loop from cfg and d: it registers its handler on d.Informers' Node informer and its
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
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynk8s_controller_cleanup_deleted_total",
			Help: "Nodes of gone pool instances the cleanup deleted.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynk8s_controller_cleanup_errors_total",
			Help: "Failures of the cleanup by operation: describe (ec2:DescribeInstances), delete (the Node), " +
				"judge (a pool Node the rules cannot read).",
		}, []string{"op"}),
	}
	// Every op is exported from the start, at zero, so that an alert on its rate needs no absent().
	for _, op := range []string{opDescribe, opDelete, opJudge} {
		c.errors.WithLabelValues(op)
	}
	for _, m := range []prometheus.Collector{c.deleted, c.errors} {
		if err := d.Metrics.Register(m); err != nil {
			return nil, fmt.Errorf("cleanup: registering metrics: %w", err)
		}
	}
	w, err := loop.WatchNodes(Name, d, func(n *corev1.Node) bool {
		_, pool := n.Labels[cfg.PoolLabel]
		return pool // other Nodes are never the cleanup's
	})
	if err != nil {
		return nil, err
	}
	c.NodeWatch = w
	return c, nil
}

// Name is the loop's name.
func (c *Controller) Name() string { return Name }

// Run starts the informers, waits for the Node cache and judges Nodes until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	return c.NodeWatch.Run(ctx, c.log, c.cfg.Workers, c.sync, "region", c.cfg.Region,
		"notReadyAfter", c.cfg.NotReadyAfter.String())
}

// sync judges the Node of key: it does nothing, waits for the Node to come due, asks EC2, or deletes the Node.
func (c *Controller) sync(ctx context.Context, key string) error {
	node, err := c.Nodes.Get(key)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("node %s: reading the cache: %w", key, err)
	}
	now := c.clock.Now()
	j, err := judge(c.cfg, node, now)
	if err != nil {
		// Asking again changes nothing; the Node's next update brings it back.
		c.errors.WithLabelValues(opJudge).Inc()
		c.log.Warn("cannot judge", "node", node.Name, "error", err.Error())
		c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonUnjudgeable,
			"stale node cleanup cannot judge this node: %v", err)
		return nil
	}
	switch j.verdict {
	case skip:
		c.log.Debug("skip", "node", node.Name, "reason", j.reason)
		return nil
	case wait:
		c.log.Debug("keep", "node", node.Name, "reason", j.reason, "again", j.wait.String())
		return loop.Requeue{After: j.wait}
	}
	inst, known, err := c.state(ctx, j.instance, now)
	if err != nil {
		c.errors.WithLabelValues(opDescribe).Inc()
		c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonEC2Failed,
			"cannot ask EC2 about instance %s, keeping the node: %v", j.instance, err)
		return fmt.Errorf("node %s: asking EC2 about instance %s: %w", node.Name, j.instance, err)
	}
	state := "unknown to EC2"
	if known {
		if !inst.Gone() {
			c.log.Info("keep", "node", node.Name, "reason", j.reason, "instance", j.instance,
				"state", string(inst.State), "again", Recheck.String())
			return loop.Requeue{After: Recheck}
		}
		state = string(inst.State)
	}
	return c.delete(ctx, node, fmt.Sprintf("%s, and instance %s is %s", j.reason, j.instance, state))
}

// delete deletes node, the exact object judged: preconditions on its UID (a Node re-registered under the same name
// is another object) and its resourceVersion (a Node that changed since, Ready again say, is judged again when its
// update arrives). A Node that changed or is gone already is no failure.
func (c *Controller) delete(ctx context.Context, node *corev1.Node, why string) error {
	c.recorder.Eventf(node, corev1.EventTypeNormal, ReasonDeleting, "deleting the node of a gone instance: %s", why)
	c.log.Info("delete", "node", node.Name, "uid", string(node.UID), "reason", why)
	pre := &metav1.Preconditions{UID: &node.UID}
	if node.ResourceVersion != "" {
		pre.ResourceVersion = &node.ResourceVersion
	}
	err := c.client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{Preconditions: pre})
	switch {
	case err == nil:
		c.deleted.Inc()
		return nil
	case apierrors.IsNotFound(err):
		c.log.Info("gone already", "node", node.Name)
		return nil
	case apierrors.IsConflict(err):
		// The API server answers a failed precondition with 409 Conflict (k8s.io/apiserver at v0.34,
		// pkg/storage/errors/storage.go InterpretDeleteError); the informer brings the new object.
		c.log.Info("not deleted: the node changed since it was judged", "node", node.Name, "uid", string(node.UID),
			"error", err.Error())
		return nil
	}
	c.errors.WithLabelValues(opDelete).Inc()
	return fmt.Errorf("node %s: deleting: %w", node.Name, err)
}

// Package wake is the controller's early gateway wake-up: it starts the stack's sleeping WireGuard gateway as soon
// as the Cluster Autoscaler decides to raise one of the stack's Auto Scaling groups, so that on EC2 the gateway
// starts and boots beside the new node instead of after it (a pool node's own boot wakes the gateway too, first
// thing; that stays, as the fallback for a controller that is down or a decision this loop did not see).
//
// The decision is read from the autoscaler's status ConfigMap (kube-system/cluster-autoscaler-status, written at
// the end of every one of its loops, the loop that raised a group included: core/static_autoscaler.go RunOnce at
// cluster-autoscaler-1.34.5), watched by an informer on that one object: a group whose scaleUp status is
// InProgress has a scale-up under way (clusterstate.ClusterStateRegistry.IsNodeGroupScalingUp, registered by the
// scale-up's executor right after it set the group's size). Its events (ScaledUpGroup, TriggeredScaleUp) come a
// moment earlier but are best effort; the status is written every loop.
//
// Each group that turns InProgress wakes the gateway once: ec2:StartInstances of that one instance, which is
// idempotent on a running gateway. A gateway still stopping (its idle check just powered it off) refuses to start;
// the loop asks again every RetryEvery until RetryFor has passed since the decision. Starting a gateway that no node
// then needs costs its idle window (gateway.idleStop), after which its idle check stops it again.
package wake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/names"
)

// Name is the loop's name in logs and metrics.
const Name = "wake"

// The autoscaler's status ConfigMap: its default name (--status-config-map-name) and the key it writes the status
// to (utils/status.go WriteStatusConfigMap at cluster-autoscaler-1.34.5).
const (
	DefaultStatusName = "cluster-autoscaler-status"
	statusKey         = "status"
)

// scalingUp is the scaleUp status of a node group with a scale-up under way (clusterstate/api/types.go).
const scalingUp = "InProgress"

// Defaults of Config.RetryEvery and Config.RetryFor: a gateway that its idle check is powering off shows stopping
// for well under a minute on EC2; past two minutes the booting node's own wake-up is there to take over.
const (
	DefaultRetryEvery = 2 * time.Second
	DefaultRetryFor   = 2 * time.Minute
)

// The wakes_total result label values.
const (
	// ResultStarted: the gateway was stopped and is starting.
	ResultStarted = "started"
	// ResultRunning: the gateway was already pending or running.
	ResultRunning = "running"
	// ResultFailed: EC2 refused the start in a way no retry changes, or it still refused after RetryFor.
	ResultFailed = "failed"
)

// Event reasons on the status ConfigMap.
const (
	// ReasonWoken is the Normal Event of a start that found the gateway stopped.
	ReasonWoken = "GatewayWoken"
	// ReasonFailed is the Warning Event of a start that failed: the nodes' own wake-up is left.
	ReasonFailed = "GatewayWakeFailed"
)

// gatewayKey is the queue's one key: every decision wakes the same instance.
const gatewayKey = "gateway"

// refusals are the StartInstances error codes no retry changes (the node agent's wake-up stops on the same).
var refusals = []string{"UnauthorizedOperation", "AuthFailure", "OptInRequired"}

// Starter is the EC2 call the loop makes.
type Starter interface {
	StartInstances(ctx context.Context, in *ec2.StartInstancesInput, opts ...func(*ec2.Options)) (*ec2.StartInstancesOutput, error)
}

// Config is the loop's configuration.
type Config struct {
	// Gateway is the gateway's instance id; required.
	Gateway string
	// Groups are the names of the stack's Auto Scaling groups; required. A scale-up of any other group wakes
	// nothing.
	Groups []string
	// Namespace and StatusName are the autoscaler's status ConfigMap (default kube-system,
	// cluster-autoscaler-status).
	Namespace, StatusName string
	// RetryEvery and RetryFor pace the retries of a start EC2 refused for now; defaults DefaultRetryEvery and
	// DefaultRetryFor.
	RetryEvery, RetryFor time.Duration
	// EC2 starts the gateway; required.
	EC2 Starter
}

func (cfg *Config) validate() error {
	var errs []error
	if !names.IsInstanceID(cfg.Gateway) {
		errs = append(errs, fmt.Errorf("wake: Gateway %q is not an EC2 instance id", cfg.Gateway))
	}
	if len(cfg.Groups) == 0 || slices.Contains(cfg.Groups, "") {
		errs = append(errs, fmt.Errorf("wake: Groups must name the stack's Auto Scaling groups, got %q", cfg.Groups))
	}
	if cfg.EC2 == nil {
		errs = append(errs, errors.New("wake: EC2 is required"))
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "kube-system"
	}
	if cfg.StatusName == "" {
		cfg.StatusName = DefaultStatusName
	}
	if cfg.RetryEvery == 0 {
		cfg.RetryEvery = DefaultRetryEvery
	}
	if cfg.RetryFor == 0 {
		cfg.RetryFor = DefaultRetryFor
	}
	if cfg.RetryEvery < 0 || cfg.RetryFor < 0 {
		errs = append(errs, fmt.Errorf("wake: RetryEvery and RetryFor must not be negative, got %s and %s",
			cfg.RetryEvery, cfg.RetryFor))
	}
	return errors.Join(errs...)
}

// Controller is the wake loop.
type Controller struct {
	cfg      Config
	recorder record.EventRecorder
	log      *slog.Logger
	clock    clock.WithTicker

	informers informers.SharedInformerFactory
	synced    cache.InformerSynced
	queue     workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// raising are the stack's groups the last status showed scaling up.
	raising []string
	// pending is the decision the next start answers: the groups that turned InProgress, and when it was seen;
	// zero when there is none.
	pending decision
	// status is the status ConfigMap last seen, the object the Events are recorded on.
	status *corev1.ConfigMap

	wakes *prometheus.CounterVec
}

// decision is a scale-up that wants the gateway.
type decision struct {
	groups []string
	seen   time.Time
}

// New builds the wake loop from cfg and d: its own informer on the one status ConfigMap (the namespace's other
// ConfigMaps are neither listed nor watched) and its metrics on d.Metrics.
func New(cfg Config, d loop.Deps) (*Controller, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:      cfg,
		recorder: d.Recorder,
		log:      d.Log.With("loop", Name),
		clock:    d.Clock,
		queue:    loop.NewQueue(Name, d.Clock),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynk8s_controller_gateway_wakes_total",
			Help: "Starts of the WireGuard gateway at a scale-up decision of the Cluster Autoscaler, by result: " +
				"started (it was stopped), running (it already was), failed (the nodes' own wake-up is left).",
		}, []string{"result"}),
	}
	for _, r := range []string{ResultStarted, ResultRunning, ResultFailed} {
		c.wakes.WithLabelValues(r)
	}
	if err := d.Metrics.Register(c.wakes); err != nil {
		return nil, fmt.Errorf("wake: registering metrics: %w", err)
	}
	c.informers = informers.NewSharedInformerFactoryWithOptions(d.Client, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.StatusName).String()
		}))
	reg, err := c.informers.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.observe,
		UpdateFunc: func(_, obj any) { c.observe(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("wake: adding the ConfigMap handler: %w", err)
	}
	c.synced = reg.HasSynced
	return c, nil
}

// Name is the loop's name.
func (c *Controller) Name() string { return Name }

// Run starts the informer, waits for its cache and wakes the gateway at each decision until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.informers.Start(ctx.Done())
	if err := loop.WaitForSync(ctx, Name, c.synced); err != nil {
		c.queue.ShutDown()
		return err
	}
	c.log.Info("started", "gateway", c.cfg.Gateway, "groups", strings.Join(c.cfg.Groups, ","),
		"status", c.cfg.Namespace+"/"+c.cfg.StatusName)
	loop.Work(ctx, c.log, c.queue, 1, c.sync)
	return nil
}

// observe reads a status the informer delivers and queues a start when one of the stack's groups has turned
// InProgress since the status before.
func (c *Controller) observe(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || cm.Name != c.cfg.StatusName {
		return
	}
	raising, err := Raising(cm.Data[statusKey], c.cfg.Groups)
	if err != nil {
		c.log.Warn("cannot read the autoscaler's status: no early wake-up until it can be read",
			"configmap", cm.Namespace+"/"+cm.Name, "error", err.Error())
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status = cm
	var turned []string
	for _, g := range raising {
		if !slices.Contains(c.raising, g) {
			turned = append(turned, g)
		}
	}
	c.raising = raising
	if len(turned) == 0 {
		return
	}
	if c.pending.seen.IsZero() {
		c.pending.seen = c.clock.Now()
	}
	c.pending.groups = slices.Compact(slices.Sorted(slices.Values(append(c.pending.groups, turned...))))
	c.queue.Add(gatewayKey)
}

// Raising returns the groups among ours whose scale-up is InProgress in the autoscaler's status document (its
// YAML, clusterstate/api ClusterAutoscalerStatus), sorted.
func Raising(doc string, ours []string) ([]string, error) {
	var st struct {
		NodeGroups []struct {
			Name    string `json:"name"`
			ScaleUp struct {
				Status string `json:"status"`
			} `json:"scaleUp"`
		} `json:"nodeGroups"`
	}
	if err := yaml.Unmarshal([]byte(doc), &st); err != nil {
		return nil, fmt.Errorf("the status is not the autoscaler's YAML: %w", err)
	}
	var out []string
	for _, g := range st.NodeGroups {
		if g.ScaleUp.Status == scalingUp && slices.Contains(ours, g.Name) {
			out = append(out, g.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// sync starts the gateway for the pending decision.
func (c *Controller) sync(ctx context.Context, _ string) error {
	c.mu.Lock()
	d, status := c.pending, c.status
	c.mu.Unlock()
	if d.seen.IsZero() {
		return nil
	}
	why := "scale-up of " + strings.Join(d.groups, ", ")
	previous, err := c.start(ctx)
	switch {
	case err == nil:
		c.done()
		if previous == "stopped" {
			c.wakes.WithLabelValues(ResultStarted).Inc()
			c.log.Info("woke the gateway", "gateway", c.cfg.Gateway, "reason", why,
				"after", c.clock.Since(d.seen).Round(time.Millisecond).String())
			c.event(status, corev1.EventTypeNormal, ReasonWoken, "started the WireGuard gateway %s for the %s",
				c.cfg.Gateway, why)
		} else {
			c.wakes.WithLabelValues(ResultRunning).Inc()
			c.log.Info("the gateway is up", "gateway", c.cfg.Gateway, "state", previous, "reason", why)
		}
		return nil
	case permanent(err) || c.clock.Since(d.seen) >= c.cfg.RetryFor:
		c.done()
		c.wakes.WithLabelValues(ResultFailed).Inc()
		c.log.Error("cannot wake the gateway: the nodes' own wake-up is left", "gateway", c.cfg.Gateway,
			"reason", why, "error", err.Error())
		c.event(status, corev1.EventTypeWarning, ReasonFailed,
			"cannot start the WireGuard gateway %s for the %s (the booting nodes will try): %v", c.cfg.Gateway, why, err)
		return nil
	default:
		c.log.Info("the gateway cannot start yet: asking again", "gateway", c.cfg.Gateway, "error", err.Error(),
			"in", c.cfg.RetryEvery.String())
		return loop.Requeue{After: c.cfg.RetryEvery}
	}
}

// done clears the decision a start has answered; a group that turns InProgress later makes a new one.
func (c *Controller) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = decision{}
}

// start is one StartInstances of the gateway; it returns the state the gateway was in.
func (c *Controller) start(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := c.cfg.EC2.StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{c.cfg.Gateway}})
	if err != nil {
		return "", fmt.Errorf("ec2:StartInstances %s: %w", c.cfg.Gateway, err)
	}
	for _, s := range out.StartingInstances {
		if s.PreviousState != nil {
			return string(s.PreviousState.Name), nil
		}
	}
	return "", nil
}

// permanent reports whether EC2 refused the start in a way no retry changes.
func permanent(err error) bool {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return false
	}
	code := api.ErrorCode()
	return slices.Contains(refusals, code) || strings.HasPrefix(code, "InvalidInstanceID.")
}

func (c *Controller) event(on *corev1.ConfigMap, kind, reason, format string, args ...any) {
	if on != nil && c.recorder != nil {
		c.recorder.Eventf(on, kind, reason, format, args...)
	}
}

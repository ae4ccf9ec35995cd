// Package rotate is the controller's join token rotation loop: it issues a kubeadm bootstrap token (a Secret in
// kube-system that expires by itself) and then overwrites the SSM SecureString the nodes read with it, once when
// this replica starts leading and again every Config.Every. An emergency rotation is a new leader: the operator rolls
// the controller (docs/operations.md).
//
// Older tokens are left alone: a node that read one a moment ago still joins with it, and the controller manager's
// token cleaner deletes each at its expiration (pkg/controller/bootstrap/tokencleaner.go, Kubernetes 1.34). The
// token's secret half appears in the Secret and the SSM request only: never in a log line, an Event, an error or a
// metric.
package rotate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// name is the loop's name in logs, metrics and the controller's --loops.
const name = "rotate"

// Bounds of Config.TTL: infra/config's bounds of kubernetes.bootstrapTokenTTL (MinBootstrapTokenTTL,
// MaxBootstrapTokenTTL), so that every TTL a stack accepts runs here and no other; a test pins them equal.
const (
	MinTTL = 30 * time.Minute
	MaxTTL = 24 * time.Hour
)

// MinEvery is the shortest rotation period: below a minute the loop would mostly mint Secrets for the token cleaner.
const MinEvery = time.Minute

// callTimeout bounds one API or SSM call: a call that hangs must not hold the only worker past the next rotation.
const callTimeout = 30 * time.Second

// The shapes the loop accepts for the parameter and the key: an SSM parameter path, and a KMS key or alias, bare or
// as an ARN (SSM PutParameter's KeyId takes either, Systems Manager API Reference).
var (
	parameterPattern = regexp.MustCompile(`^/[A-Za-z0-9_./-]+$`)
	keyPattern       = regexp.MustCompile(`^(arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:)?(key|alias)/[A-Za-z0-9/_-]+$`)
)

// Config is what the loop rotates and how often.
type Config struct {
	// Namespace is where the token Secrets go: the API server's token authenticator reads them in kube-system only
	// (optional, default kube-system).
	Namespace string
	// Parameter is the SSM SecureString the nodes read the token from (required; a path such as
	// /dynk8s/<cluster>/join-token).
	Parameter string
	// KMSKeyID is the KMS key SSM encrypts the token with: a key or alias ARN, or alias/aws/ssm for the account's
	// default (required). It is passed on every PutParameter, so no overwrite leaves the key to SSM.
	KMSKeyID string
	// TTL is each token's lifetime, MinTTL..MaxTTL (required).
	TTL time.Duration
	// Every is how long after its issue a token is replaced, MinEvery..TTL/2 (optional, default TTL/3, so that the
	// token in SSM keeps two thirds of its life or more).
	Every time.Duration
	// Group is the one group the tokens authenticate with besides system:bootstrappers (auth-extra-groups; required):
	// the stack's node group, system:bootstrappers:dynk8s:pool-nodes, the group the rotator's admission policy admits.
	Group string
	// SSM is the client the token is written with (required).
	SSM cloud.SSM
}

// withDefaults is cfg with its optional fields filled in.
func (cfg Config) withDefaults() Config {
	if cfg.Namespace == "" {
		cfg.Namespace = "kube-system"
	}
	if cfg.Every == 0 {
		cfg.Every = cfg.TTL / 3
	}
	return cfg
}

// validate names the first field that is wrong. Every stops at TTL/2: a token is replaced when it is Every old and
// is published at all only while it has more than Every left, and both floors (TTL-Every and Every) must leave a
// node that reads SSM time to join.
func (cfg Config) validate() error {
	switch {
	case cfg.Namespace == "":
		return errors.New("rotate: Config.Namespace is empty")
	case !parameterPattern.MatchString(cfg.Parameter):
		return fmt.Errorf("rotate: Config.Parameter %q is not an SSM parameter path (%s)", cfg.Parameter,
			parameterPattern)
	case !keyPattern.MatchString(cfg.KMSKeyID):
		return fmt.Errorf("rotate: Config.KMSKeyID %q is not a KMS key or alias, nor its ARN", cfg.KMSKeyID)
	case cfg.TTL < MinTTL || cfg.TTL > MaxTTL:
		return fmt.Errorf("rotate: Config.TTL %s is not within %s..%s", cfg.TTL, MinTTL, MaxTTL)
	case cfg.Every < MinEvery || cfg.Every > cfg.TTL/2:
		return fmt.Errorf("rotate: Config.Every %s is not within %s..%s (half the TTL %s)", cfg.Every, MinEvery,
			cfg.TTL/2, cfg.TTL)
	case cfg.SSM == nil:
		return errors.New("rotate: Config.SSM is nil")
	}
	if err := bootstraputil.ValidateBootstrapGroupName(cfg.Group); err != nil {
		return fmt.Errorf("rotate: Config.Group: %w", err)
	}
	return nil
}

// Controller is the rotation loop. The leader builds one each time it starts leading and runs it once.
type Controller struct {
	cfg   Config
	d     loop.Deps
	log   *slog.Logger
	queue workqueue.TypedRateLimitingInterface[string]

	rotations *prometheus.CounterVec

	mu sync.Mutex
	// pending is the token whose Secret exists but which SSM does not hold yet; published is the newest token SSM
	// holds, publishedAt when it took it. Both nil until this replica's first issue.
	pending, published *token
	publishedAt        time.Time
}

// The rotations counter's results.
const (
	resultPublished    = "published"
	resultSecretFailed = "secret_failed"
	resultSSMFailed    = "ssm_failed"
)

// New validates cfg, builds the loop's queue and registers its metrics on d.Metrics.
//
// The loop watches no Secret: it is driven by its own schedule on the work queue (the next rotation is an AddAfter),
// not by an informer. An informer on its Secrets would need list and watch on Secrets in kube-system, which RBAC
// cannot narrow to a label, and would let the controller read every Secret there (the autoscaler's AWS key among
// them); the loop needs only create. An operator who revokes the tokens (deletes their Secrets) rotates by rolling
// the controller (kubernetes.bootstrapTokenRotation): every new leader issues a token at once.
func New(cfg Config, d loop.Deps) (*Controller, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	switch {
	case d.Client == nil:
		return nil, errors.New("rotate: Deps.Client is nil")
	case d.Recorder == nil:
		return nil, errors.New("rotate: Deps.Recorder is nil")
	case d.Metrics == nil:
		return nil, errors.New("rotate: Deps.Metrics is nil")
	case d.Log == nil:
		return nil, errors.New("rotate: Deps.Log is nil")
	case d.Clock == nil:
		return nil, errors.New("rotate: Deps.Clock is nil")
	}
	c := &Controller{
		cfg: cfg, d: d, log: d.Log.With("loop", name),
		rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynk8s_controller_token_rotations_total",
			Help: "Join token rotations by result: published (Secret created, SSM overwritten), secret_failed " +
				"(the Secret was not created, SSM not written), ssm_failed (the PutParameter failed; retried).",
		}, []string{"result"}),
	}
	for _, r := range []string{resultPublished, resultSecretFailed, resultSSMFailed} {
		c.rotations.WithLabelValues(r)
	}
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dynk8s_controller_token_age_seconds",
		Help: "Seconds since this replica last wrote a join token to SSM; -1 before its first.",
	}, c.tokenAge)
	for _, m := range []prometheus.Collector{c.rotations, age} {
		if err := d.Metrics.Register(m); err != nil {
			return nil, fmt.Errorf("rotate: register metrics: %w", err)
		}
	}
	// On d.Clock: the next rotation is an AddAfter, which a test's fake clock must drive. Made last: its goroutine
	// lives until Run ends.
	c.queue = loop.NewQueue(name, d.Clock)
	return c, nil
}

// Name is the loop's name.
func (c *Controller) Name() string { return name }

// Run issues a token at once (this replica cannot know whether SSM holds the newest token: the last leader may have
// died between its Secret and its PutParameter) and keeps rotating until ctx ends. One worker: tokens are issued
// one after the other.
func (c *Controller) Run(ctx context.Context) error {
	c.log.Info("rotating join tokens", "parameter", c.cfg.Parameter, "namespace", c.cfg.Namespace,
		"ttl", c.cfg.TTL.String(), "every", c.cfg.Every.String())
	c.queue.Add(c.cfg.Parameter)
	loop.Work(ctx, c.log, c.queue, 1, c.sync)
	return nil
}

// tokenAge is the seconds since the last publish, -1 before the first.
func (c *Controller) tokenAge() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.published == nil {
		return -1
	}
	return c.d.Clock.Since(c.publishedAt).Seconds()
}

// sync does what is due: nothing before the next rotation (it returns the wait), else publishes the pending token
// or issues a new one and publishes that. The queue brings it back after the wait and after a failure
// (rate-limited, 5 ms doubling to 1000 s).
//
// A pending token is retried while it has more than Every left: published then, it still serves a node that reads
// it until the next token replaces it. After that a new one takes its place. The next
// rotation is due Every after the token SSM holds was issued (not published): so the token in SSM is at most Every
// old, outside an outage, and a token published late is replaced early.
func (c *Controller) sync(ctx context.Context, _ string) error {
	now := c.d.Clock.Now()
	c.mu.Lock()
	pending, published := c.pending, c.published
	c.mu.Unlock()

	if pending != nil {
		left := pending.expires.Sub(now)
		if left <= c.cfg.Every {
			c.log.Warn("dropping the pending token: SSM did not take it in time", "token", pending,
				"left", left.String(), "every", c.cfg.Every.String())
			c.event(pending, corev1.EventTypeWarning, "TokenAbandoned",
				"token %s was never written to SSM parameter %s and has %s left: a new token replaces it",
				pending.id, c.cfg.Parameter, left.Round(time.Second))
			pending = nil
			c.mu.Lock()
			c.pending = nil
			c.mu.Unlock()
		}
	}
	if pending == nil {
		if published != nil {
			if due := published.issued.Add(c.cfg.Every); now.Before(due) {
				return loop.Requeue{After: due.Sub(now)}
			}
		}
		t, err := c.issue(ctx, now)
		if err != nil {
			return err
		}
		pending = t
	}
	return c.publish(ctx, pending)
}

// issue mints a token and creates its Secret; it is the pending token then. A failure is counted and logged, and
// the next attempt mints another token: nothing was given out.
func (c *Controller) issue(ctx context.Context, now time.Time) (*token, error) {
	t, err := mint(now, c.cfg.TTL)
	if err != nil {
		return nil, err
	}
	callCtx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	s, err := c.d.Client.CoreV1().Secrets(c.cfg.Namespace).Create(callCtx,
		secretFor(t, c.cfg.Namespace, c.cfg.Group), metav1.CreateOptions{FieldManager: "dynk8s-controller"})
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("create Secret %s/%s: stopped: %w", c.cfg.Namespace, t.name(), ctx.Err())
	}
	if err != nil {
		c.rotations.WithLabelValues(resultSecretFailed).Inc()
		msg := t.scrub(err)
		c.log.Warn("could not create the token's Secret; SSM is left as it is", "token", t,
			"secret", c.cfg.Namespace+"/"+t.name(), "error", msg)
		return nil, fmt.Errorf("create Secret %s/%s: %s", c.cfg.Namespace, t.name(), msg)
	}
	t.obj = s
	c.mu.Lock()
	c.pending = t
	c.mu.Unlock()
	c.log.Info("created the token's Secret", "token", t, "secret", c.cfg.Namespace+"/"+s.Name,
		"expires", t.expiration())
	return t, nil
}

// publish overwrites the SSM parameter with the pending token t, encrypted with the configured key. A failure is
// counted, logged and an Event on t's Secret, and returned for the queue's back-off; a success makes t the
// published token and returns the wait until the next rotation.
func (c *Controller) publish(ctx context.Context, t *token) error {
	callCtx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out, err := c.cfg.SSM.PutParameter(callCtx, &ssm.PutParameterInput{
		Name:      aws.String(c.cfg.Parameter),
		Value:     aws.String(t.value()),
		Type:      ssmtypes.ParameterTypeSecureString,
		KeyId:     aws.String(c.cfg.KMSKeyID),
		Overwrite: aws.Bool(true),
	})
	now := c.d.Clock.Now()
	if err != nil && ctx.Err() != nil {
		// The leadership ended mid-call: no failure of SSM's, and the next leader issues a token of its own.
		return fmt.Errorf("ssm:PutParameter %s with token %s: stopped: %w", c.cfg.Parameter, t.id, ctx.Err())
	}
	if err != nil {
		c.rotations.WithLabelValues(resultSSMFailed).Inc()
		msg := t.scrub(err)
		left := t.expires.Sub(now)
		c.log.Warn("could not write the token to SSM; will try the same token again", "token", t,
			"parameter", c.cfg.Parameter, "left", left.Round(time.Second).String(), "error", msg)
		c.event(t, corev1.EventTypeWarning, "TokenPublishFailed",
			"could not write token %s to SSM parameter %s (tried again while it has more than %s left): %s",
			t.id, c.cfg.Parameter, c.cfg.Every, msg)
		return fmt.Errorf("ssm:PutParameter %s with token %s: %s", c.cfg.Parameter, t.id, msg)
	}
	c.rotations.WithLabelValues(resultPublished).Inc()
	c.mu.Lock()
	c.pending, c.published, c.publishedAt = nil, t, now
	c.mu.Unlock()
	due := t.issued.Add(c.cfg.Every)
	c.log.Info("wrote the token to SSM; the previous token expires on its own", "token", t,
		"parameter", c.cfg.Parameter, "version", out.Version, "next", due.UTC().Format(time.RFC3339))
	c.event(t, corev1.EventTypeNormal, "TokenPublished", "token %s is in SSM parameter %s; the next one is due at %s",
		t.id, c.cfg.Parameter, due.UTC().Format(time.RFC3339))
	return loop.Requeue{After: due.Sub(now)}
}

// event records an Event on t's Secret, the object an operator looks at (kubectl describe secret). The message
// names the token by its id only.
func (c *Controller) event(t *token, kind, reason, format string, args ...any) {
	c.d.Recorder.Eventf(t.obj, kind, reason, format, args...)
}

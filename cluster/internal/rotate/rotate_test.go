package rotate

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// TestNewChecksTheConfig: every field that is wrong is refused by its name, the optional ones take their
// defaults, and the bounds' edges are accepted.
func TestNewChecksTheConfig(t *testing.T) {
	good := func() Config {
		return Config{Parameter: testParam, KMSKeyID: "alias/aws/ssm", TTL: testTTL, Group: testGroup,
			SSM: &clockedSSM{}}
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "" accepted
	}{
		{"defaults", func(*Config) {}, ""},
		{"shortest TTL", func(c *Config) { c.TTL = 30 * time.Minute }, ""},
		{"longest TTL", func(c *Config) { c.TTL = 24 * time.Hour }, ""},
		{"every half the TTL", func(c *Config) { c.Every = time.Hour }, ""},
		{"every a minute", func(c *Config) { c.Every = time.Minute }, ""},
		{"key ARN", func(c *Config) { c.KMSKeyID = testKey }, ""},
		{"alias ARN", func(c *Config) { c.KMSKeyID = "arn:aws:kms:eu-central-1:123456789012:alias/dynk8s" }, ""},
		{"no parameter", func(c *Config) { c.Parameter = "" }, "Config.Parameter"},
		{"relative parameter", func(c *Config) { c.Parameter = "join-token" }, "Config.Parameter"},
		{"no key", func(c *Config) { c.KMSKeyID = "" }, "Config.KMSKeyID"},
		{"quoted key", func(c *Config) { c.KMSKeyID = `alias/"x"` }, "Config.KMSKeyID"},
		{"no TTL", func(c *Config) { c.TTL = 0 }, "Config.TTL"},
		{"TTL too short", func(c *Config) { c.TTL = 29 * time.Minute }, "Config.TTL"},
		{"TTL too long", func(c *Config) { c.TTL = 25 * time.Hour }, "Config.TTL"},
		{"every over half the TTL", func(c *Config) { c.Every = time.Hour + time.Second }, "Config.Every"},
		{"every under a minute", func(c *Config) { c.Every = 59 * time.Second }, "Config.Every"},
		{"negative every", func(c *Config) { c.Every = -time.Minute }, "Config.Every"},
		{"no group", func(c *Config) { c.Group = "" }, "Config.Group"},
		{"group outside the bootstrappers", func(c *Config) { c.Group = "system:masters" }, "Config.Group"},
		{"two groups", func(c *Config) { c.Group = testGroup + ",system:bootstrappers:x" }, "Config.Group"},
		{"no SSM", func(c *Config) { c.SSM = nil }, "Config.SSM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.edit(&cfg)
			fc := fake.NewClientset()
			c, err := New(cfg, loop.Deps{Client: fc, Informers: informers.NewSharedInformerFactory(fc, 0),
				Recorder: record.NewFakeRecorder(1), Metrics: prometheus.NewRegistry(), Log: discard(),
				Clock: clocktesting.NewFakeClock(start)})
			if tc.want != "" {
				assert.ErrorContains(t, err, tc.want)
				return
			}
			assert.NilError(t, err)
			defer c.queue.ShutDown()
			assert.Equal(t, c.cfg.Namespace, "kube-system")
			if cfg.Every == 0 {
				assert.Equal(t, c.cfg.Every, cfg.TTL/3)
			} else {
				assert.Equal(t, c.cfg.Every, cfg.Every)
			}
		})
	}
	t.Run("missing deps", func(t *testing.T) {
		fc := fake.NewClientset()
		full := loop.Deps{Client: fc, Recorder: record.NewFakeRecorder(1), Metrics: prometheus.NewRegistry(),
			Log: discard(), Clock: clocktesting.NewFakeClock(start)}
		for field, drop := range map[string]func(*loop.Deps){
			"Deps.Client": func(d *loop.Deps) { d.Client = nil }, "Deps.Recorder": func(d *loop.Deps) { d.Recorder = nil },
			"Deps.Metrics": func(d *loop.Deps) { d.Metrics = nil }, "Deps.Log": func(d *loop.Deps) { d.Log = nil },
			"Deps.Clock": func(d *loop.Deps) { d.Clock = nil },
		} {
			d := full
			drop(&d)
			_, err := New(good(), d)
			assert.ErrorContains(t, err, field)
		}
	})
}

// TestBoundsAreTheStacks: the loop takes exactly the TTLs the stack's config does, and its default period for the
// default TTL is the CronJob's.
func TestBoundsAreTheStacks(t *testing.T) {
	assert.Equal(t, MinTTL, config.MinBootstrapTokenTTL)
	assert.Equal(t, MaxTTL, config.MaxBootstrapTokenTTL)
	assert.Equal(t, Config{TTL: testTTL}.withDefaults().Every, config.BootstrapTokenRotationPeriod(testTTL))
}

// TestFirstTokenAtStart: the loop issues a token as soon as it runs: a Secret in the bootstrap token format the API
// server, the controller manager and kubeadm read, that the rotator's admission policy admits, and then the same
// token in SSM, a SecureString overwritten with the configured key.
func TestFirstTokenAtStart(t *testing.T) {
	r := newRig(t)
	assert.Equal(t, r.metric("dynk8s_controller_token_age_seconds"), -1.0, "before the first publish")
	r.run()
	r.waitPuts(1)
	r.scheduled()

	secrets := r.secrets()
	assert.Assert(t, is.Len(secrets, 1))
	s := secrets[0]
	id, secret := string(s.Data["token-id"]), string(s.Data["token-secret"])
	assert.Assert(t, regexp.MustCompile(`^[a-z0-9]{6}$`).MatchString(id), "token-id %q", id)
	assert.Assert(t, regexp.MustCompile(`^[a-z0-9]{16}$`).MatchString(secret), "token-secret of %d characters",
		len(secret))
	exp := "2026-03-04T07:06:07Z" // start + 2h
	assert.Equal(t, s.Name, "bootstrap-token-"+id)
	assert.Equal(t, s.Namespace, "kube-system")
	assert.Equal(t, s.Type, corev1.SecretType("bootstrap.kubernetes.io/token"))
	assert.DeepEqual(t, s.Labels, map[string]string{
		"app.kubernetes.io/name":       "dynk8s-join-token",
		"app.kubernetes.io/part-of":    "dynk8s",
		"app.kubernetes.io/managed-by": "dynk8s-join-token-rotator",
	})
	got := map[string]string{}
	for k, v := range s.Data {
		got[k] = string(v)
	}
	assert.DeepEqual(t, got, map[string]string{
		"description":                    "dynk8s node join token, issued by the join token rotator; expires " + exp,
		"token-id":                       id,
		"token-secret":                   secret,
		"expiration":                     exp,
		"usage-bootstrap-authentication": "true",
		"usage-bootstrap-signing":        "true",
		"auth-extra-groups":              testGroup,
	})
	checkAdmitted(t, s, start, testTTL)

	assert.DeepEqual(t, r.ssm.Puts(), []fakeaws.SSMPut{{
		Name: testParam, Value: id + "." + secret, Type: "SecureString", KeyID: testKey, Overwrite: true,
	}})
	assert.Equal(t, r.rotations("published"), 1.0)
	assert.Equal(t, r.rotations("secret_failed"), 0.0)
	assert.Equal(t, r.rotations("ssm_failed"), 0.0)
	assert.Equal(t, r.metric("dynk8s_controller_token_age_seconds"), 0.0)
	assert.Check(t, is.Contains(r.recorded(), "Normal TokenPublished token "+id+" is in SSM parameter "+testParam+
		"; the next one is due at 2026-03-04T05:46:07Z"))
}

// checkAdmitted checks s against what the API server's bootstrap token authenticator requires
// (plugin/pkg/auth/authenticator/token/bootstrap/bootstrap.go: the name is bootstrap-token-<token-id>, the usage,
// a parsable expiration, valid groups) and against the token rotator's admission policy (infra/addons/token.go,
// tokenRotatorValidations and tokenExpirationVariables), rule by rule in Go, for a Secret the API server stamped
// created: the real policy's CEL is the e2e test's (TestTokenRotator).
func checkAdmitted(t *testing.T, s corev1.Secret, created time.Time, ttl time.Duration) {
	t.Helper()
	id := string(s.Data["token-id"])
	assert.Check(t, bootstraputil.IsValidBootstrapToken(value(s)), "not a bootstrap token")
	assert.Check(t, is.Equal(s.Name, bootstraputil.BootstrapTokenSecretName(id)))
	assert.Check(t, is.Equal(string(s.Data["usage-bootstrap-authentication"]), "true"))
	assert.Check(t, bootstraputil.ValidateBootstrapGroupName(string(s.Data["auth-extra-groups"])))
	// The policy: the type, the name's prefix, the expiration in its 28 base64 characters of a UTC time in whole
	// seconds no later than the creation plus the TTL plus 10 minutes, and exactly the node group, compared in base64.
	assert.Check(t, is.Equal(s.Type, corev1.SecretType("bootstrap.kubernetes.io/token")))
	assert.Check(t, strings.HasPrefix(s.Name, "bootstrap-token-"))
	exp64 := base64.StdEncoding.EncodeToString(s.Data["expiration"])
	assert.Check(t, is.Len(exp64, 28))
	exp, err := time.Parse("2006-01-02T15:04:05Z", string(s.Data["expiration"]))
	assert.Check(t, err)
	assert.Check(t, !exp.After(created.Add(ttl+10*time.Minute)), "expires %s, created %s", exp, created)
	assert.Check(t, is.Equal(base64.StdEncoding.EncodeToString(s.Data["auth-extra-groups"]),
		base64.StdEncoding.EncodeToString([]byte(testGroup))))
}

// TestSyncRotatesEveryAfterTheIssue, on sync itself: a second before the period is up it waits for that second and
// issues nothing; at the period it issues the next token, and waits a period again.
func TestSyncRotatesEveryAfterTheIssue(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	assert.DeepEqual(t, r.c.sync(ctx, testParam), error(loop.Requeue{After: testEvery}))
	r.clock.SetTime(start.Add(testEvery - time.Second))
	assert.DeepEqual(t, r.c.sync(ctx, testParam), error(loop.Requeue{After: time.Second}))
	assert.Equal(t, len(r.timed.all()), 1)
	assert.Equal(t, len(r.secrets()), 1)
	r.clock.SetTime(start.Add(testEvery))
	assert.DeepEqual(t, r.c.sync(ctx, testParam), error(loop.Requeue{After: testEvery}))
	puts := r.timed.all()
	assert.Equal(t, len(puts), 2)
	assert.Equal(t, puts[1].at, start.Add(testEvery))
	assert.Equal(t, len(r.secrets()), 2)
}

// TestRunRotatesOnTheClock: running, the loop issues the next token when the clock reaches the period after the
// first (its expiration says so: it was issued at that instant), and the one after that a period later; the first
// token is left alone.
func TestRunRotatesOnTheClock(t *testing.T) {
	r := newRig(t)
	r.run()
	r.waitPuts(1)
	r.scheduled()
	r.clock.SetTime(start.Add(testEvery))
	puts := r.waitPuts(2)
	secrets := r.secrets()
	assert.Assert(t, is.Len(secrets, 2), "the first token was deleted or the second not issued")
	assert.Equal(t, string(secrets[1].Data["expiration"]), start.Add(testEvery+testTTL).Format(time.RFC3339))
	assert.Equal(t, puts[1].value, value(secrets[1]))
	assert.Equal(t, puts[0].value, value(secrets[0]))
	assert.Assert(t, puts[0].value != puts[1].value)

	r.scheduled()
	r.clock.SetTime(start.Add(2 * testEvery))
	r.waitPuts(3)
	r.scheduled()
	assert.Equal(t, len(r.secrets()), 3)
	assert.Equal(t, r.rotations("published"), 3.0)
}

// TestSSMFailureRetriesTheSameToken: SSM refuses twice; the loop writes the same token again (no new Secret) with
// back-off until SSM takes it, says so in Events on the token's Secret, and still rotates a period after the issue.
func TestSSMFailureRetriesTheSameToken(t *testing.T) {
	r := newRig(t)
	r.ssm.Fail(2, "InternalServerError")
	r.run()
	r.waitPuts(1)
	r.advance(time.Second)
	r.waitPuts(2)
	r.advance(time.Second)
	puts := r.waitPuts(3)
	r.scheduled()

	secrets := r.secrets()
	assert.Assert(t, is.Len(secrets, 1), "a failed write issued another token")
	for i, p := range puts {
		assert.Check(t, is.Equal(p.value, value(secrets[0])), "put %d is another token", i)
	}
	assert.Equal(t, r.rotations("ssm_failed"), 2.0)
	assert.Equal(t, r.rotations("published"), 1.0)
	assert.Equal(t, r.metric("dynk8s_controller_token_age_seconds"), 0.0, "age counts from the write SSM took")
	id := string(secrets[0].Data["token-id"])
	var failed int
	for _, e := range r.recorded() {
		if strings.HasPrefix(e, "Warning TokenPublishFailed could not write token "+id+" to SSM parameter "+testParam) {
			assert.Check(t, is.Contains(e, "InternalServerError"))
			failed++
		}
	}
	assert.Equal(t, failed, 2)
	assert.Check(t, is.Contains(r.logs.String(), "will try the same token again"))

	r.clock.SetTime(start.Add(testEvery))
	r.waitPuts(4)
	assert.Equal(t, len(r.secrets()), 2, "the next token is due a period after the first was issued")
}

// TestLongSSMOutageMintsANewToken: while SSM refuses, the loop retries its token as long as that token has more than
// a period to live, then issues a new one (the first Secret stays, to expire by itself), and writes that one when
// SSM answers again.
func TestLongSSMOutageMintsANewToken(t *testing.T) {
	r := newRig(t)
	r.ssm.Fail(-1, "ServiceUnavailable")
	r.run()
	r.waitPuts(1)
	for i := 0; len(r.secrets()) < 2; i++ {
		assert.Assert(t, i < 100, "no second token after %s of outage", r.clock.Since(start))
		r.advance(5 * time.Minute)
		r.scheduled()
	}
	secrets := r.secrets()
	first, second := secrets[0], secrets[1]
	firstExpires := start.Add(testTTL)
	issued, err := time.Parse(time.RFC3339, string(second.Data["expiration"]))
	assert.NilError(t, err)
	issued = issued.Add(-testTTL)
	assert.Check(t, !issued.Before(firstExpires.Add(-testEvery)),
		"the second token was issued at %s, while the first still had more than %s left", issued, testEvery)
	var retries int
	for _, p := range r.timed.all() {
		if p.value == value(first) {
			retries++
			assert.Check(t, firstExpires.Sub(p.at) > testEvery, "the first token was retried with %s left",
				firstExpires.Sub(p.at))
		}
	}
	assert.Check(t, retries > 10, "the first token was tried %d times", retries)
	assert.Check(t, is.Contains(r.recorded(), "Warning TokenAbandoned token "+string(first.Data["token-id"])+
		" was never written to SSM parameter "+testParam+" and has 40m0s left: a new token replaces it"))

	r.ssm.Fail(0, "")
	r.scheduled()
	r.poll("the second token in SSM", func() bool {
		if r.rotations("published") == 1 {
			return true
		}
		if r.clock.Waiters() > r.baseline {
			r.clock.Step(5 * time.Minute)
		}
		return false
	})
	puts := r.timed.all()
	assert.Equal(t, puts[len(puts)-1].value, value(second))
	assert.Equal(t, len(r.secrets()), 2, "the first token's Secret was touched")
}

// TestRefusedSecretWritesNothingToSSM: when the API server refuses the Secret, SSM is not written (a token the
// cluster does not know would fail every join that reads it); the loop tries again with a new token, and its
// refusal, even one that echoes the secret, is logged without it.
func TestRefusedSecretWritesNothingToSSM(t *testing.T) {
	r := newRig(t)
	var refuse atomic.Bool
	refuse.Store(true)
	r.client.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !refuse.Load() {
			return false, nil, nil
		}
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Secret)
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, s.Name,
			fmt.Errorf("denied by policy: token-secret %q", s.Data["token-secret"]))
	})
	r.run()
	r.poll("a refused Secret", func() bool { return r.rotations("secret_failed") == 1 })
	r.scheduled()
	assert.Equal(t, len(r.ssm.Puts()), 0, "SSM was written without a Secret")
	assert.Equal(t, len(r.secrets()), 0)
	assert.Check(t, is.Contains(r.logs.String(), "could not create the token's Secret; SSM is left as it is"))
	assert.Check(t, is.Contains(r.logs.String(), `token-secret \"<token-secret>\"`), "the echo was not scrubbed")

	refuse.Store(false)
	r.advance(time.Second)
	puts := r.waitPuts(1)
	secrets := r.secrets()
	assert.Assert(t, is.Len(secrets, 1))
	assert.Equal(t, puts[0].value, value(secrets[0]))
	assert.Check(t, r.issuedSecrets()[0] != string(secrets[0].Data["token-secret"]), "the refused token was reused")
}

// TestTokenAgeMetric: -1 before the first write, then the seconds since the last write SSM took, on the clock.
func TestTokenAgeMetric(t *testing.T) {
	r := newRig(t)
	const age = "dynk8s_controller_token_age_seconds"
	assert.Equal(t, r.metric(age), -1.0)
	r.ssm.Fail(1, "InternalServerError")
	assert.Check(t, r.c.sync(context.Background(), testParam) != nil)
	assert.Equal(t, r.metric(age), -1.0, "a failed write is no publish")
	r.clock.Step(90 * time.Second)
	assert.DeepEqual(t, r.c.sync(context.Background(), testParam), error(loop.Requeue{After: testEvery - 90*time.Second}))
	assert.Equal(t, r.metric(age), 0.0)
	r.clock.Step(90 * time.Second)
	assert.Equal(t, r.metric(age), 90.0)
	assert.Equal(t, r.rotations("published"), 1.0)
	assert.Equal(t, r.rotations("ssm_failed"), 1.0)
	assert.Equal(t, r.rotations("secret_failed"), 0.0)
}

// TestNoTokenSecretInLogsEventsOrErrors goes through every path that logs, records or returns an error (a refused
// Secret whose refusal echoes the secret, a refused write, a publish, a revocation): the log, the Events and the
// errors name each token by its id (so the check below looks at text that is about them), never by its secret. The
// rig checks the log, the Events and the metrics at its end; this test checks the errors too.
func TestNoTokenSecretInLogsEventsOrErrors(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var refuse atomic.Bool
	refuse.Store(true)
	r.client.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !refuse.Swap(false) {
			return false, nil, nil
		}
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Secret)
		return true, nil, apierrors.NewBadRequest(fmt.Sprintf("data[token-secret]: Invalid value: %q; base64 %s",
			s.Data["token-secret"], base64.StdEncoding.EncodeToString(s.Data["token-secret"])))
	})
	var errs []string
	note := func(err error) {
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	note(r.c.sync(ctx, testParam)) // refused Secret
	r.ssm.Fail(1, "InternalServerError")
	note(r.c.sync(ctx, testParam)) // refused write
	note(r.c.sync(ctx, testParam)) // published
	published := r.secrets()[0]
	r.clock.SetTime(start.Add(testEvery))
	note(r.c.sync(ctx, testParam)) // due: the next token
	assert.Equal(t, len(r.timed.all()), 3)
	assert.Equal(t, len(errs), 4, "%q", errs)
	assert.Check(t, is.Contains(errs[0], "<token-secret>"), "the echo was not scrubbed")

	issued := r.issuedSecrets()
	assert.Equal(t, len(issued), 3)
	log, events := r.logs.String(), strings.Join(r.recorded(), "\n")
	for i, a := range r.client.Actions() {
		c, ok := a.(k8stesting.CreateAction)
		if !ok {
			continue
		}
		id := string(c.GetObject().(*corev1.Secret).Data["token-id"])
		assert.Check(t, is.Contains(log, id), "create %d: the log does not name token %s", i, id)
	}
	assert.Check(t, is.Contains(events, string(published.Data["token-id"])))
	for _, secret := range issued {
		for _, e := range errs {
			assert.Check(t, !strings.Contains(e, secret), "a token secret is in the error %q", e)
			assert.Check(t, !strings.Contains(e, base64.StdEncoding.EncodeToString([]byte(secret))),
				"a token secret is in the error %q", e)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

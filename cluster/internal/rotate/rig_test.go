package rotate

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/prometheus/client_golang/prometheus"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// The test stack: a 2h TTL (the stack's default), hence a 40m rotation, and the stack's node group.
const (
	testParam = "/dynk8s/lab/join-token"
	testKey   = "arn:aws:kms:eu-central-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	testGroup = "system:bootstrappers:dynk8s:pool-nodes"
	testTTL   = 2 * time.Hour
	testEvery = 40 * time.Minute
	waitFor   = 30 * time.Second
)

// start is the fake clock's start, in whole seconds.
var start = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// put is one PutParameter the loop made, with the fake clock's time.
type put struct {
	at    time.Time
	value string
}

// clockedSSM is the SDK client with a record of when (on the fake clock) each PutParameter was made and with what.
type clockedSSM struct {
	next  cloud.SSM
	clock clock.PassiveClock
	mu    sync.Mutex
	puts  []put
}

func (s *clockedSSM) PutParameter(ctx context.Context, in *ssm.PutParameterInput,
	opts ...func(*ssm.Options)) (*ssm.PutParameterOutput, error) {
	s.mu.Lock()
	s.puts = append(s.puts, put{s.clock.Now(), aws.ToString(in.Value)})
	s.mu.Unlock()
	return s.next.PutParameter(ctx, in, opts...)
}

func (s *clockedSSM) all() []put {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.puts)
}

// lockedBuffer is the log, written by the loop's goroutines and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// rig is one loop against the fake clientset, the SigV4-checking fake SSM and a fake clock, with its log, its
// Events and its metrics captured. Whatever the test does, the rig checks at its end that no token secret the loop
// ever sent the API server reached the log, an Event or a metric.
type rig struct {
	t        *testing.T
	client   *fake.Clientset
	ssm      *fakeaws.SSM
	timed    *clockedSSM
	clock    *clocktesting.FakeClock
	rec      *record.FakeRecorder
	reg      *prometheus.Registry
	logs     *lockedBuffer
	c        *Controller
	baseline int

	mu     sync.Mutex
	events []string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	fakeSSM, client := cloudtest.SSM(t)
	r := &rig{
		t: t, client: fake.NewClientset(), ssm: fakeSSM, clock: clocktesting.NewFakeClock(start),
		rec: record.NewFakeRecorder(10000), reg: prometheus.NewRegistry(), logs: &lockedBuffer{},
	}
	r.timed = &clockedSSM{next: client, clock: r.clock}
	cfg := Config{Parameter: testParam, KMSKeyID: testKey, TTL: testTTL, Group: testGroup, SSM: r.timed}
	log := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := New(cfg, loop.Deps{
		Client: r.client, Informers: informers.NewSharedInformerFactory(r.client, 0), Recorder: r.rec,
		Metrics: r.reg, Log: log, Clock: r.clock,
	})
	assert.NilError(t, err)
	r.c = c
	// The queue's heartbeat ticker; a key waiting for its time adds its timer.
	r.baseline = r.clock.Waiters()
	t.Cleanup(r.checkNoSecretLeaked)
	t.Cleanup(c.queue.ShutDown)
	return r
}

// run runs the loop until the test ends.
func (r *rig) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.c.Run(ctx) }()
	r.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.Check(r.t, err, "Run")
		case <-time.After(waitFor):
			r.t.Error("Run did not return after its context ended")
		}
	})
}

// poll waits for cond, describing what it waits for.
func (r *rig) poll(what string, cond func() bool) {
	r.t.Helper()
	poll.WaitOn(r.t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("waiting for %s", what)
	}, poll.WithTimeout(waitFor), poll.WithDelay(5*time.Millisecond))
}

// scheduled waits until the loop's key waits in the queue for its time (a timer on the fake clock): its sync has
// returned and the queue has taken the wait, so that moving the clock now moves it past that time.
func (r *rig) scheduled() {
	r.t.Helper()
	r.poll("the loop's next wake-up", func() bool { return r.clock.Waiters() > r.baseline })
}

// advance moves the clock d on, once the loop waits for its time.
func (r *rig) advance(d time.Duration) {
	r.t.Helper()
	r.scheduled()
	r.clock.Step(d)
}

// waitPuts waits for n PutParameter calls to have reached the fake SSM (so that a test which ends then cancels no
// request mid-body) and returns them all.
func (r *rig) waitPuts(n int) []put {
	r.t.Helper()
	r.poll(fmt.Sprintf("%d PutParameter calls", n), func() bool { return len(r.ssm.Puts()) >= n })
	return r.timed.all()
}

// secrets are the rotator's Secrets in kube-system, oldest first.
func (r *rig) secrets() []corev1.Secret {
	r.t.Helper()
	list, err := r.client.CoreV1().Secrets("kube-system").List(context.Background(),
		metav1.ListOptions{LabelSelector: Selector})
	assert.NilError(r.t, err)
	s := list.Items
	slices.SortFunc(s, func(a, b corev1.Secret) int {
		return strings.Compare(string(a.Data["expiration"]), string(b.Data["expiration"]))
	})
	return s
}

// value is the token a Secret holds, as SSM would: <token-id>.<token-secret>.
func value(s corev1.Secret) string {
	return string(s.Data["token-id"]) + "." + string(s.Data["token-secret"])
}

// recorded are the Events so far, as the fake recorder formats them: "<type> <reason> <message>".
func (r *rig) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		select {
		case e := <-r.rec.Events:
			r.events = append(r.events, e)
		default:
			return slices.Clone(r.events)
		}
	}
}

// metric is the value of the gauge or counter name (with its one label pair, if any) on the registry.
func (r *rig) metric(name string, label ...string) float64 {
	r.t.Helper()
	families, err := r.reg.Gather()
	assert.NilError(r.t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(label) == 2 && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != label[0] ||
				m.GetLabel()[0].GetValue() != label[1]) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	r.t.Fatalf("no metric %s%v", name, label)
	return 0
}

func (r *rig) rotations(result string) float64 {
	return r.metric("dynk8s_controller_token_rotations_total", "result", result)
}

// issuedSecrets are the token secrets of every Secret the loop asked the API server to create, refused or not.
func (r *rig) issuedSecrets() []string {
	var out []string
	for _, a := range r.client.Actions() {
		if c, ok := a.(k8stesting.CreateAction); ok && a.GetResource().Resource == "secrets" {
			if s, ok := c.GetObject().(*corev1.Secret); ok {
				out = append(out, string(s.Data["token-secret"]))
			}
		}
	}
	return out
}

// checkNoSecretLeaked fails the test if a token secret, in clear or base64 (as a Secret's data prints), is in the
// log, an Event or the metrics.
func (r *rig) checkNoSecretLeaked() {
	families, err := r.reg.Gather()
	assert.Check(r.t, err)
	places := map[string]string{
		"the log":     r.logs.String(),
		"the Events":  strings.Join(r.recorded(), "\n"),
		"the metrics": fmt.Sprint(families),
	}
	for _, secret := range r.issuedSecrets() {
		for where, text := range places {
			for _, form := range []string{secret, base64.StdEncoding.EncodeToString([]byte(secret))} {
				if strings.Contains(text, form) {
					r.t.Errorf("a token secret is in %s", where)
				}
			}
		}
	}
}

// Package looptest is the test rig the controller's Node loops share: a fake clientset, a fake clock, a fake
// event recorder, the shared informer factory and a log sink, put together as loop.Deps; the Nodes put straight into
// the informer's cache; the loop run until the test ends; the Events drained; a metric's value read.
package looptest

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// Rig is one loop's world.
type Rig struct {
	Client   *fake.Clientset
	Clock    *clocktesting.FakeClock
	Recorder *record.FakeRecorder
	Factory  informers.SharedInformerFactory
	Logs     *SyncBuffer
}

// New is a Rig whose API server holds nodes and whose clock starts at start.
func New(start time.Time, nodes ...*corev1.Node) *Rig {
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	client := fake.NewClientset(objs...)
	return &Rig{
		Client:   client,
		Clock:    clocktesting.NewFakeClock(start),
		Recorder: record.NewFakeRecorder(100),
		Factory:  informers.NewSharedInformerFactory(client, 0),
		Logs:     &SyncBuffer{},
	}
}

// Deps are the loop's dependencies on the rig, with a registry of its own and debug logs into Logs.
func (r *Rig) Deps() loop.Deps {
	return loop.Deps{
		Client: r.Client, Informers: r.Factory, Recorder: r.Recorder, Metrics: prometheus.NewRegistry(),
		Log:   slog.New(slog.NewTextHandler(r.Logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Clock: r.Clock,
	}
}

// Cache puts nodes into the informer's cache, as a sync reads them, without starting the informer.
func (r *Rig) Cache(t *testing.T, nodes ...*corev1.Node) {
	t.Helper()
	for _, n := range nodes {
		assert.NilError(t, r.Factory.Core().V1().Nodes().Informer().GetIndexer().Add(n))
	}
}

// Run runs l until the test ends, and checks that it then stopped without an error.
func (r *Rig) Run(t *testing.T, l loop.Loop) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.Check(t, <-done)
	})
}

// Events drains the Events recorded so far.
func (r *Rig) Events() []string {
	var out []string
	for {
		select {
		case e := <-r.Recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// WaitRequeued waits until the loop has put key back n times in all, each for a later sync (loop.Requeue). The
// queue reads its clock when it takes the key back, so a test that steps a fake clock past a requeue's time waits for
// it first: a step that comes before the requeue moves its time along too.
func (r *Rig) WaitRequeued(t *testing.T, key string, n int) {
	t.Helper()
	line := "msg=again "
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		got := 0
		for l := range strings.SplitSeq(r.Logs.String(), "\n") {
			if strings.Contains(l, line) && strings.Contains(l, " key="+key+" ") {
				got++
			}
		}
		if got >= n {
			return poll.Success()
		}
		return poll.Continue("%q requeued %d times, want %d:\n%s", key, got, n, r.Logs.String())
	}, poll.WithTimeout(30*time.Second))
}

// WaitEvents waits until n Events have been recorded since the last drain, and returns all recorded by then. A
// loop that runs in its own goroutine records its Event after the API call a test waits on, so a drain right after
// that wait can come too early.
func (r *Rig) WaitEvents(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		out = append(out, r.Events()...)
		if len(out) >= n {
			return poll.Success()
		}
		return poll.Continue("%d Events, want %d: %q", len(out), n, out)
	}, poll.WithTimeout(30*time.Second))
	return out
}

// WaitCounter waits until a counter has the value want: a loop in its own goroutine counts after the API call a
// test waits on.
func WaitCounter(t *testing.T, m prometheus.Metric, want float64) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := Counter(t, m); got != want {
			return poll.Continue("the counter is %v, want %v", got, want)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second))
}

// Counter is a counter's value. (client_golang's testutil would need a module go.sum does not list.)
func Counter(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	assert.NilError(t, m.Write(&out))
	return out.GetCounter().GetValue()
}

// Gauge is a gauge's value.
func Gauge(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	assert.NilError(t, m.Write(&out))
	return out.GetGauge().GetValue()
}

// Histogram is a histogram's sample count and sum.
func Histogram(t *testing.T, m prometheus.Metric) (uint64, float64) {
	t.Helper()
	var out dto.Metric
	assert.NilError(t, m.Write(&out))
	return out.GetHistogram().GetSampleCount(), out.GetHistogram().GetSampleSum()
}

// SyncBuffer is a log sink that the loop's goroutines and the test share.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

package controller

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// fakeLoop records whether it runs; fail makes its Run return that error at once.
type fakeLoop struct {
	name string
	fail error

	mu      sync.Mutex
	running bool
	runs    int
}

func (l *fakeLoop) Name() string { return l.name }

func (l *fakeLoop) Run(ctx context.Context) error {
	if l.fail != nil {
		return l.fail
	}
	l.mu.Lock()
	l.running = true
	l.runs++
	l.mu.Unlock()
	<-ctx.Done()
	l.mu.Lock()
	l.running = false
	l.mu.Unlock()
	return nil
}

func (l *fakeLoop) state() (running bool, runs int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running, l.runs
}

// replica is one controller process of a test: its options, its loop, and how its run ended.
type replica struct {
	o      Options
	l      *fakeLoop
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// wait waits up to 30 s for the run to end and returns its error.
func (r *replica) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(30 * time.Second):
		t.Fatalf("replica %s did not stop", r.o.Identity)
		return nil
	}
}

// freeAddr is a loopback address no one listens on (for the replica's server).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := ln.Addr().String()
	assert.NilError(t, ln.Close())
	return addr
}

// start runs a replica named id against client, with a short lease so that a handover takes seconds.
func start(t *testing.T, client kubernetes.Interface, id string, l *fakeLoop) *replica {
	t.Helper()
	r := &replica{
		o: Options{
			Identity: id, Addr: freeAddr(t), Region: "eu-central-1", Loops: []string{l.name},
			Election: Election{Namespace: "kube-system", Name: Component, LeaseDuration: 3 * time.Second,
				RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond},
		},
		l: l, done: make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	build := func(loop.Deps, cloud.Clients) ([]loop.Loop, error) { return []loop.Loop{l}, nil }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		defer close(r.done)
		r.err = run(ctx, log, r.o, client, cloud.Clients{}, clock.RealClock{}, build)
	}()
	t.Cleanup(func() {
		cancel()
		_ = r.wait(t)
	})
	return r
}

func holder(client kubernetes.Interface) string {
	lease, err := client.CoordinationV1().Leases("kube-system").Get(context.Background(), Component, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// Two replicas share the Lease: exactly one runs the loops; when it stops (a rollout, a drain: it releases the
// Lease), the other takes over and runs them.
func TestOneLeaderRunsTheLoopsAndHandsOver(t *testing.T) {
	client := fake.NewClientset()
	a := start(t, client, "replica-a", &fakeLoop{name: "approve"})
	b := start(t, client, "replica-b", &fakeLoop{name: "approve"})
	leading := func(r *replica) bool { running, _ := r.l.state(); return running }
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if leading(a) != leading(b) {
			return poll.Success()
		}
		return poll.Continue("a leads: %t, b leads: %t", leading(a), leading(b))
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	leader, follower := a, b
	if leading(b) {
		leader, follower = b, a
	}
	assert.Equal(t, holder(client), leader.o.Identity)
	// The follower never ran its loops while the leader held the Lease.
	_, runs := follower.l.state()
	assert.Equal(t, runs, 0)

	leader.cancel()
	assert.NilError(t, leader.wait(t), "a replica stopped by its context exits cleanly")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if leading(follower) {
			return poll.Success()
		}
		return poll.Continue("the follower does not lead yet (holder %q)", holder(client))
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	assert.Equal(t, holder(client), follower.o.Identity)
}

// The server: ready once the API server answered, live, and the metrics name whether this replica leads.
func TestProbesAndMetrics(t *testing.T) {
	client := fake.NewClientset()
	r := start(t, client, "replica-a", &fakeLoop{name: "approve"})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + r.o.Addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if running, _ := r.l.state(); !running {
			return poll.Continue("not leading yet")
		}
		if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "dynk8s_controller_leader 1") {
			return poll.Continue("/metrics: %d %.200s", code, body)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body := get(path)
		assert.Check(t, is.Equal(code, http.StatusOK), "%s: %s", path, body)
	}
}

// A loop that cannot start ends the leadership and the run, with its error: the kubelet restarts the replica.
func TestALoopThatCannotStartEndsTheRun(t *testing.T) {
	client := fake.NewClientset()
	broken := errors.New("the informers' caches did not sync")
	r := start(t, client, "replica-a", &fakeLoop{name: "approve", fail: broken})
	assert.ErrorIs(t, r.wait(t), broken)
}

// Bad options are refused before anything is started, naming the option.
func TestOptionsValidate(t *testing.T) {
	good := Options{Identity: "a", Addr: ":8080", Region: "eu-central-1", Loops: []string{"approve"},
		Election: Election{Namespace: "kube-system", Name: Component, LeaseDuration: 15 * time.Second,
			RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}}
	assert.NilError(t, good.Validate())
	for want, mutate := range map[string]func(*Options){
		"--identity":          func(o *Options) { o.Identity = "" },
		"--addr":              func(o *Options) { o.Addr = "" },
		"--lease-name":        func(o *Options) { o.Election.Name = "" },
		"lease-duration >":    func(o *Options) { o.Election.RenewDeadline = o.Election.LeaseDuration },
		"--region":            func(o *Options) { o.Region = "" },
		"--loops names no":    func(o *Options) { o.Loops = nil },
		"renew-deadline > re": func(o *Options) { o.Election.RetryPeriod = o.Election.RenewDeadline },
	} {
		o := good
		mutate(&o)
		assert.Check(t, is.ErrorContains(o.Validate(), want))
	}
	assert.Check(t, is.ErrorContains(pick([]loop.Loop{&fakeLoop{name: "approve"}}, []string{"approve", "rotate"}),
		"no loop named rotate"))
}

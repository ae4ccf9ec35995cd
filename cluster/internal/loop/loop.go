// Package loop is what the controller's loops share: their dependencies (the API client and its informers, the
// event recorder, the metrics registry, the logger, the clock), the Loop the leader runs, and the one worker pool
// that drains a loop's work queue.
package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// Deps are what every loop is built from. Informers is the cluster-wide factory the loops share (Nodes, CSRs);
// a loop that watches one namespace's objects builds its own from Client.
type Deps struct {
	Client    kubernetes.Interface
	Informers informers.SharedInformerFactory
	Recorder  record.EventRecorder
	Metrics   prometheus.Registerer
	Log       *slog.Logger
	Clock     clock.WithTicker
}

// Loop is one of the controller's loops: the leader runs each until ctx ends.
type Loop interface {
	// Name is the loop's name in logs and metrics.
	Name() string
	// Run starts the loop's informers, waits for their caches and works until ctx ends; it returns an error only
	// when it cannot start (a cache that never syncs).
	Run(ctx context.Context) error
}

// Sync handles one key of a queue. An error puts the key back, rate-limited; Requeue(after) puts it back after
// that time without counting as a failure; nil forgets it.
type Sync func(ctx context.Context, key string) error

// Requeue is the error a Sync returns to see its key again after After (a deadline it waits for, not a failure).
type Requeue struct{ After time.Duration }

func (r Requeue) Error() string { return fmt.Sprintf("again in %s", r.After) }

// NewQueue is a loop's queue of keys with the default per-item exponential back-off (5 ms doubling to 1000 s)
// and overall token bucket, named for the work queue metrics, its delays on clk (the loop's Deps.Clock: a test's
// fake clock drives the AddAfter deadlines).
func NewQueue(name string, clk clock.WithTicker) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name, Clock: clk})
}

// Work runs workers goroutines that take keys from q and sync them until ctx ends, then shuts q down and waits for
// them.
func Work(ctx context.Context, log *slog.Logger, q workqueue.TypedRateLimitingInterface[string], workers int, fn Sync) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for next(ctx, log, q, fn) {
			}
		})
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
}

func next(ctx context.Context, log *slog.Logger, q workqueue.TypedRateLimitingInterface[string], fn Sync) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	err := fn(ctx, key)
	var again Requeue
	switch {
	case err == nil:
		q.Forget(key)
	case asRequeue(err, &again):
		q.Forget(key)
		q.AddAfter(key, again.After)
		// After AddAfter, which reads the clock: a test on a fake clock waits for this line before it steps.
		log.Debug("again", "key", key, "in", again.After.String())
	default:
		log.Warn("will try again", "key", key, "error", err.Error(), "retries", q.NumRequeues(key))
		q.AddRateLimited(key)
	}
	return true
}

func asRequeue(err error, r *Requeue) bool { return errors.As(err, r) }

// WaitForSync waits for the informers' caches; an error names the loop whose caches did not sync before ctx ended.
func WaitForSync(ctx context.Context, name string, synced ...cache.InformerSynced) error {
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("%s: the informers' caches did not sync", name)
	}
	return nil
}

// Key is the queue key of an object an informer handler is given (namespace/name, or name), including a deleted
// object's last known state.
func Key(obj any) (string, bool) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return "", false
	}
	return key, true
}

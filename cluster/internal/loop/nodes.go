package loop

import (
	"context"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// NodeWatch is what every loop over Nodes shares: the shared Node informer's cache, and a queue that the informer
// feeds with the keys of the Nodes the loop takes, on every add and every change.
type NodeWatch struct {
	// Nodes reads the informer's cache.
	Nodes corelisters.NodeLister
	// Queue holds the keys to sync, its delays on the loop's clock.
	Queue workqueue.TypedRateLimitingInterface[string]

	name      string
	informers informers.SharedInformerFactory
	synced    cache.InformerSynced
}

// WatchNodes registers a handler on d.Informers' Node informer that queues the key of every Node want takes, when
// it is added and when it changes (the factory has no resync period: the loops' own requeues see to their
// deadlines).
func WatchNodes(name string, d Deps, want func(*corev1.Node) bool) (*NodeWatch, error) {
	w := &NodeWatch{
		Nodes: d.Informers.Core().V1().Nodes().Lister(),
		Queue: NewQueue(name, d.Clock),
		name:  name, informers: d.Informers,
	}
	enqueue := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok && want(n) {
			if key, ok := Key(n); ok {
				w.Queue.Add(key)
			}
		}
	}
	reg, err := d.Informers.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("%s: adding the Node handler: %w", name, err)
	}
	w.synced = reg.HasSynced
	return w, nil
}

// Run starts the informers, waits for the Node cache, logs that the loop started (with attrs), and syncs the
// queue's keys with workers goroutines until ctx ends.
func (w *NodeWatch) Run(ctx context.Context, log *slog.Logger, workers int, sync Sync, attrs ...any) error {
	w.informers.Start(ctx.Done())
	if err := WaitForSync(ctx, w.name, w.synced); err != nil {
		w.Queue.ShutDown()
		return err
	}
	log.Info("started", append(attrs, "workers", workers)...)
	Work(ctx, log, w.Queue, workers, sync)
	return nil
}

// Package controller runs dynk8s-controller: the API and AWS clients from the pod's environment, the loops the
// leader runs (CSR approval, token rotation, stale Node cleanup, fuse startup-taint removal), leader election over
// a Lease, the probes and the metrics.
//
// Every replica starts its server and campaigns for the Lease; only the leader runs the loops, so two replicas can
// never approve two CSRs for one name at once. A leader that loses its Lease exits, and the kubelet restarts it as a
// follower: no loop outlives its leadership. With no leader (every replica down), nothing approves a pool node's CSR:
// the gate fails closed, and a join waits until a leader judges it.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
)

// Component is the controller's name: its events' source, its Lease's holder prefix, its user agent.
const Component = "dynk8s-controller"

// Election is the leader election's timing: a follower takes over at most LeaseDuration after the leader's last
// renewal (client-go's leaderelection; kube-controller-manager's defaults are 15 s, 10 s and 2 s).
type Election struct {
	Namespace, Name              string
	LeaseDuration, RenewDeadline time.Duration
	RetryPeriod                  time.Duration
}

// Options are the command's flags.
type Options struct {
	// Kubeconfig is a kubeconfig file; "" is the pod's ServiceAccount (in-cluster).
	Kubeconfig string
	// Identity names this replica in the Lease (the pod's name).
	Identity string
	// Addr is where the probes and metrics are served.
	Addr     string
	Election Election
	// Region is the stack's AWS region; Endpoints override EC2's, SSM's and Auto Scaling's (tests). SSMCredentials sign the SSM
	// calls when set; the SDK's default chain signs the rest.
	Region         string
	Endpoints      cloud.Endpoints
	SSMCredentials aws.CredentialsProvider
	// Loops are the loops to run, by name (all of them by default; a test may run one).
	Loops []string
	// QPS and Burst bound the API client: a flood of CSRs is denied at this rate.
	QPS   float32
	Burst int
}

// Validate names the first option that is wrong.
func (o Options) Validate() error {
	switch {
	case o.Identity == "":
		return errors.New("--identity (or POD_NAME) is empty")
	case o.Addr == "":
		return errors.New("--addr is empty")
	case o.Election.Namespace == "" || o.Election.Name == "":
		return errors.New("--lease-namespace and --lease-name must be set")
	case o.Election.LeaseDuration <= o.Election.RenewDeadline || o.Election.RenewDeadline <= o.Election.RetryPeriod ||
		o.Election.RetryPeriod <= 0:
		return fmt.Errorf("the lease timing must be lease-duration > renew-deadline > retry-period > 0, got %s, %s, %s",
			o.Election.LeaseDuration, o.Election.RenewDeadline, o.Election.RetryPeriod)
	case o.Region == "":
		return errors.New("--region is empty")
	case len(o.Loops) == 0:
		return errors.New("--loops names no loop")
	}
	return nil
}

// Builder makes the loops the leader runs (those Options.Loops names) from their dependencies and the AWS
// clients.
type Builder func(d loop.Deps, aws cloud.Clients) ([]loop.Loop, error)

// Run runs the controller until ctx ends or this replica loses its leadership (an error: the process exits and is
// restarted as a follower).
func Run(ctx context.Context, log *slog.Logger, o Options, build Builder) error {
	if err := o.Validate(); err != nil {
		return err
	}
	// client-go's own logs (leader election, reflectors) go to the same structured log.
	klog.SetSlogLogger(log)
	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = Component
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("API client: %w", err)
	}
	clients, err := cloud.NewClients(ctx, o.Region, o.Endpoints, o.SSMCredentials)
	if err != nil {
		return err
	}
	return run(ctx, log, o, client, clients, clock.RealClock{}, build)
}

// run is Run with its clients made: the server, the loops, the campaign.
func run(ctx context.Context, log *slog.Logger, o Options, client kubernetes.Interface, clients cloud.Clients,
	clk clock.WithTicker, build Builder) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	isLeader := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dynk8s_controller_leader", Help: "1 while this replica holds the Lease and runs the loops.",
	})
	reg.MustRegister(isLeader)

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component, Host: o.Identity})

	srv := &server{watchdog: leaderelection.NewLeaderHealthzAdaptor(20 * time.Second), reg: reg, log: log}
	// The server stops when the run ends, whatever ended it: stopServing runs before the wait (defers run last
	// first).
	var wg sync.WaitGroup
	defer wg.Wait()
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- srv.serve(serveCtx, o.Addr) })
	if _, err := client.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("the API server does not answer: %w", err)
	}
	srv.ready.Store(true)

	// The loops are built (their configuration checked, their informers' handlers registered) before the
	// campaign, so a bad flag fails every replica at start, not the first leader.
	loops, err := build(loop.Deps{
		Client:    client,
		Informers: informers.NewSharedInformerFactory(client, 0),
		Recorder:  recorder,
		Metrics:   reg,
		Log:       log,
		Clock:     clk,
	}, clients)
	if err != nil {
		return err
	}
	if err := pick(loops, o.Loops); err != nil {
		return err
	}

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaOf(o.Election),
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity, EventRecorder: recorder},
	}
	// runCtx ends the campaign: with ctx, or when a loop cannot start (its cause).
	runCtx, stopRunning := context.WithCancelCause(ctx)
	defer stopRunning(nil)
	// leading is closed when the loops have stopped, once this replica has led.
	var mu sync.Mutex
	var leading chan struct{}
	lost := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: o.Election.LeaseDuration, RenewDeadline: o.Election.RenewDeadline,
		RetryPeriod: o.Election.RetryPeriod, ReleaseOnCancel: true, Name: Component, WatchDog: srv.watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				mu.Lock()
				leading = make(chan struct{})
				done := leading
				mu.Unlock()
				defer close(done)
				isLeader.Set(1)
				log.Info("leading: running the loops", "identity", o.Identity, "loops", strings.Join(o.Loops, ","))
				if err := lead(lctx, log, loops); err != nil {
					stopRunning(err)
				}
			},
			OnStoppedLeading: func() {
				isLeader.Set(0)
				close(lost)
			},
			OnNewLeader: func(id string) {
				if id != o.Identity {
					log.Info("following", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	elector.Run(runCtx)
	mu.Lock()
	done := leading
	mu.Unlock()
	if done != nil {
		<-done
	}
	select {
	case err := <-serveErr:
		if err != nil {
			return err
		}
	default:
	}
	switch cause := context.Cause(runCtx); {
	case cause != nil && ctx.Err() == nil:
		return cause
	case ctx.Err() != nil:
		log.Info("stopped", "reason", context.Cause(ctx).Error())
		return nil
	}
	select {
	case <-lost:
		return errors.New("lost the leadership: exiting, to start again as a follower")
	default:
		return nil
	}
}

// pick checks that loops are exactly the loops named.
func pick(loops []loop.Loop, names []string) error {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for _, l := range loops {
		delete(want, l.Name())
	}
	if len(want) > 0 {
		return fmt.Errorf("no loop named %s", strings.Join(sortedKeys(want), ", "))
	}
	return nil
}

// lead runs the loops until ctx ends (the leadership's end); an error is a loop that could not start, which ends
// the leadership.
func lead(ctx context.Context, log *slog.Logger, loops []loop.Loop) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(func() {
			if err := l.Run(ctx); err != nil {
				log.Error("loop failed", "loop", l.Name(), "error", err.Error())
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster API configuration (or set --kubeconfig): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// DefaultIdentity is the pod's name (POD_NAME, from the downward API), else the host name.
func DefaultIdentity() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

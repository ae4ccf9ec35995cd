// Command dynk8s-controller is the cluster side of dynk8s, one static binary that runs in the on-prem cluster (two
// replicas, one leader) and decides who may become a node: it approves the kubelet client CSRs of live pool instances
// whose key the instance marked, issues the join tokens and writes them to SSM, deletes the Nodes of instances that
// are gone, lifts the fuse startup taint once a node advertises the resource, and starts the sleeping WireGuard
// gateway when the Cluster Autoscaler raises one of the stack's groups, replaces the warm instances a new launch
// template version left stale, and deletes the build cache volumes nobody will use. docs/security.md says what each
// loop checks; infra/addons declares its Deployment, and its init container fetches this binary from the stack's
// agent bucket, pinned by version and sha256, as the nodes fetch their agent.
//
//	dynk8s-controller --region R --cluster C --pools P1,P2 --token-parameter /dynk8s/C/join-token
//	    --token-kms-key K --token-ttl 24h --not-ready-after 10m [--loops approve,rotate,cleanup,untaint,wake,warm,cache]
//	    [--wake-gateway i-... --wake-groups G1,G2] [--warm-groups G1] [--cache-pools P1:4:14] [flags]
//	dynk8s-controller version
//
// Credentials (environment): AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are the key EC2 is asked with (the
// stale-node cleanup's IAM user: ec2:DescribeInstances, ec2:StartInstances of the gateway alone, and with warm pools
// the groups' Describe calls and ec2:TerminateInstances of their instances alone);
// DYNK8S_SSM_ACCESS_KEY_ID and DYNK8S_SSM_SECRET_ACCESS_KEY the key the join token is written with (the rotator's
// IAM user, the one the token's KMS key lets encrypt). The API server is reached with the pod's ServiceAccount, or
// --kubeconfig. It logs JSON lines to stderr.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/dynk8s/dynk8s/cluster/internal/approve"
	"github.com/dynk8s/dynk8s/cluster/internal/caches"
	"github.com/dynk8s/dynk8s/cluster/internal/cleanup"
	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/controller"
	"github.com/dynk8s/dynk8s/cluster/internal/loop"
	"github.com/dynk8s/dynk8s/cluster/internal/rotate"
	"github.com/dynk8s/dynk8s/cluster/internal/untaint"
	"github.com/dynk8s/dynk8s/cluster/internal/wake"
	"github.com/dynk8s/dynk8s/cluster/internal/warm"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// The loops, by the names --loops takes.
const (
	loopApprove = "approve"
	loopRotate  = "rotate"
	loopCleanup = "cleanup"
	loopUntaint = "untaint"
	loopWake    = "wake"
	loopWarm    = "warm"
	loopCache   = "cache"
)

// flags are the command line, with the defaults the stack's Deployment relies on.
type flags struct {
	o controller.Options

	loops   string
	approve approve.Config
	pools   string
	record  string
	rotate  rotate.Config
	cleanup cleanup.Config
	untaint untaint.Config
	wake    wake.Config
	groups  string
	warm    warm.Config
	warmIn  string
	caches  caches.Config
	cacheIn string
}

func parse(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("dynk8s-controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.o.Kubeconfig, "kubeconfig", "", "a kubeconfig file (default: the pod's ServiceAccount)")
	fs.StringVar(&f.o.Identity, "identity", controller.DefaultIdentity(), "this replica's name in the Lease")
	fs.StringVar(&f.o.Addr, "addr", ":8080", "where /healthz, /readyz and /metrics are served")
	fs.StringVar(&f.o.Election.Namespace, "lease-namespace", "kube-system", "the Lease's namespace")
	fs.StringVar(&f.o.Election.Name, "lease-name", controller.Component, "the Lease's name")
	fs.DurationVar(&f.o.Election.LeaseDuration, "lease-duration", 15*time.Second, "how long a lease holds unrenewed")
	fs.DurationVar(&f.o.Election.RenewDeadline, "renew-deadline", 10*time.Second, "how long the leader tries to renew")
	fs.DurationVar(&f.o.Election.RetryPeriod, "retry-period", 2*time.Second, "the pause between tries")
	fs.StringVar(&f.o.Region, "region", "", "the stack's AWS region")
	fs.StringVar(&f.o.Endpoints.EC2, "ec2-endpoint", "", "EC2's endpoint (tests; default the region's)")
	fs.StringVar(&f.o.Endpoints.SSM, "ssm-endpoint", "", "SSM's endpoint (tests; default the region's)")
	fs.StringVar(&f.o.Endpoints.AutoScaling, "autoscaling-endpoint", "",
		"EC2 Auto Scaling's endpoint (tests; default the region's)")
	fs.StringVar(&f.loops, "loops", strings.Join([]string{loopApprove, loopRotate, loopCleanup, loopUntaint}, ","),
		"the loops the leader runs")
	qps := fs.Float64("qps", 50, "API requests per second (a flood of CSRs is denied at this rate)")
	fs.IntVar(&f.o.Burst, "burst", 100, "API request burst")

	fs.StringVar(&f.approve.ClusterName, "cluster", "", "approve: the cluster's dynk8s:cluster tag")
	fs.StringVar(&f.pools, "pools", "", "approve: the stack's pools, comma-separated")
	fs.StringVar(&f.approve.BootstrapGroup, "bootstrap-group", "system:bootstrappers:dynk8s:pool-nodes",
		"approve, rotate: the join tokens' group")
	fs.StringVar(&f.record, "approval-record", "kube-system/dynk8s-approved-nodes",
		"approve: the ConfigMap that remembers every instance approved")
	fs.DurationVar(&f.approve.KeyMarkWait, "key-mark-wait", approve.DefaultKeyMarkWait,
		"approve: how long a CSR waits for its instance's key mark")

	fs.StringVar(&f.rotate.Namespace, "token-namespace", "kube-system", "rotate: where the token Secrets go")
	fs.StringVar(&f.rotate.Parameter, "token-parameter", "", "rotate: the SSM parameter the nodes read")
	fs.StringVar(&f.rotate.KMSKeyID, "token-kms-key", "", "rotate: the parameter's KMS key (ARN or alias)")
	fs.DurationVar(&f.rotate.TTL, "token-ttl", 0, "rotate: each token's lifetime")

	fs.StringVar(&f.cleanup.PoolLabel, "pool-label", kube.LabelPool, "cleanup, untaint: the pool nodes' label")
	fs.DurationVar(&f.cleanup.NotReadyAfter, "not-ready-after", 0, "cleanup: how long a Node is NotReady before EC2 is asked")
	fs.StringVar(&f.untaint.TaintKey, "startup-taint", kube.FuseStartupTaint.Key, "untaint: the fuse startup taint's key")
	fs.StringVar(&f.untaint.Resource, "fuse-resource", kube.FuseResource, "untaint: the resource the plugin advertises")
	fs.DurationVar(&f.untaint.GiveUp, "untaint-give-up", 5*time.Minute,
		"untaint: how long a node waits for the resource before the taint goes anyway")
	fs.StringVar(&f.wake.Gateway, "wake-gateway", "", "wake: the WireGuard gateway's instance id")
	fs.StringVar(&f.groups, "wake-groups", "", "wake: the stack's Auto Scaling groups, comma-separated")
	fs.StringVar(&f.wake.StatusName, "autoscaler-status", wake.DefaultStatusName,
		"wake: the Cluster Autoscaler's status ConfigMap in kube-system")
	fs.StringVar(&f.warmIn, "warm-groups", "", "warm: the stack's Auto Scaling groups with a warm pool, comma-separated")
	fs.DurationVar(&f.warm.Every, "warm-every", warm.DefaultEvery, "warm: how often each group's warm pool is looked at")
	fs.StringVar(&f.cacheIn, "cache-pools", "", "cache: the pools that keep a build cache, POOL:MAX:IDLE_DAYS, comma-separated")
	fs.DurationVar(&f.caches.Every, "cache-every", caches.DefaultEvery, "cache: how often the cache volumes are looked at")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	f.o.QPS = float32(*qps)
	f.o.Loops = strings.Split(f.loops, ",")
	if f.pools != "" {
		f.approve.Pools = strings.Split(f.pools, ",")
	}
	if f.groups != "" {
		f.wake.Groups = strings.Split(f.groups, ",")
	}
	if f.warmIn != "" {
		f.warm.Groups = strings.Split(f.warmIn, ",")
	}
	pools, err := caches.ParsePools(f.cacheIn)
	if err != nil {
		return nil, fmt.Errorf("--cache-pools: %w", err)
	}
	f.caches.Pools, f.caches.Cluster = pools, f.approve.ClusterName
	ns, name, ok := strings.Cut(f.record, "/")
	if !ok {
		return nil, fmt.Errorf("--approval-record %q is not <namespace>/<name>", f.record)
	}
	f.approve.Namespace, f.approve.RecordName = ns, name
	f.rotate.Group = f.approve.BootstrapGroup
	f.untaint.PoolLabel = f.cleanup.PoolLabel
	f.cleanup.Region = f.o.Region
	if id, secret := os.Getenv("DYNK8S_SSM_ACCESS_KEY_ID"), os.Getenv("DYNK8S_SSM_SECRET_ACCESS_KEY"); id != "" {
		f.o.SSMCredentials = credentials.NewStaticCredentialsProvider(id, secret, "")
	}
	return f, nil
}

// build makes every loop --loops names (the others are not built, so their flags need not be set).
func (f *flags) build(d loop.Deps, aws cloud.Clients) ([]loop.Loop, error) {
	var loops []loop.Loop
	for _, name := range f.o.Loops {
		var l loop.Loop
		var err error
		switch name {
		case loopApprove:
			cfg := f.approve
			cfg.EC2 = aws.EC2
			l, err = approve.New(cfg, d)
		case loopRotate:
			cfg := f.rotate
			cfg.SSM = aws.SSM
			l, err = rotate.New(cfg, d)
		case loopCleanup:
			cfg := f.cleanup
			cfg.EC2 = aws.EC2
			l, err = cleanup.New(cfg, d)
		case loopUntaint:
			l, err = untaint.New(f.untaint, d)
		case loopWake:
			cfg := f.wake
			cfg.EC2 = aws.EC2
			l, err = wake.New(cfg, d)
		case loopWarm:
			cfg := f.warm
			cfg.AutoScaling, cfg.EC2 = aws.AutoScaling, aws.EC2
			l, err = warm.New(cfg, d)
		case loopCache:
			cfg := f.caches
			cfg.EC2 = aws.EC2
			l, err = caches.New(cfg, d)
		default:
			return nil, fmt.Errorf("--loops: no loop %q (approve, rotate, cleanup, untaint, wake, warm, cache)", name)
		}
		if err != nil {
			return nil, err
		}
		loops = append(loops, l)
	}
	return loops, nil
}

// version is set by nothing: the binary is pinned by its sha256, and the build is reproducible.
func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "version" {
		_, _ = fmt.Fprintln(stderr, controller.Component)
		return 0
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("component", controller.Component)
	f, err := parse(args, stderr)
	if err != nil {
		log.Error("FAILED: bad command line", "error", err.Error())
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := controller.Run(ctx, log, f.o, f.build); err != nil {
		log.Error("FAILED", "error", err.Error())
		return 1
	}
	return 0
}

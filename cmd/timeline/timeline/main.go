package timeline

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/dynk8s/dynk8s/cmd/internal/kubeclient"
	"github.com/dynk8s/dynk8s/infra/config"
)

// Main is cmd/timeline: it parses args, reads the pool from the stack file, runs the timeline against the cluster of
// the operator's kubeconfig and returns the exit status: 0 when the pod ran within the limit, 1 past it or on an
// error, 2 on bad usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("timeline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pool := fs.String("pool", "", "the node pool to scale up (required): its name in the stack's nodePools")
	stack := fs.String("stack", "dev", "stack name: reads the pool from Pulumi.<stack>.yaml")
	configFile := fs.String("config", "", "stack config file to read instead of Pulumi.<stack>.yaml")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG, else ~/.kube/config)")
	kubeContext := fs.String("context", "", "kubeconfig context (default: the current one)")
	namespace := fs.String("namespace", "default", "namespace of the pod")
	fuse := fs.Bool("fuse", false, "the pod requests one github.com/fuse device, as a build agent does")
	image := fs.String("image", "", "the pod's image (default: the pause image of the stack's Kubernetes minor, "+
		"which every node has)")
	limit := fs.Duration("limit", 15*time.Minute, "exit 1 if the pod does not run within this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *pool == "" || *limit <= 0 {
		fmt.Fprintln(stderr, "timeline: usage: timeline -pool NAME [-stack NAME | -config FILE] [-fuse] [-limit 60s]")
		return 2
	}
	file := *configFile
	if file == "" {
		file = "Pulumi." + *stack + ".yaml"
	}
	opts, err := options(file, *pool)
	if err != nil {
		fmt.Fprintf(stderr, "timeline: %v\n", err)
		return 1
	}
	opts.Namespace, opts.Fuse, opts.Limit = *namespace, *fuse, *limit
	if *image != "" {
		opts.Image = *image
	}

	client, err := kubeclient.New(*kubeconfig, *kubeContext)
	if err != nil {
		fmt.Fprintf(stderr, "timeline: %v\n", err)
		return 1
	}
	if _, err := Run(ctx, client, opts, stdout); err != nil {
		// Past the limit, interrupted, or failed: the pod is gone either way, and the status says it did not run
		// in time.
		fmt.Fprintf(stderr, "timeline: %v\n", err)
		return 1
	}
	return 0
}

// options reads the pool's taints and the nodes' pause image from a stack file.
func options(file, pool string) (Options, error) {
	sc, err := config.LoadStackFile(file)
	if err != nil {
		return Options{}, fmt.Errorf("read %s: %w", file, err)
	}
	cfg, err := config.ParseValues(sc.Values)
	if err != nil {
		return Options{}, err
	}
	i := slices.IndexFunc(cfg.NodePools, func(p config.NodePool) bool { return p.Name == pool })
	if i < 0 {
		var names []string
		for _, p := range cfg.NodePools {
			names = append(names, p.Name)
		}
		return Options{}, fmt.Errorf("%s has no node pool %q (pools: %v)", file, pool, names)
	}
	return Options{
		Pool:   pool,
		Taints: cfg.NodePools[i].Taints,
		Image:  "registry.k8s.io/pause:" + cfg.Derived.Kubernetes.Pause,
	}, nil
}

// Package plan runs the dynk8s program under the mock engine (cmd/plan/mockcloud) and presents what it declares: a
// table, a JSON document (a stable interface for tests and reviewers) and the rendered artifacts. cmd/plan is its
// command line; the tests of every package use it to run the real program.
package plan

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
)

// ConfigError is a stack configuration the program refused.
type ConfigError = config.Error

// Output is one stack output as resolved under the mock engine.
type Output struct {
	Value  any
	Secret bool
}

// Result is what one run declared.
type Result struct {
	Stack   string
	Cloud   *mockcloud.Cloud
	Outputs map[string]Output
}

// Run runs the program for stack with the config in file (a Pulumi.<stack>.yaml).
func Run(stack, file string) (*Result, error) {
	cfg, err := mockcloud.LoadStackFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading stack config: %w", err)
	}
	return RunConfig(stack, cfg)
}

// RunConfig runs the program for stack with cfg. On error the result still holds what was declared.
func RunConfig(stack string, cfg mockcloud.StackConfig) (*Result, error) {
	// The stand-in cluster is set up as the stack says, as a correctly set up one is.
	cloud := mockcloud.NewFor(cfg)
	if cfg.ClusterServer != "" {
		cloud.ClusterServer = cfg.ClusterServer
	}
	if cfg.ClusterVersion != "" {
		cloud.ClusterVersion = cfg.ClusterVersion
	}
	if cfg.ClusterPodSubnet != "" {
		cloud.ClusterPodSubnet = cfg.ClusterPodSubnet
	}
	if cfg.ClusterServiceSubnet != "" {
		cloud.ClusterServiceSubnet = cfg.ClusterServiceSubnet
	}
	cloud.EBSDefaultKey = cfg.EBSDefaultKey
	cloud.Caller, cloud.CallerRolePath = cfg.Caller, cfg.CallerRolePath
	cloud.NoBakedImage = cfg.NoBakedImage
	for pool, arch := range cfg.BakedArch {
		if cloud.BakedArch == nil {
			cloud.BakedArch = map[string]string{}
		}
		cloud.BakedArch[pool] = arch
	}
	res := &Result{Stack: stack, Cloud: cloud, Outputs: map[string]Output{}}
	err := mockcloud.Run(func(ctx *pulumi.Context) error {
		exports, err := infra.Program(ctx, slices.Sorted(maps.Keys(cfg.Values)), infra.AgentOrStandIn(cfg.AgentDir),
			standInOnPremNodes(cfg.OnPremNodes))
		if err != nil {
			return err
		}
		for _, e := range exports {
			out := pulumi.ToOutput(e.Value)
			v, secret, err := mockcloud.Await(out)
			if err != nil {
				return fmt.Errorf("output %s: %w", e.Name, err)
			}
			res.Outputs[e.Name] = Output{Value: v, Secret: secret}
		}
		return nil
	}, stack, cfg, cloud)
	// The result is returned with the error too: what was declared before the error is part of the story (for a
	// refused config: nothing).
	return res, err
}

// Resources are the declared resources in a stable order: by name, then type.
func (r *Result) Resources() []mockcloud.Resource {
	rs := r.Cloud.Resources()
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].Name != rs[j].Name {
			return rs[i].Name < rs[j].Name
		}
		return rs[i].Type < rs[j].Type
	})
	return rs
}

// standInOnPremNodes is the stand-in cluster's answer for its Nodes labelled kube.LabelOnPrem: ready (Ready ones),
// or one Ready Node, onprem-1, when ready is nil, as in a cluster whose operator followed the README.
func standInOnPremNodes(ready []string) infra.OnPremNodes {
	if ready == nil {
		ready = []string{"onprem-1"}
	}
	return func(context.Context, *config.Config) (infra.OnPremNodeState, error) {
		return infra.OnPremNodeState{Ready: ready}, nil
	}
}

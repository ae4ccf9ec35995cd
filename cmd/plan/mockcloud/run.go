package mockcloud

import (
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// Project is the Pulumi project name of dynk8s.
const Project = "dynk8s"

// StackConfig is a stack's configuration as the engine hands it to a program, and what the mock cloud answers
// differently for it.
type StackConfig struct {
	config.StackValues
	// ClusterServer overrides the API server the stand-in cluster-info names (Cloud.ClusterServer); by default
	// the plan takes the configured kubernetes.apiServerEndpoint.
	ClusterServer string
	// ClusterVersion overrides the control plane version the stand-in kubeadm-config names (Cloud.ClusterVersion);
	// by default the plan takes the configured kubernetes.version.
	ClusterVersion string
	// ClusterPodSubnet and ClusterServiceSubnet override the networking the stand-in kubeadm-config states; by
	// default the plan takes the configured kubernetes.podCidr and serviceCidr.
	ClusterPodSubnet, ClusterServiceSubnet string
	// EBSDefaultKey sets Cloud.EBSDefaultKey: a customer-managed default EBS key.
	EBSDefaultKey string
	// OnPremNodes are the Ready Nodes labelled node-restriction.kubernetes.io/dynk8s-onprem the stand-in cluster has
	// (nil: one, as the README's step leaves a cluster; empty: none).
	OnPremNodes []string
	// Caller and CallerRolePath set Cloud.Caller and Cloud.CallerRolePath: who runs the program.
	Caller, CallerRolePath string
	// NoBakedImage sets Cloud.NoBakedImage: the pools never baked, whose preview fails with the bake command.
	NoBakedImage []string
	// BakedArch overrides Cloud.BakedArch's architectures of the pools' baked images, by pool name.
	BakedArch map[string]string
	// AgentDir is where the plan takes the built node agent from, when it was built there ("": always the
	// stand-in, infra.AgentOrStandIn).
	AgentDir string
}

// Run runs program under the mock engine for stack with cfg and returns the recorded cloud. A program error is
// returned as is.
func Run(program pulumi.RunFunc, stack string, cfg StackConfig, cloud *Cloud) error {
	withConfig := func(info *pulumi.RunInfo) {
		info.Config = cfg.Values
		info.ConfigSecretKeys = cfg.SecretKeys
	}
	return pulumi.RunErr(program, pulumi.WithMocks(Project, stack, cloud), withConfig)
}

// LoadStackFile reads a Pulumi.<stack>.yaml file into the form Run takes (config.LoadStackFile).
func LoadStackFile(path string) (StackConfig, error) {
	v, err := config.LoadStackFile(path)
	return StackConfig{StackValues: v}, err
}

// ConfigFromMap turns the config: map of a stack file into the form Run takes (config.EngineValues).
func ConfigFromMap(values map[string]any) (StackConfig, error) {
	v, err := config.EngineValues(values)
	return StackConfig{StackValues: v}, err
}

// Object is the dynk8s object key of a stack's config values (config.ReadStackFile), created when absent, for tests to
// change.
func Object(values map[string]any, key string) map[string]any {
	m, ok := values["dynk8s:"+key].(map[string]any)
	if !ok {
		m = map[string]any{}
		values["dynk8s:"+key] = m
	}
	return m
}

// Pool is the i-th entry of a stack's dynk8s:nodePools, for tests to change.
func Pool(values map[string]any, i int) map[string]any {
	return values["dynk8s:nodePools"].([]any)[i].(map[string]any)
}

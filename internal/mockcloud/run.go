package mockcloud

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"sigs.k8s.io/yaml"
)

// Project is the Pulumi project name of dynk8s.
const Project = "dynk8s"

// SecretPlaceholder stands in for a config value stored encrypted in a stack file: the plan cannot decrypt it.
const SecretPlaceholder = "[secret]"

// StackConfig is a stack's configuration as the engine hands it to a program: every value a string (objects and
// lists JSON-encoded), plus the keys that are secret.
type StackConfig struct {
	Values     map[string]string
	SecretKeys []string
	// ClusterServer overrides the API server the stand-in cluster-info names (Cloud.ClusterServer); by default
	// the plan takes the configured kubernetes.apiServerEndpoint.
	ClusterServer string
	// ClusterVersion overrides the control plane version the stand-in kubeadm-config names (Cloud.ClusterVersion);
	// by default the plan takes the configured kubernetes.version.
	ClusterVersion string
	// EBSDefaultKey sets Cloud.EBSDefaultKey: a customer-managed default EBS key.
	EBSDefaultKey string
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

// LoadStackFile reads a Pulumi.<stack>.yaml file into the form Run takes. Values stored encrypted ({secure: ...})
// cannot be decrypted without the stack's secrets provider; they become SecretPlaceholder and their keys are
// listed as secret.
func LoadStackFile(path string) (StackConfig, error) {
	values, err := ReadStackFile(path)
	if err != nil {
		return StackConfig{}, err
	}
	cfg, err := ConfigFromMap(values)
	if err != nil {
		return StackConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ReadStackFile returns the config: map of a Pulumi.<stack>.yaml file as YAML values.
func ReadStackFile(path string) (map[string]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file struct {
		Config map[string]any `json:"config"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return file.Config, nil
}

// ConfigFromMap turns the config: map of a stack file (namespaced keys to YAML values) into the form Run takes.
func ConfigFromMap(values map[string]any) (StackConfig, error) {
	cfg := StackConfig{Values: map[string]string{}}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.Contains(k, ":") {
			return StackConfig{}, fmt.Errorf("config key %q has no namespace (want e.g. dynk8s:%s)", k, k)
		}
		v, secret := replaceSecure(values[k])
		if secret {
			cfg.SecretKeys = append(cfg.SecretKeys, k)
		}
		s, err := configString(v)
		if err != nil {
			return StackConfig{}, fmt.Errorf("%s: %w", k, err)
		}
		cfg.Values[k] = s
	}
	return cfg, nil
}

// configString renders a value as the engine passes it: strings as they are, other scalars in their plain form,
// objects and lists as JSON.
func configString(v any) (string, error) {
	switch t := v.(type) {
	case string:
		return t, nil
	case bool:
		return strconv.FormatBool(t), nil
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64), nil
	case nil:
		return "", nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// replaceSecure swaps every {secure: ...} leaf for SecretPlaceholder and says whether it found one.
func replaceSecure(v any) (any, bool) {
	switch t := v.(type) {
	case map[string]any:
		if _, ok := t["secure"]; ok && len(t) == 1 {
			return SecretPlaceholder, true
		}
		found := false
		out := make(map[string]any, len(t))
		for k, e := range t {
			r, s := replaceSecure(e)
			out[k], found = r, found || s
		}
		return out, found
	case []any:
		found := false
		out := make([]any, len(t))
		for i, e := range t {
			r, s := replaceSecure(e)
			out[i], found = r, found || s
		}
		return out, found
	}
	return v, false
}

// Object is the dynk8s object key of a stack's config values (ReadStackFile), created when absent, for tests to
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

package config

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The stack file reader: what `pulumi` would hand the program, read from a Pulumi.<stack>.yaml without the engine,
// for the offline plan, the tests, and the tools that run against a real cluster (cmd/timeline).

// SecretPlaceholder stands in for a config value stored encrypted in a stack file: it cannot be decrypted here.
const SecretPlaceholder = "[secret]"

// StackValues is a stack's configuration as the engine hands it to a program: every value a string (objects and
// lists JSON-encoded), plus the keys that are secret. ParseValues takes Values.
type StackValues struct {
	Values     map[string]string
	SecretKeys []string
}

// LoadStackFile reads a Pulumi.<stack>.yaml file as the engine would hand it over. Values stored encrypted
// ({secure: ...}) cannot be decrypted without the stack's secrets provider; they become SecretPlaceholder and their
// keys are listed as secret.
func LoadStackFile(path string) (StackValues, error) {
	values, err := ReadStackFile(path)
	if err != nil {
		return StackValues{}, err
	}
	cfg, err := EngineValues(values)
	if err != nil {
		return StackValues{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ReadStackFile returns the config: map of a Pulumi.<stack>.yaml file as JSON-shaped values (objects as
// map[string]any, numbers as float64). It reads the file as Pulumi does, with gopkg.in/yaml.v3 (the Pulumi SDK's
// encoding.YAML): YAML 1.2's scalars, so `spot: yes` is the string "yes", which config refuses as a boolean, not
// YAML 1.1's true; and a key given twice in one mapping is an error, not the last one winning.
func ReadStackFile(path string) (map[string]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file struct {
		Config map[string]any `yaml:"config"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// The JSON shape the rest of config reads (and sigs.k8s.io/yaml gave): a mapping whose keys are not all strings
	// is an error here.
	b, err := json.Marshal(file.Config)
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", path, err)
	}
	var values map[string]any
	if err := json.Unmarshal(b, &values); err != nil {
		return nil, fmt.Errorf("%s: config: %w", path, err)
	}
	return values, nil
}

// EngineValues turns the config: map of a stack file (namespaced keys to YAML values) into the form the engine
// hands a program.
func EngineValues(values map[string]any) (StackValues, error) {
	cfg := StackValues{Values: map[string]string{}}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.Contains(k, ":") {
			return StackValues{}, fmt.Errorf("config key %q has no namespace (want e.g. dynk8s:%s)", k, k)
		}
		v, secret := replaceSecure(values[k])
		if secret {
			cfg.SecretKeys = append(cfg.SecretKeys, k)
		}
		s, err := configString(v)
		if err != nil {
			return StackValues{}, fmt.Errorf("%s: %w", k, err)
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

package mockcloud

import (
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
)

// Placeholders for values that cannot be shown.
const (
	Redacted = "[secret]"
	Unknown  = "[unknown]"
)

// Plain converts a property value to plain Go data (maps, slices, strings, float64, bools) for JSON or YAML.
// Secrets become Redacted unless reveal is set; unknown values (in a preview) become Unknown; resource references
// become their URN.
func Plain(v resource.PropertyValue, reveal bool) any {
	switch {
	case v.IsSecret():
		if !reveal {
			return Redacted
		}
		return Plain(v.SecretValue().Element, reveal)
	case v.IsComputed():
		return Unknown
	case v.IsOutput():
		o := v.OutputValue()
		if !o.Known {
			return Unknown
		}
		if o.Secret && !reveal {
			return Redacted
		}
		return Plain(o.Element, reveal)
	case v.IsNull():
		return nil
	case v.IsBool():
		return v.BoolValue()
	case v.IsNumber():
		return v.NumberValue()
	case v.IsString():
		return v.StringValue()
	case v.IsArray():
		arr := v.ArrayValue()
		out := make([]any, len(arr))
		for i, e := range arr {
			out[i] = Plain(e, reveal)
		}
		return out
	case v.IsObject():
		return PlainMap(v.ObjectValue(), reveal)
	case v.IsResourceReference():
		return string(v.ResourceReferenceValue().URN)
	case v.IsAsset(), v.IsArchive():
		return "[asset]"
	}
	return nil
}

// PlainKeyed is Plain without reveal, except that a secret map keeps its keys and hides only their values: what a
// reviewer of a Kubernetes Secret needs to see.
func PlainKeyed(v resource.PropertyValue) any {
	switch {
	case v.IsSecret() && v.SecretValue().Element.IsObject():
		out := map[string]any{}
		for k := range v.SecretValue().Element.ObjectValue() {
			out[string(k)] = Redacted
		}
		return out
	case v.IsObject():
		out := map[string]any{}
		for k, e := range v.ObjectValue() {
			out[string(k)] = PlainKeyed(e)
		}
		return out
	case v.IsArray():
		arr := v.ArrayValue()
		out := make([]any, len(arr))
		for i, e := range arr {
			out[i] = PlainKeyed(e)
		}
		return out
	}
	return Plain(v, false)
}

// PlainMap converts a property map, see Plain.
func PlainMap(m resource.PropertyMap, reveal bool) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[string(k)] = Plain(v, reveal)
	}
	return out
}

// ContainsSecret reports whether any value inside v is marked secret.
func ContainsSecret(v resource.PropertyValue) bool {
	switch {
	case v.IsSecret():
		return true
	case v.IsOutput():
		return v.OutputValue().Secret || ContainsSecret(v.OutputValue().Element)
	case v.IsArray():
		for _, e := range v.ArrayValue() {
			if ContainsSecret(e) {
				return true
			}
		}
	case v.IsObject():
		for _, e := range v.ObjectValue() {
			if ContainsSecret(e) {
				return true
			}
		}
	}
	return false
}

// Strings returns every string inside v, secrets revealed, in a stable order: for scans of what a value contains.
func Strings(v resource.PropertyValue) []string {
	var out []string
	var walk func(any)
	walk = func(x any) {
		switch t := x.(type) {
		case string:
			out = append(out, t)
		case []any:
			for _, e := range t {
				walk(e)
			}
		case map[string]any:
			keys := make([]string, 0, len(t))
			for k := range t {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(t[k])
			}
		}
	}
	walk(Plain(v, true))
	return out
}

// Manifest renders a Kubernetes resource's recorded inputs as a YAML manifest (secret values as "[secret]", with
// their keys) and names its file <kind>-<namespace>-<name>.yaml.
func Manifest(res Resource) (string, []byte, error) {
	obj, _ := PlainKeyed(resource.NewObjectProperty(res.Inputs)).(map[string]any)
	meta, _ := obj["metadata"].(map[string]any)
	kind, _ := obj["kind"].(string)
	name, _ := meta["name"].(string)
	namespace, _ := meta["namespace"].(string)
	if kind == "" || name == "" {
		return "", nil, fmt.Errorf("kubernetes resource %s has no kind or metadata.name", res.Name)
	}
	parts := []string{strings.ToLower(kind)}
	if namespace != "" {
		parts = append(parts, namespace)
	}
	parts = append(parts, strings.ReplaceAll(name, ":", "-"))
	doc, err := yaml.Marshal(obj)
	if err != nil {
		return "", nil, fmt.Errorf("manifest of %s: %w", res.Name, err)
	}
	return strings.Join(parts, "-") + ".yaml", doc, nil
}

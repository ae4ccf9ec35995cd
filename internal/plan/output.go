package plan

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/internal/mockcloud"
)

// Banner says what the plan is and is not.
const Banner = "offline plan: cloud lookups (AMIs, zones, account, random values, the cluster's CA) are " +
	"stand-ins; the real run is `pulumi preview` / `pulumi up`"

// JSONResource is one resource in the JSON document.
type JSONResource struct {
	Type          string         `json:"type"`
	Name          string         `json:"name"`
	Parent        string         `json:"parent"`
	Inputs        map[string]any `json:"inputs"`
	IgnoreChanges []string       `json:"ignoreChanges"`
	Protect       bool           `json:"protect"`
	// AdditionalSecretOutputs are the outputs the engine stores as secrets.
	AdditionalSecretOutputs []string `json:"additionalSecretOutputs,omitempty"`
	// Read marks a resource the program reads from the cloud rather than declares.
	Read bool `json:"read,omitempty"`
}

// JSONDocument is the JSON form of a plan.
type JSONDocument struct {
	Stack     string         `json:"stack"`
	Note      string         `json:"note"`
	Resources []JSONResource `json:"resources"`
	Outputs   map[string]any `json:"outputs"`
}

// Document is the JSON form of the result; every secret value is "[secret]".
func (r *Result) Document() JSONDocument {
	doc := JSONDocument{Stack: r.Stack, Note: Banner, Outputs: map[string]any{}}
	for _, res := range r.Resources() {
		ignore := res.IgnoreChanges
		if ignore == nil {
			ignore = []string{}
		}
		doc.Resources = append(doc.Resources, JSONResource{
			Type:                    res.Type,
			Name:                    res.Name,
			Parent:                  res.Parent,
			Inputs:                  mockcloud.PlainMap(res.Inputs, false),
			IgnoreChanges:           ignore,
			Protect:                 res.Protect,
			AdditionalSecretOutputs: res.AdditionalSecretOutputs,
			Read:                    res.Read,
		})
	}
	for k, o := range r.Outputs {
		if o.Secret {
			doc.Outputs[k] = mockcloud.Redacted
		} else {
			doc.Outputs[k] = o.Value
		}
	}
	return doc
}

// WriteJSON writes the JSON document, indented.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.Document())
}

// WriteTable writes a readable tree of the resources and the outputs.
func (r *Result) WriteTable(w io.Writer) error {
	resources := r.Resources()
	children := map[string][]mockcloud.Resource{}
	components := 0
	for _, res := range resources {
		children[res.Parent] = append(children[res.Parent], res)
		if !res.Custom && !res.Read && !strings.HasPrefix(res.Type, "pulumi:providers:") {
			components++
		}
	}
	fmt.Fprintf(w, "dynk8s stack %q: %d resources (%d components)\n%s\n\n", r.Stack, len(resources), components, Banner)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tNOTE")
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		for _, res := range children[parent] {
			var notes []string
			if res.Read {
				notes = append(notes, "read")
			}
			if len(res.IgnoreChanges) > 0 {
				notes = append(notes, "ignores "+strings.Join(res.IgnoreChanges, ","))
			}
			if mockcloud.ContainsSecret(objectValue(res)) {
				notes = append(notes, "has secret inputs")
			}
			fmt.Fprintf(tw, "%s%s\t%s\t%s\n", strings.Repeat("  ", depth), res.Name, res.Type, strings.Join(notes, "; "))
			if res.Name != parent {
				walk(res.Name, depth+1)
			}
		}
	}
	walk("", 0)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nOutputs:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, k := range slices.Sorted(maps.Keys(r.Outputs)) {
		o := r.Outputs[k]
		v, isString := o.Value.(string)
		if o.Secret {
			v = mockcloud.Redacted
		} else if !isString {
			b, err := json.Marshal(o.Value)
			if err != nil {
				return fmt.Errorf("output %s: %w", k, err)
			}
			v = string(b)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", k, v)
	}
	return tw.Flush()
}

// WriteArtifacts writes what the stack renders: decoded user data per pool and for the gateway, the in-cluster
// manifests, and the on-prem WireGuard config.
func (r *Result) WriteArtifacts(dir string) error {
	write := func(rel string, data []byte, mode os.FileMode) error {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, data, mode)
	}
	for _, res := range r.Resources() {
		switch {
		case res.Type == "aws:ec2/launchTemplate:LaunchTemplate":
			data, err := decodeUserData(res, "userData")
			if err != nil {
				return err
			}
			pool := strings.TrimSuffix(strings.TrimPrefix(res.Name, "pool-"), "-lt")
			if err := write(filepath.Join("userdata", pool+".yaml"), data, 0o644); err != nil {
				return err
			}
		case res.Type == "aws:ec2/instance:Instance":
			data, err := decodeUserData(res, "userDataBase64")
			if err != nil {
				return err
			}
			if err := write(filepath.Join("userdata", res.Name+".yaml"), data, 0o644); err != nil {
				return err
			}
		case strings.HasPrefix(res.Type, "kubernetes:") && !strings.HasPrefix(res.Type, "pulumi:") && !res.Read:
			name, doc, err := Manifest(res)
			if err != nil {
				return err
			}
			if err := write(filepath.Join("manifests", name), doc, 0o644); err != nil {
				return err
			}
		}
	}
	if o, ok := r.Outputs["onPremWireGuardConfig"]; ok {
		// The on-prem config is the operator's to install; in a plan its keys are stand-ins.
		if err := write(filepath.Join("wireguard", "onprem.conf"), []byte(fmt.Sprint(o.Value)), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Manifest renders a Kubernetes resource's recorded inputs as a YAML manifest (secret values as "[secret]", with
// their keys) and names
// its file <kind>-<namespace>-<name>.yaml.
func Manifest(res mockcloud.Resource) (string, []byte, error) {
	obj, _ := mockcloud.PlainKeyed(resource.NewObjectProperty(res.Inputs)).(map[string]any)
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

func decodeUserData(res mockcloud.Resource, key string) ([]byte, error) {
	v, ok := res.Inputs[resourceKey(key)]
	if !ok {
		return nil, fmt.Errorf("%s has no %s", res.Name, key)
	}
	s, ok := mockcloud.Plain(v, true).(string)
	if !ok {
		return nil, fmt.Errorf("%s: %s is not a string", res.Name, key)
	}
	data, err := cloudinit.Decode(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", res.Name, key, err)
	}
	return data, nil
}

func resourceKey(k string) resource.PropertyKey { return resource.PropertyKey(k) }

// objectValue wraps a resource's inputs as one value, for scans.
func objectValue(res mockcloud.Resource) resource.PropertyValue {
	return resource.NewObjectProperty(res.Inputs)
}

package plan

import (
	"bytes"
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

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
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
	// DeleteBeforeReplace, ReplaceOnChanges and DependsOn are the resource options of those names (dependsOn as
	// resource names): what decides the order of a replacement or a first create.
	DeleteBeforeReplace bool     `json:"deleteBeforeReplace,omitempty"`
	ReplaceOnChanges    []string `json:"replaceOnChanges,omitempty"`
	DependsOn           []string `json:"dependsOn,omitempty"`
	// Read marks a resource the program reads from the cloud rather than declares.
	Read bool `json:"read,omitempty"`
}

// JSONDocument is the JSON form of a plan.
type JSONDocument struct {
	Stack     string         `json:"stack"`
	Note      string         `json:"note"`
	Resources []JSONResource `json:"resources"`
	Outputs   map[string]any `json:"outputs"`
	// IdleBill is what the stack bills with every pool at its minimum (zero unless minSize), and what nodes add.
	IdleBill IdleBill `json:"idleBill"`
	// BakedImages are the images the baked pools boot, as the program looked them up (none without a baked pool).
	BakedImages []BakedImage `json:"bakedImages,omitempty"`
}

// Document is the JSON form of the result; every secret value is "[secret]".
func (r *Result) Document() JSONDocument { return r.document(false) }

// FilePointer prefixes an input value that Artifacts holds as a file of its own, in DocumentWithFiles.
const FilePointer = "@file:"

// DocumentWithFiles is Document with every embedded document (user data, IAM policies, manifests) replaced by
// FilePointer and its path in Artifacts: the form `plan -out` writes as plan.json, readable beside the files.
func (r *Result) DocumentWithFiles() JSONDocument { return r.document(true) }

func (r *Result) document(pointers bool) JSONDocument {
	doc := JSONDocument{Stack: r.Stack, Note: Banner, Outputs: map[string]any{}, IdleBill: r.IdleBill(),
		BakedImages: r.BakedImages()}
	for _, res := range r.Resources() {
		ignore := res.IgnoreChanges
		if ignore == nil {
			ignore = []string{}
		}
		inputs := mockcloud.PlainMap(res.Inputs, false)
		if pointers {
			for _, e := range ArtifactsOf(res) {
				if e.Input == "" {
					inputs = map[string]any{"manifest": FilePointer + e.Path}
				} else {
					inputs[e.Input] = FilePointer + e.Path
				}
			}
		}
		doc.Resources = append(doc.Resources, JSONResource{
			Type:                    res.Type,
			Name:                    res.Name,
			Parent:                  res.Parent,
			Inputs:                  inputs,
			IgnoreChanges:           ignore,
			Protect:                 res.Protect,
			AdditionalSecretOutputs: res.AdditionalSecretOutputs,
			DeleteBeforeReplace:     res.DeleteBeforeReplace,
			ReplaceOnChanges:        res.ReplaceOnChanges,
			DependsOn:               res.DependsOn,
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
			if note := agentNote(res); note != "" {
				notes = append(notes, note)
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
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := r.WriteBakedImages(w); err != nil {
		return err
	}
	return r.IdleBill().WriteIdleBill(w)
}

// WriteArtifacts writes Artifacts under dir.
func (r *Result) WriteArtifacts(dir string) error {
	files, err := r.Artifacts()
	if err != nil {
		return err
	}
	for _, rel := range slices.Sorted(maps.Keys(files)) {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		// The on-prem config is the operator's to install, and may hold a private key (a stand-in, in a plan).
		mode := os.FileMode(0o644)
		if rel == OnPremConfigFile {
			mode = 0o600
		}
		if err := os.WriteFile(path, files[rel], mode); err != nil {
			return err
		}
	}
	return nil
}

// Artifact paths of the plan itself and of the on-prem peer's wg-quick file.
const (
	PlanFile         = "plan.json"
	OnPremConfigFile = "wireguard/onprem.conf"
)

// policyInputs are the resource inputs that hold an IAM policy document as a JSON string.
var policyInputs = []string{"assumeRolePolicy", "policy"}

// Artifacts are the documents the stack renders, by relative path: plan.json (DocumentWithFiles), the decoded user data per pool
// (userdata/<pool>.yaml) and for the gateway (userdata/gateway.yaml), every IAM policy document
// (iam/<resource>.<input>.json, indented), every in-cluster manifest (manifests/<kind>-<namespace>-<name>.yaml) and
// the on-prem WireGuard config.
func (r *Result) Artifacts() (map[string][]byte, error) {
	var doc bytes.Buffer
	enc := json.NewEncoder(&doc)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r.DocumentWithFiles()); err != nil {
		return nil, err
	}
	files := map[string][]byte{PlanFile: doc.Bytes()}
	for _, res := range r.Resources() {
		for _, e := range ArtifactsOf(res) {
			data, err := e.render(res)
			if err != nil {
				return nil, err
			}
			files[e.Path] = data
		}
	}
	if o, ok := r.Outputs["onPremWireGuardConfig"]; ok {
		files[OnPremConfigFile] = []byte(fmt.Sprint(o.Value))
	}
	return files, nil
}

// Embedded is one document embedded in a resource: the input that carries it (empty: the whole resource) and the
// artifact path it is written to.
type Embedded struct {
	Input  string
	Path   string
	render func(mockcloud.Resource) ([]byte, error)
}

// ArtifactsOf lists the documents embedded in one resource.
func ArtifactsOf(res mockcloud.Resource) []Embedded {
	var out []Embedded
	switch {
	case res.Type == "aws:ec2/launchTemplate:LaunchTemplate":
		pool := strings.TrimSuffix(strings.TrimPrefix(res.Name, "pool-"), "-lt")
		out = append(out, Embedded{Input: "userData", Path: filepath.Join("userdata", pool+".yaml"),
			render: func(res mockcloud.Resource) ([]byte, error) { return decodeUserData(res, "userData") }})
	case res.Type == "aws:ec2/instance:Instance":
		out = append(out, Embedded{Input: "userDataBase64", Path: filepath.Join("userdata", res.Name+".yaml"),
			render: func(res mockcloud.Resource) ([]byte, error) { return decodeUserData(res, "userDataBase64") }})
	case strings.HasPrefix(res.Type, "kubernetes:") && !res.Read:
		out = append(out, Embedded{Path: filepath.Join("manifests", manifestName(res)),
			render: func(res mockcloud.Resource) ([]byte, error) {
				_, doc, err := mockcloud.Manifest(res)
				return doc, err
			}})
	case strings.HasPrefix(res.Type, "aws:iam/"):
		for _, key := range policyInputs {
			if _, ok := res.Inputs[resourceKey(key)]; !ok {
				continue
			}
			out = append(out, Embedded{Input: key, Path: filepath.Join("iam", res.Name+"."+key+".json"),
				render: func(res mockcloud.Resource) ([]byte, error) { return policyDocument(res, key) }})
		}
	}
	return out
}

// manifestName is Manifest's file name, or the resource name when the object has no kind or name (Manifest then
// reports the error).
func manifestName(res mockcloud.Resource) string {
	name, _, err := mockcloud.Manifest(res)
	if err != nil {
		return res.Name + ".yaml"
	}
	return name
}

// policyDocument is an IAM policy input, indented.
func policyDocument(res mockcloud.Resource, key string) ([]byte, error) {
	s, ok := mockcloud.Plain(res.Inputs[resourceKey(key)], false).(string)
	if !ok {
		return nil, fmt.Errorf("%s: %s is not a string", res.Name, key)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, []byte(s), "", "  "); err != nil {
		return nil, fmt.Errorf("%s: %s is not JSON: %w", res.Name, key, err)
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
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

// agentNote shows a node agent object's pinned hash, and says when it is the stand-in of an agent not built.
func agentNote(res mockcloud.Resource) string {
	if res.Type != "aws:s3/bucketObjectv2:BucketObjectv2" {
		return ""
	}
	meta, _ := mockcloud.PlainMap(res.Inputs, false)["metadata"].(map[string]any)
	note := "sha256 " + str(meta["sha256"])
	if _, standIn := meta["stand-in"]; standIn {
		note += " (stand-in: the agent is not built, `make build` builds it)"
	}
	return note
}

package infra

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// Namespace is the Pulumi config namespace of dynk8s keys.
const Namespace = "dynk8s"

// FieldError is one configuration problem, located by its key path as `pulumi config set --path` spells it,
// e.g. dynk8s:nodePools[1].maxSize.
type FieldError struct {
	Path string
	Msg  string
}

func (e FieldError) Error() string { return e.Path + ": " + e.Msg }

// ConfigError lists every problem found in a stack's configuration, in key order.
type ConfigError struct {
	Errors []FieldError
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid dynk8s configuration (%d problem", len(e.Errors))
	if len(e.Errors) != 1 {
		b.WriteString("s")
	}
	b.WriteString("); nothing was declared:")
	for _, fe := range e.Errors {
		b.WriteString("\n  " + fe.Error())
	}
	return b.String()
}

// LoadConfig reads the stack configuration once, applies defaults and validates it. On any problem it returns a
// *ConfigError listing all of them, and the caller declares nothing.
func LoadConfig(ctx *pulumi.Context) (*Config, error) {
	return ParseConfig(ctx.GetConfig)
}

// ParseConfig is LoadConfig over any source of raw config values: get returns the value of a fully qualified key
// ("dynk8s:nodePools") as the engine passes it, objects and lists JSON-encoded.
func ParseConfig(get func(key string) (string, bool)) (*Config, error) {
	p := &parser{}
	cfg := p.parse(get)
	validate(p, cfg)
	if len(p.errs) > 0 {
		sort.SliceStable(p.errs, func(i, j int) bool { return pathLess(p.errs[i].Path, p.errs[j].Path) })
		return nil, &ConfigError{Errors: p.errs}
	}
	return cfg, nil
}

// KnownKeys lists every config key path dynk8s reads, list indices written as [i]: the reference the
// documentation is checked against.
func KnownKeys() []string {
	p := &parser{keys: map[string]bool{}}
	p.parse(func(key string) (string, bool) {
		p.keys[key] = true
		if key == Namespace+":nodePools" {
			return `[{"taints": [{}]}]`, true
		}
		return "", false
	})
	out := make([]string, 0, len(p.keys))
	for k := range p.keys {
		out = append(out, indexRE.ReplaceAllString(k, "[i]"))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

var indexRE = regexp.MustCompile(`\[\d+\]`)

// parser collects errors while reading raw values; it never stops at the first one.
type parser struct {
	errs []FieldError
	// keys records every key path read, for KnownKeys.
	keys map[string]bool
}

// addf records a problem at path. Only the first problem of a path is kept, and none below a path that already
// failed: a value that failed to parse is not also reported as missing or out of range by the validation that
// follows, nor are the keys of a map that was not a map.
func (p *parser) addf(path, format string, args ...any) {
	if p.failed(path) {
		return
	}
	p.errs = append(p.errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) failed(path string) bool {
	for _, e := range p.errs {
		if e.Path == path || strings.HasPrefix(path, e.Path+".") || strings.HasPrefix(path, e.Path+"[") {
			return true
		}
	}
	return false
}

// topLevel reads one namespaced key. Scalars arrive as plain strings, objects and lists as JSON.
func (p *parser) topLevel(get func(string) (string, bool), key string, structured bool) (any, bool) {
	raw, ok := get(key)
	if !ok {
		return nil, false
	}
	if !structured {
		return raw, true
	}
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		p.addf(key, "must be a structured value (a YAML map or list), got %q", truncate(raw, 40))
		return nil, false
	}
	return v, true
}

// object is a config map being read, with the keys read so far, so that unknown (misspelt) keys are reported.
type object struct {
	p    *parser
	path string
	m    map[string]any
	read map[string]bool
}

// object starts reading v (nil: an empty object) found at path.
func (p *parser) object(path string, v any) *object {
	o := &object{p: p, path: path, m: map[string]any{}, read: map[string]bool{}}
	switch t := v.(type) {
	case nil:
	case map[string]any:
		o.m = t
	default:
		p.addf(path, "must be a map of keys to values, got %s", describe(v))
	}
	return o
}

func (o *object) keyPath(key string) string { return childPath(o.path, key) }

func (o *object) get(key string) (any, bool) {
	o.read[key] = true
	if o.p.keys != nil {
		o.p.keys[o.keyPath(key)] = true
	}
	v, ok := o.m[key]
	if ok && v == nil {
		return nil, false
	}
	return v, ok
}

// done reports every key of the object that was never read.
func (o *object) done() {
	var unknown []string
	for k := range o.m {
		if !o.read[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	known := make([]string, 0, len(o.read))
	for k := range o.read {
		known = append(known, k)
	}
	sort.Strings(known)
	for _, k := range unknown {
		o.p.addf(o.keyPath(k), "unknown key (known keys here: %s)", strings.Join(known, ", "))
	}
}

func (o *object) has(key string) bool {
	_, ok := o.get(key)
	return ok
}

func (o *object) str(key, def string) string {
	v, ok := o.get(key)
	if !ok {
		return def
	}
	switch t := v.(type) {
	case string:
		return t
	case float64:
		// `pulumi config set --path` stores 1.34 as a number; a version or a name is still meant as text.
		return strconv.FormatFloat(t, 'f', -1, 64)
	}
	o.p.addf(o.keyPath(key), "must be a string, got %s", describe(v))
	return def
}

func (o *object) integer(key string, def int) int {
	v, ok := o.get(key)
	if !ok {
		return def
	}
	n, err := toInt(v)
	if err != nil {
		o.p.addf(o.keyPath(key), "%v", err)
		return def
	}
	return n
}

func (o *object) boolean(key string, def bool) bool {
	v, ok := o.get(key)
	if !ok {
		return def
	}
	switch t := v.(type) {
	case bool:
		return t
	case string:
		if b, err := strconv.ParseBool(t); err == nil {
			return b
		}
	}
	o.p.addf(o.keyPath(key), "must be true or false, got %s", describe(v))
	return def
}

func (o *object) strList(key string) []string {
	v, ok := o.get(key)
	if !ok {
		return nil
	}
	list, ok := v.([]any)
	if !ok {
		o.p.addf(o.keyPath(key), "must be a list, got %s", describe(v))
		return nil
	}
	out := make([]string, 0, len(list))
	for i, e := range list {
		s, ok := e.(string)
		if !ok {
			o.p.addf(fmt.Sprintf("%s[%d]", o.keyPath(key), i), "must be a string, got %s", describe(e))
			continue
		}
		out = append(out, s)
	}
	return out
}

func (o *object) strMap(key string) map[string]string {
	v, ok := o.get(key)
	if !ok {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		o.p.addf(o.keyPath(key), "must be a map of strings, got %s", describe(v))
		return nil
	}
	out := make(map[string]string, len(m))
	for k, e := range m {
		s, ok := e.(string)
		if !ok {
			o.p.addf(childPath(o.keyPath(key), k), "must be a string, got %s", describe(e))
			continue
		}
		out[k] = s
	}
	return out
}

// list returns the elements of a list with their paths.
func (o *object) list(key string) ([]any, bool) {
	v, ok := o.get(key)
	if !ok {
		return nil, false
	}
	list, ok := v.([]any)
	if !ok {
		o.p.addf(o.keyPath(key), "must be a list, got %s", describe(v))
		return nil, false
	}
	return list, true
}

func toInt(v any) (int, error) {
	switch t := v.(type) {
	case float64:
		if t != math.Trunc(t) || math.Abs(t) > 1<<31 {
			return 0, fmt.Errorf("must be a whole number, got %v", t)
		}
		return int(t), nil
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(t))
		if err != nil {
			return 0, fmt.Errorf("must be a whole number, got %q", t)
		}
		return n, nil
	}
	return 0, fmt.Errorf("must be a whole number, got %s", describe(v))
}

// childPath appends key to path in `pulumi config set --path` syntax: dotted for plain keys, ["..."] for keys with
// dots or slashes (label keys).
func childPath(path, key string) string {
	if strings.ContainsAny(key, `./[]"`) || key == "" {
		return fmt.Sprintf("%s[%q]", path, key)
	}
	if strings.HasSuffix(path, ":") {
		return path + key
	}
	return path + "." + key
}

func describe(v any) string {
	switch t := v.(type) {
	case nil:
		return "nothing"
	case string:
		return fmt.Sprintf("the string %q", truncate(t, 40))
	case float64:
		return fmt.Sprintf("the number %v", t)
	case bool:
		return fmt.Sprintf("the boolean %v", t)
	case []any:
		return "a list"
	case map[string]any:
		return "a map"
	}
	return fmt.Sprintf("%T", v)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// pathLess orders key paths so that list indices sort numerically (nodePools[2] before nodePools[10]).
func pathLess(a, b string) bool {
	pa, pb := splitPath(a), splitPath(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] == pb[i] {
			continue
		}
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if ea == nil && eb == nil {
			return na < nb
		}
		return pa[i] < pb[i]
	}
	return len(pa) < len(pb)
}

func splitPath(p string) []string {
	return strings.FieldsFunc(p, func(r rune) bool { return r == '.' || r == '[' || r == ']' })
}

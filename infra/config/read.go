package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agext/levenshtein"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// FieldError is one configuration problem, located by its key path as `pulumi config set --path` spells it,
// e.g. dynk8s:nodePools[1].maxSize.
type FieldError struct {
	Path string
	Msg  string
}

func (e FieldError) Error() string { return e.Path + ": " + e.Msg }

// Error lists every problem found in a stack's configuration, in key order.
type Error struct {
	Errors []FieldError
}

func (e *Error) Error() string {
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

// Parse reads every key from get, applies the defaults and validates the result. get returns the raw value of a
// fully qualified key ("dynk8s:nodePools") as the engine passes it: scalars as text, objects and lists as JSON.
// keys are the fully qualified names of every key the stack sets, as the engine lists them: a key of the dynk8s
// namespace that the program does not read is a problem like any other. On any problem it returns an *Error listing
// all of them, and no Config.
func Parse(keys []string, get func(key string) (string, bool)) (*Config, error) {
	r := &reader{}
	cfg := &Config{}
	r.top(get, reflect.ValueOf(cfg).Elem())
	r.unknownTop(keys, reflect.TypeFor[Config]())
	validate(r, cfg)
	if len(r.errs) > 0 {
		slices.SortStableFunc(r.errs, func(a, b FieldError) int { return comparePaths(a.Path, b.Path) })
		return nil, &Error{Errors: r.errs}
	}
	return cfg, nil
}

// ParseValues is Parse of a stack's whole config as the engine hands it over: fully qualified keys to raw values.
func ParseValues(values map[string]string) (*Config, error) {
	return Parse(slices.Collect(maps.Keys(values)), func(k string) (string, bool) {
		v, ok := values[k]
		return v, ok
	})
}

// reader collects problems while decoding and validating; it never stops at the first one.
type reader struct {
	errs []FieldError
}

// addf records a problem at path. Only the first problem of a path is kept, and none below a path that already
// failed: a value that failed to decode is not also reported as missing or out of range by the validation that
// follows, nor are the keys of a map that was not a map.
func (r *reader) addf(path, format string, args ...any) {
	if r.failed(path) {
		return
	}
	r.errs = append(r.errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (r *reader) failed(path string) bool {
	for _, e := range r.errs {
		if e.Path == path || strings.HasPrefix(path, e.Path+".") || strings.HasPrefix(path, e.Path+"[") {
			return true
		}
	}
	return false
}

// topKey is the fully qualified key of a top-level field: its tag when it names a namespace, else in dynk8s's.
func topKey(f reflect.StructField) string {
	k := f.Tag.Get("key")
	if strings.Contains(k, ":") {
		return k
	}
	return Namespace + ":" + k
}

// top decodes the top-level keys: each is its own Pulumi config key; objects and lists arrive as JSON.
func (r *reader) top(get func(string) (string, bool), cfg reflect.Value) {
	for i := range cfg.NumField() {
		f := cfg.Type().Field(i)
		if f.Tag.Get("key") == "" {
			continue
		}
		key := topKey(f)
		raw, ok := get(key)
		var v any
		switch {
		case !ok:
		case f.Type.Kind() == reflect.Struct || f.Type.Kind() == reflect.Slice:
			if err := json.Unmarshal([]byte(raw), &v); err != nil {
				r.addf(key, "must be a structured value (a YAML map or list), got %q", truncate(raw, 40))
				continue
			}
		default:
			v = raw
		}
		if v == nil && f.Type.Kind() == reflect.Struct {
			v = map[string]any{} // an absent object still gets its defaults
		}
		if v != nil {
			r.value(key, v, cfg.Field(i))
		}
	}
}

// unknownTop reports the keys of the dynk8s namespace that no top-level field names, and the keys of a namespace a
// typo away from it (dynk8:, dnyk8s:), which would otherwise drop a whole section unread. Other namespaces (aws:,
// pulumi:, a provider's) belong to others and are left alone.
func (r *reader) unknownTop(keys []string, cfg reflect.Type) {
	var known []string
	for i := range cfg.NumField() {
		f := cfg.Field(i)
		if k, ok := strings.CutPrefix(topKey(f), Namespace+":"); ok && f.Tag.Get("key") != "" {
			known = append(known, k)
		}
	}
	slices.Sort(known)
	for _, key := range slices.Sorted(slices.Values(keys)) {
		k, ours := strings.CutPrefix(key, Namespace+":")
		switch {
		case !ours:
			if ns, rest, ok := strings.Cut(key, ":"); ok && levenshtein.Distance(ns, Namespace, nil) <= 2 {
				r.addf(key, "namespace %q is not %s: did you mean %s:%s?", ns, Namespace, Namespace, rest)
			}
		case slices.Contains(known, k):
		case removedKeys[key] != "":
			r.addf(key, "%s", removedKeys[key])
		default:
			r.addf(key, "%s", unknownKey(k, known))
		}
	}
}

// unknownKey is the message of a key no field names: the known key it is a misspelling of, when one is close (an
// edit distance of at most 2, or the same but for case), then every known key there.
func unknownKey(key string, known []string) string {
	best, dist := "", 3
	for _, k := range known {
		d := levenshtein.Distance(strings.ToLower(key), strings.ToLower(k), nil)
		if d < dist || (d == dist && k < best) {
			best, dist = k, d
		}
	}
	if best != "" && best != key {
		return fmt.Sprintf("unknown key: did you mean %s? (known keys here: %s)", best, strings.Join(known, ", "))
	}
	return fmt.Sprintf("unknown key (known keys here: %s)", strings.Join(known, ", "))
}

// object decodes a JSON object into the struct dst: each field from its key, or from its default when absent.
// Keys that no field names are reported, so a misspelt key never passes silently.
func (r *reader) object(path string, v any, dst reflect.Value) {
	var known []string
	for i := range dst.NumField() {
		if key := dst.Type().Field(i).Tag.Get("key"); key != "" {
			known = append(known, key)
		}
	}
	slices.Sort(known)
	m, ok := v.(map[string]any)
	if !ok {
		r.addf(path, "must be a map of keys to values (its keys: %s), got %s", strings.Join(known, ", "), describe(v))
		m = map[string]any{}
	}
	for i := range dst.NumField() {
		f := dst.Type().Field(i)
		key := f.Tag.Get("key")
		if key == "" {
			continue
		}
		fp := childPath(path, key)
		if e, ok := m[key]; ok && e != nil {
			r.value(fp, e, dst.Field(i))
		} else if def, ok := f.Tag.Lookup("default"); ok {
			r.value(fp, def, dst.Field(i))
		} else if _, leaf := parsers[f.Type]; !leaf && f.Type.Kind() == reflect.Struct {
			r.object(fp, map[string]any{}, dst.Field(i)) // an absent section still gets its defaults
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch kp := childPath(path, k); {
		case slices.Contains(known, k):
		case removedKeys[kp] != "":
			r.addf(kp, "%s", removedKeys[kp])
		default:
			r.addf(kp, "%s", unknownKey(k, known))
		}
	}
}

// value decodes v into dst by dst's type.
func (r *reader) value(path string, v any, dst reflect.Value) {
	if parse, ok := parsers[dst.Type()]; ok {
		out, err := parse(v)
		if err != nil {
			r.addf(path, "%v", err)
			return
		}
		dst.Set(reflect.ValueOf(out))
		return
	}
	switch dst.Kind() {
	case reflect.Pointer:
		elem := reflect.New(dst.Type().Elem())
		if r.value(path, v, elem.Elem()); !r.failed(path) {
			dst.Set(elem)
		}
	case reflect.String:
		if f, ok := v.(float64); ok && f != math.Trunc(f) {
			// YAML has read the digits as a number and dropped what made it text: 1.10 is 1.1, so a change from 1.1 to
			// 1.10 (a new rotation value, say) would change nothing.
			r.addf(path, "must be a string, got the number %v: quote it, or YAML drops its trailing zeros", f)
			return
		}
		s, err := text(v)
		if err != nil {
			r.addf(path, "%v", err)
			return
		}
		dst.SetString(s)
	case reflect.Int:
		n, err := toInt(v)
		if err != nil {
			r.addf(path, "%v", err)
			return
		}
		dst.SetInt(int64(n))
	case reflect.Float64:
		f, ok := v.(float64)
		if !ok {
			if str, isText := v.(string); isText {
				var err error
				if f, err = strconv.ParseFloat(strings.TrimSpace(str), 64); err == nil {
					ok = true
				}
			}
		}
		if !ok {
			r.addf(path, "must be a number, got %s", describe(v))
			return
		}
		dst.SetFloat(f)
	case reflect.Bool:
		b, err := toBool(v)
		if err != nil {
			r.addf(path, "%v", err)
			return
		}
		dst.SetBool(b)
	case reflect.Slice:
		list, ok := v.([]any)
		if !ok {
			r.addf(path, "must be a list, got %s", describe(v))
			return
		}
		out := reflect.MakeSlice(dst.Type(), len(list), len(list))
		for i, e := range list {
			r.element(fmt.Sprintf("%s[%d]", path, i), e, out.Index(i))
		}
		dst.Set(out)
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			r.addf(path, "must be a map, got %s", describe(v))
			return
		}
		out := reflect.MakeMapWithSize(dst.Type(), len(m))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			kp := childPath(path, k)
			key, val := reflect.New(dst.Type().Key()).Elem(), reflect.New(dst.Type().Elem()).Elem()
			r.value(kp, k, key)
			r.element(kp, m[k], val)
			if !r.failed(kp) {
				out.SetMapIndex(key, val)
			}
		}
		dst.Set(out)
	case reflect.Struct:
		r.object(path, v, dst)
	default:
		panic(fmt.Sprintf("config: no decoder for %s at %s", dst.Type(), path))
	}
}

// element decodes a list or map element: a plain string element must be a string, not a number that a key of its
// own would accept as text (a label value of 8 is a YAML slip: quote it, as a Kubernetes manifest must).
func (r *reader) element(path string, v any, dst reflect.Value) {
	if _, ok := v.(string); !ok && dst.Type() == reflect.TypeFor[string]() {
		r.addf(path, "must be a string, got %s", describe(v))
		return
	}
	r.value(path, v, dst)
}

// parsers decode the typed values: the one place each is parsed, with the message an operator sees.
var parsers = map[reflect.Type]func(v any) (any, error){
	reflect.TypeFor[netip.Prefix]():      textParser(parseCIDR),
	reflect.TypeFor[netip.Addr]():        textParser(parseIPv4),
	reflect.TypeFor[endpoint.HostPort](): textParser(endpoint.Parse),
	reflect.TypeFor[kube.Version]():      textParser(kube.ParseVersion),
	reflect.TypeFor[kube.Arch]():         textParser(parseArch),
	reflect.TypeFor[kube.TaintEffect]():  textParser(kube.ParseTaintEffect),
	reflect.TypeFor[wgtypes.Key]():       textParser(parsePublicKey),
	reflect.TypeFor[time.Duration]():     textParser(parseDuration),
	reflect.TypeFor[Zones]():             parseZones,
}

func textParser[T any](parse func(string) (T, error)) func(any) (any, error) {
	return func(v any) (any, error) {
		s, err := text(v)
		if err != nil {
			return nil, err
		}
		return parse(s)
	}
}

// parseCIDR parses an IPv4 network in canonical form (no host bits set).
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR (e.g. 10.200.0.0/16)", s)
	case !p.Addr().Is4():
		return netip.Prefix{}, fmt.Errorf("%s: only IPv4 ranges are supported", s)
	case p.Masked() != p:
		return netip.Prefix{}, fmt.Errorf("%s has host bits set; did you mean %s?", s, p.Masked())
	}
	return p, nil
}

// parseIPv4 parses one IPv4 address.
func parseIPv4(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return netip.Addr{}, fmt.Errorf("%q is not an IP address (e.g. 192.168.1.53)", s)
	case !a.Is4():
		return netip.Addr{}, fmt.Errorf("%s: only IPv4 addresses are supported", s)
	}
	return a, nil
}

func parseArch(s string) (kube.Arch, error) {
	a, err := kube.ParseArch(s)
	if err != nil {
		return "", fmt.Errorf("unknown arch: %w", err)
	}
	return a, nil
}

func parsePublicKey(s string) (wgtypes.Key, error) {
	k, err := wgtypes.ParseKey(s)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("must be a WireGuard public key (32 bytes, base64, 44 characters as " +
			"`wg pubkey` prints it)")
	}
	return k, nil
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("must be a duration such as 10m, got %q", s)
	}
	return d, nil
}

func parseZones(v any) (any, error) {
	if list, isList := v.([]any); isList {
		z := Zones{Names: make([]string, 0, len(list))}
		for i, e := range list {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("zone %d must be a zone name, got %s", i, describe(e))
			}
			z.Names = append(z.Names, s)
		}
		return z, nil
	}
	n, err := toInt(v)
	if err != nil {
		return nil, fmt.Errorf("must be a zone count or a list of zone names, got %s", describe(v))
	}
	return Zones{Count: n}, nil
}

// text is a string value; a number is taken as its text (`pulumi config set --path` stores 1.34 as a number, and a
// version or a name is still meant as text).
func text(v any) (string, error) {
	switch t := v.(type) {
	case string:
		return t, nil
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64), nil
	}
	return "", fmt.Errorf("must be a string, got %s", describe(v))
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

func toBool(v any) (bool, error) {
	switch t := v.(type) {
	case bool:
		return t, nil
	case string:
		if b, err := strconv.ParseBool(t); err == nil {
			return b, nil
		}
	}
	return false, fmt.Errorf("must be true or false, got %s", describe(v))
}

// childPath appends key to path in `pulumi config set --path` syntax: dotted for plain keys, ["..."] for keys with
// dots or slashes (label keys).
func childPath(path, key string) string {
	if strings.ContainsAny(key, `./[]"`) || key == "" {
		return fmt.Sprintf("%s[%q]", path, key)
	}
	if strings.HasSuffix(path, ":") || path == "" {
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

// comparePaths orders key paths so that list indices sort numerically (nodePools[2] before nodePools[10]).
func comparePaths(a, b string) int {
	pa, pb := splitPath(a), splitPath(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] == pb[i] {
			continue
		}
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if ea == nil && eb == nil {
			return na - nb
		}
		return strings.Compare(pa[i], pb[i])
	}
	return len(pa) - len(pb)
}

func splitPath(p string) []string {
	return strings.FieldsFunc(p, func(r rune) bool { return r == '.' || r == '[' || r == ']' })
}

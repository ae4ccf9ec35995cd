package config

//go:generate go run ./configdoc/gen -pulumi ../../Pulumi.yaml -md ../../docs/configuration.md

import (
	"reflect"
	"slices"
)

// Key is one configuration key dynk8s reads.
type Key struct {
	// Path is the key as `pulumi config set --path` spells it, list indices written as [i]:
	// dynk8s:nodePools[i].maxSize.
	Path string
	// Default is the value an absent key takes (the `default` tag), when HasDefault.
	Default    string
	HasDefault bool
	// Required is the `required` tag: validation reports the key missing (whatever else the key's doc says).
	Required bool
}

// Keys lists every key dynk8s reads, in path order, found from the Config type itself: the reference the
// documentation is checked against.
func Keys() []Key {
	var out []Key
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("key") != "" {
			out = appendKeys(out, topKey(f), f)
		}
	}
	slices.SortFunc(out, func(a, b Key) int { return comparePaths(a.Path, b.Path) })
	return out
}

func appendKeys(out []Key, path string, f reflect.StructField) []Key {
	def, hasDef := f.Tag.Lookup("default")
	out = append(out, Key{Path: path, Default: def, HasDefault: hasDef, Required: f.Tag.Get("required") == "true"})
	t := f.Type
	if t.Kind() == reflect.Pointer {
		t = t.Elem() // an optional value: its keys are those of what it points to
	}
	if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct {
		path, t = path+"[i]", t.Elem()
	}
	if _, leaf := parsers[t]; leaf || t.Kind() != reflect.Struct {
		return out
	}
	for i := range t.NumField() {
		if sf := t.Field(i); sf.Tag.Get("key") != "" {
			out = appendKeys(out, childPath(path, sf.Tag.Get("key")), sf)
		}
	}
	return out
}

// Package configdoc writes the configuration reference from the source of the config types: the `config:` block of
// Pulumi.yaml and docs/configuration.md. Each key's path comes from the `key` tags, its default from the `default`
// tag, whether it is required from the `required` tag, and its meaning from the field's doc comment, so a key is
// documented once, where it is declared. It reads the source with go/ast rather than the compiled types because the
// doc comments exist only there.
package configdoc

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Key is one configuration key, with the keys nested in it.
type Key struct {
	// Path is the key as `pulumi config set --path` spells it, list entries written [i]: dynk8s:nodePools[i].name.
	Path string
	// Name is the last segment of Path: name.
	Name string
	// Type is the key's YAML shape: string, integer, boolean, number, duration, list of strings, map, ...
	Type string
	// Default is the `default` tag's value, when HasDefault.
	Default    string
	HasDefault bool
	// Required is the `required` tag: validation reports the key missing.
	Required bool
	// Doc is the field's doc comment as one paragraph, its leading "Name is" dropped.
	Doc string
	// Keys are the keys of a map or of each entry of a list of maps.
	Keys []*Key
	// Object tells a map of keys (or a list of them: List) from a leaf value.
	Object, List bool
}

// leafTypes are the named types the config decodes from one value (infra/config's parsers), as their YAML shape. A
// named type that is neither here, nor a struct with keys, nor of a basic underlying type, is an error: the
// generator cannot tell how an operator writes it.
var leafTypes = map[string]string{
	"time.Duration":    "duration",
	"net/netip.Prefix": "string",
	"net/netip.Addr":   "string",
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes.Key": "string",
	"internal/endpoint.HostPort":                    "string",
	"infra/config.Zones":                            "integer or list of strings",
	"internal/kube.Version":                         "string",
}

var basicTypes = map[string]string{
	"string": "string", "int": "integer", "bool": "boolean", "float64": "number",
}

// Loader reads packages of one module from source.
type Loader struct {
	// Root is the module's directory and Module its path (go.mod's module line).
	Root, Module string
	// Dirs overrides where a package of the module is read from, by import path relative to Module
	// ("infra/config"): a test points it at an edited copy.
	Dirs map[string]string

	pkgs map[string]*pkg
}

type pkg struct {
	rel   string // import path relative to the module, or the full path outside it
	types map[string]*typeDecl
}

type typeDecl struct {
	spec    *ast.TypeSpec
	doc     *ast.CommentGroup
	imports map[string]string // file's import names to paths
}

// NewLoader finds the module that holds dir from its go.mod.
func NewLoader(dir string) (*Loader, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for {
		b, err := os.ReadFile(filepath.Join(root, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if m, ok := strings.CutPrefix(line, "module "); ok {
					return &Loader{Root: root, Module: strings.TrimSpace(m), Dirs: map[string]string{}}, nil
				}
			}
			return nil, fmt.Errorf("%s/go.mod names no module", root)
		}
		parent := filepath.Dir(root)
		if parent == root {
			return nil, fmt.Errorf("no go.mod above %s", dir)
		}
		root = parent
	}
}

// Keys are the keys of the struct type typeName in the package rel ("infra/config"), in declaration order.
// namespace qualifies a top-level key whose tag names none ("dynk8s" makes clusterName dynk8s:clusterName).
func (l *Loader) Keys(rel, typeName, namespace string) ([]*Key, error) {
	p, err := l.load(rel)
	if err != nil {
		return nil, err
	}
	d, ok := p.types[typeName]
	if !ok {
		return nil, fmt.Errorf("%s: no type %s", rel, typeName)
	}
	st, ok := d.spec.Type.(*ast.StructType)
	if !ok {
		return nil, fmt.Errorf("%s.%s is not a struct", rel, typeName)
	}
	return l.fields(p, d, st, func(key string) string {
		if strings.Contains(key, ":") {
			return key
		}
		return namespace + ":" + key
	})
}

func (l *Loader) fields(p *pkg, d *typeDecl, st *ast.StructType, path func(key string) string) ([]*Key, error) {
	var keys []*Key
	for _, f := range st.Fields.List {
		if f.Tag == nil || len(f.Names) != 1 {
			continue
		}
		tagText, err := strconv.Unquote(f.Tag.Value)
		if err != nil {
			return nil, err
		}
		tag := reflect.StructTag(tagText)
		name := tag.Get("key")
		if name == "" {
			continue
		}
		k := &Key{Path: path(name), Name: name, Required: tag.Get("required") == "true"}
		k.Default, k.HasDefault = tag.Lookup("default")
		if err := l.typeOf(p, d, f.Type, k); err != nil {
			return nil, fmt.Errorf("%s: %w", k.Path, err)
		}
		k.Doc = docText(f.Doc, f.Names[0].Name)
		if k.Doc == "" && k.Object && !k.List {
			if td := l.structDecl(p, d, f.Type); td != nil {
				k.Doc = docText(td.doc, td.spec.Name.Name)
			}
		}
		if k.Doc == "" {
			return nil, fmt.Errorf("%s (field %s of %s): no doc comment", k.Path, f.Names[0].Name, p.rel)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// typeOf fills in k's Type and, for a map of keys or a list of them, its nested keys.
func (l *Loader) typeOf(p *pkg, d *typeDecl, expr ast.Expr, k *Key) error {
	switch e := expr.(type) {
	case *ast.StarExpr:
		return l.typeOf(p, d, e.X, k) // an optional value: documented as what it points to
	case *ast.ArrayType:
		elem := &Key{Path: k.Path + "[i]"}
		if err := l.typeOf(p, d, e.Elt, elem); err != nil {
			return err
		}
		if elem.Object {
			k.Type, k.Object, k.List, k.Keys = "list of maps", true, true, elem.Keys
			return nil
		}
		k.Type = "list of " + plural(elem.Type)
		return nil
	case *ast.MapType:
		elem := &Key{Path: k.Path}
		if err := l.typeOf(p, d, e.Value, elem); err != nil {
			return err
		}
		k.Type = "map of " + plural(elem.Type)
		return nil
	}
	if t, ok := basicTypes[identName(expr)]; ok {
		k.Type = t
		return nil
	}
	tp, td, qualified, err := l.resolve(p, d, expr)
	if err != nil {
		return err
	}
	if t, ok := leafTypes[qualified]; ok {
		k.Type = t
		return nil
	}
	if td == nil {
		return fmt.Errorf("type %s: add its YAML shape to configdoc's leafTypes", qualified)
	}
	switch u := td.spec.Type.(type) {
	case *ast.StructType:
		keys, err := l.fields(tp, td, u, func(key string) string { return childPath(k.Path, key) })
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			return fmt.Errorf("type %s has no keys: add its YAML shape to configdoc's leafTypes", qualified)
		}
		k.Type, k.Object, k.Keys = "map", true, keys
		return nil
	case *ast.Ident:
		if t, ok := basicTypes[u.Name]; ok {
			k.Type = t
			return nil
		}
	}
	return fmt.Errorf("type %s: add its YAML shape to configdoc's leafTypes", qualified)
}

// resolve finds the declaration of a named type: its package, its declaration (nil outside the module) and its name
// qualified by the package path (relative within the module).
func (l *Loader) resolve(p *pkg, d *typeDecl, expr ast.Expr) (*pkg, *typeDecl, string, error) {
	switch e := expr.(type) {
	case *ast.Ident:
		return p, p.types[e.Name], p.rel + "." + e.Name, nil
	case *ast.SelectorExpr:
		x, ok := e.X.(*ast.Ident)
		if !ok {
			break
		}
		path, ok := d.imports[x.Name]
		if !ok {
			return nil, nil, "", fmt.Errorf("%s.%s: package %s is not imported", x.Name, e.Sel.Name, x.Name)
		}
		rel, inModule := strings.CutPrefix(path, l.Module+"/")
		if !inModule {
			return nil, nil, path + "." + e.Sel.Name, nil
		}
		op, err := l.load(rel)
		if err != nil {
			return nil, nil, "", err
		}
		return op, op.types[e.Sel.Name], rel + "." + e.Sel.Name, nil
	}
	return nil, nil, "", fmt.Errorf("unsupported type expression %T", expr)
}

func (l *Loader) structDecl(p *pkg, d *typeDecl, expr ast.Expr) *typeDecl {
	_, td, _, err := l.resolve(p, d, expr)
	if err != nil {
		return nil
	}
	return td
}

// load parses the non-test Go files of the module's package rel.
func (l *Loader) load(rel string) (*pkg, error) {
	if p, ok := l.pkgs[rel]; ok {
		return p, nil
	}
	dir := l.Dirs[rel]
	if dir == "" {
		dir = filepath.Join(l.Root, filepath.FromSlash(rel))
	}
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	p := &pkg{rel: rel, types: map[string]*typeDecl{}}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		imports := map[string]string{}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			name := path[strings.LastIndex(path, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			imports[name] = path
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				p.types[ts.Name.Name] = &typeDecl{spec: ts, doc: doc, imports: imports}
			}
		}
	}
	if l.pkgs == nil {
		l.pkgs = map[string]*pkg{}
	}
	l.pkgs[rel] = p
	return p, nil
}

func identName(expr ast.Expr) string {
	if id, ok := expr.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// docText is a doc comment as one paragraph for an operator, its Go name dropped: "ListenPort is the gateway's UDP
// port." becomes "the gateway's UDP port.", "Spot makes the pool a spot pool." becomes "makes the pool a spot pool.";
// a comment that does not start with the name stays as written.
func docText(cg *ast.CommentGroup, goName string) string {
	if cg == nil {
		return ""
	}
	text := strings.Join(strings.Fields(cg.Text()), " ")
	rest, ok := strings.CutPrefix(text, goName+" ")
	if !ok {
		return text
	}
	for _, verb := range []string{"is ", "are "} {
		if r, ok := strings.CutPrefix(rest, verb); ok {
			return r
		}
	}
	return rest
}

// sentence starts a paragraph with a capital, unless its first word is a value or a name (host:port, kubeadm's).
func sentence(s string) string {
	word, _, _ := strings.Cut(s, " ")
	for _, r := range word {
		if !unicode.IsLower(r) {
			return s
		}
	}
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:]
}

func plural(t string) string {
	switch {
	case strings.HasPrefix(t, "list of "), strings.HasPrefix(t, "map of "), strings.Contains(t, " or "):
		return t
	}
	return t + "s"
}

// childPath is infra/config's: a nested key is dotted.
func childPath(path, key string) string { return path + "." + key }

// Walk calls fn for every key, parents before their keys.
func Walk(keys []*Key, fn func(k *Key)) {
	for _, k := range keys {
		fn(k)
		Walk(k.Keys, fn)
	}
}

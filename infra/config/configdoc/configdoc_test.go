package configdoc_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/infra/config/configdoc"
)

const project = "name: dynk8s\n" + configdoc.PulumiMarker + "\nconfig: {}\n"

// TestKeysAreTheDecoders: the keys the generator reads from the source are exactly those the decoder reads from the
// compiled types (config.Keys), with the same defaults and required keys.
func TestKeysAreTheDecoders(t *testing.T) {
	l, err := configdoc.NewLoader(".")
	assert.NilError(t, err)
	keys, err := l.Keys("infra/config", "Config", config.Namespace)
	assert.NilError(t, err)
	var fromSource []config.Key
	configdoc.Walk(keys, func(k *configdoc.Key) {
		fromSource = append(fromSource, config.Key{Path: k.Path, Default: k.Default, HasDefault: k.HasDefault,
			Required: k.Required})
	})
	assert.DeepEqual(t, sorted(fromSource), sorted(config.Keys()))
}

func sorted(keys []config.Key) map[string]config.Key {
	m := map[string]config.Key{}
	for _, k := range keys {
		m[k.Path] = k
	}
	return m
}

// TestAKeyAddedInGoIsDocumented: a field added to a copy of infra/config, with its tags and doc comment and
// nothing else, shows up in both generated files.
func TestAKeyAddedInGoIsDocumented(t *testing.T) {
	dir := copyConfig(t, "\tCapacity int `key:\"capacity\" default:\"5000\"`\n",
		"\t// ScratchKnob is a knob declared only in Go, in the scratch copy of this test.\n"+
			"\tScratchKnob int `key:\"scratchKnob\" default:\"7\"`\n")
	pulumi, md := generate(t, dir)
	assert.Check(t, is.Contains(pulumi, "\n        scratchKnob (integer, default 7): a knob declared only in Go, in the "+
		"scratch copy of this test.\n"))
	assert.Check(t, is.Contains(md, "| `dynk8s:fuse.scratchKnob` | integer | `7` | a knob declared only in Go, in "+
		"the scratch copy of this test. |\n"))

	// The same copy without the field documents no such key.
	pulumi, md = generate(t, copyConfig(t, "", ""))
	assert.Check(t, !strings.Contains(pulumi+md, "scratchKnob"))
}

// TestAnUndocumentedKeyFails: a key without a doc comment stops the generator, naming the key.
func TestAnUndocumentedKeyFails(t *testing.T) {
	dir := copyConfig(t, "\tCapacity int `key:\"capacity\" default:\"5000\"`\n",
		"\tScratchKnob int `key:\"scratchKnob\"`\n")
	l, err := configdoc.NewLoader(".")
	assert.NilError(t, err)
	l.Dirs["infra/config"] = dir
	_, _, err = configdoc.Generate(l, project)
	assert.ErrorContains(t, err, "dynk8s:fuse.scratchKnob (field ScratchKnob of infra/config): no doc comment")
}

// copyConfig copies infra/config's source to a temporary directory, inserting insert after the line after.
func copyConfig(t *testing.T, after, insert string) string {
	t.Helper()
	src := ".." // infra/config, this package's parent
	dst := t.TempDir()
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	assert.NilError(t, err)
	inserted := after == ""
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		assert.NilError(t, err)
		text := string(b)
		if after != "" && strings.Contains(text, after) {
			text, inserted = strings.Replace(text, after, after+insert, 1), true
		}
		assert.NilError(t, os.WriteFile(filepath.Join(dst, filepath.Base(f)), []byte(text), 0o644))
	}
	assert.Assert(t, inserted, "no line %q in infra/config", after)
	return dst
}

func generate(t *testing.T, dir string) (pulumi, md string) {
	t.Helper()
	l, err := configdoc.NewLoader(".")
	assert.NilError(t, err)
	l.Dirs["infra/config"] = dir
	pulumi, md, err = configdoc.Generate(l, project)
	assert.NilError(t, err)
	return pulumi, md
}

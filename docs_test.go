package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra/config"
)

// The docs check: the configuration reference (Pulumi.yaml) and the README's config table cover exactly the keys
// the program reads, and the README's quick start names only commands that exist.

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	assert.NilError(t, err)
	return string(b)
}

// leafKeys are the known keys that hold a value rather than more keys.
func leafKeys() []config.Key {
	known := config.Keys()
	var leaves []config.Key
	for _, k := range known {
		parent := false
		for _, other := range known {
			if strings.HasPrefix(other.Path, k.Path+".") || strings.HasPrefix(other.Path, k.Path+"[") {
				parent = true
				break
			}
		}
		if !parent {
			leaves = append(leaves, k)
		}
	}
	return leaves
}

// knownPath reports whether the program reads the key path.
func knownPath(path string) bool {
	return slices.ContainsFunc(config.Keys(), func(k config.Key) bool { return k.Path == path })
}

// readmeConfigKeys are the keys in the first column of the README's configuration table.
func readmeConfigKeys(t *testing.T) map[string]string {
	t.Helper()
	readme := readFile(t, "README.md")
	section := readme[strings.Index(readme, "## Configuration"):]
	section = section[:strings.Index(section[1:], "\n## ")+1]
	rows := map[string]string{}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|(.*)$")
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		rows[m[1]] = m[2]
	}
	assert.Assert(t, len(rows) > 20, "no config table found in README.md")
	return rows
}

func TestReadmeDocumentsEveryConfigKey(t *testing.T) {
	rows := readmeConfigKeys(t)
	for _, leaf := range leafKeys() {
		key := leaf.Path
		if parent, field, ok := strings.Cut(key, ".taints[i]."); ok {
			// Taint fields are documented in their list's row as {key, value, effect}.
			assert.Check(t, strings.Contains(rows[parent+".taints"], field), "README: %s.taints row does not mention %s", parent, field)
			continue
		}
		row, ok := rows[key]
		if !assert.Check(t, ok, "README's config table has no row for %s", key) || !leaf.HasDefault {
			continue
		}
		// The row is "| `key` | type | default | meaning |"; after the key: type, then the default, which must be the
		// code's.
		cells := strings.Split(row, "|")
		assert.Check(t, len(cells) > 1 && strings.TrimSpace(cells[1]) == "`"+leaf.Default+"`",
			"README: the default of %s is `%s` in the code, the table says %q", key, leaf.Default, cells[1])
	}
	for key := range rows {
		assert.Check(t, knownPath(key), "README documents %s, which the program does not read", key)
	}
}

func TestPulumiYamlDocumentsEveryConfigKey(t *testing.T) {
	var project struct {
		Config map[string]struct {
			Type        string `json:"type"`
			Description string `json:"description"`
		} `json:"config"`
	}
	assert.NilError(t, yaml.Unmarshal([]byte(readFile(t, "Pulumi.yaml")), &project))
	for _, k := range config.Keys() {
		key := k.Path
		if !strings.HasPrefix(key, config.Namespace+":") {
			continue // aws:region belongs to the aws provider's namespace
		}
		top, rest, nested := strings.Cut(key, ".")
		top, _, _ = strings.Cut(top, "[")
		decl, ok := project.Config[top]
		if !assert.Check(t, ok, "Pulumi.yaml declares no %s", top) {
			continue
		}
		assert.Check(t, decl.Type != "" && decl.Description != "", "Pulumi.yaml: %s needs a type and a description", top)
		if nested {
			leaf := rest[strings.LastIndex(rest, ".")+1:]
			assert.Check(t, strings.Contains(decl.Description, leaf+" ") || strings.Contains(decl.Description, leaf+","),
				"Pulumi.yaml: the description of %s does not document %s", top, key)
			// "leaf (type, default VALUE)": the stated default is the code's.
			stated := regexp.MustCompile(`\b` + regexp.QuoteMeta(leaf) + ` \([^)]*?default "?([^",)]*)`).
				FindStringSubmatch(decl.Description)
			if k.HasDefault {
				assert.Check(t, stated != nil && stated[1] == k.Default,
					"Pulumi.yaml: the default of %s is %s in the code, the description says %v", key, k.Default, stated)
			}
		}
	}
	for key := range project.Config {
		assert.Check(t, knownPath(key), "Pulumi.yaml declares %s, which the program does not read", key)
	}
}

func TestReadmeQuickStartCommandsExist(t *testing.T) {
	readme := readFile(t, "README.md")
	section := readme[strings.Index(readme, "## Quick start"):]
	section = section[:strings.Index(section[1:], "\n## ")+1]
	assert.Check(t, commandsExist(t, section) >= 2, "the quick start lost its commands")
	realUse := readme[strings.Index(readme, "## Real use"):]
	realUse = realUse[:strings.Index(realUse[1:], "\n## ")+1]
	assert.Check(t, commandsExist(t, realUse) >= 2, "the real-use section lost its make commands")
}

// TestJenkinsfileUsesMakeTargets: the pipeline runs only make targets that exist.
func TestJenkinsfileUsesMakeTargets(t *testing.T) {
	jenkinsfile := readFile(t, "Jenkinsfile")
	var lines []string
	for _, m := range regexp.MustCompile(`sh '(make [a-z-]+)'`).FindAllStringSubmatch(jenkinsfile, -1) {
		lines = append(lines, m[1])
	}
	assert.Check(t, commandsExist(t, strings.Join(lines, "\n")) >= 2, "the Jenkinsfile runs no make target")
}

// commandsExist checks every `make TARGET` and `go run ./cmd/X` line of text and returns how many it found.
func commandsExist(t *testing.T, text string) int {
	t.Helper()
	makefile := readFile(t, "Makefile")
	commands := 0
	for _, line := range strings.Split(text, "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) >= 2 && fields[0] == "make":
			commands++
			assert.Check(t, regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(fields[1])+`:`).MatchString(makefile),
				"`make %s` is documented, but the Makefile lacks it", fields[1])
		case len(fields) >= 3 && fields[0] == "go" && fields[1] == "run":
			commands++
			info, err := os.Stat(fields[2])
			assert.Check(t, err == nil && info.IsDir(), "`go run %s` is documented, but it does not exist", fields[2])
		}
	}
	return commands
}

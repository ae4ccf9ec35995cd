package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/configdoc"
)

// The docs checks: the configuration reference is generated and current, and the commands the docs name exist.

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	assert.NilError(t, err)
	return string(b)
}

// TestConfigReferenceIsCurrent: Pulumi.yaml's config block and docs/configuration.md are what `go generate
// ./infra/config` writes from the config types' source, so every key is documented once, where it is declared.
func TestConfigReferenceIsCurrent(t *testing.T) {
	l, err := configdoc.NewLoader(".")
	assert.NilError(t, err)
	project := readFile(t, "Pulumi.yaml")
	pulumi, md, err := configdoc.Generate(l, project)
	assert.NilError(t, err)
	const regenerate = "is not what the config types say: run go generate ./infra/config"
	assert.Check(t, project == pulumi, "Pulumi.yaml %s", regenerate)
	assert.Check(t, readFile(t, "docs/configuration.md") == md, "docs/configuration.md %s", regenerate)

	// And the generated block is a project file Pulumi reads: every top-level key declared with a type.
	var decl struct {
		Config map[string]struct {
			Type        string `json:"type"`
			Description string `json:"description"`
		} `json:"config"`
	}
	assert.NilError(t, yaml.Unmarshal([]byte(pulumi), &decl))
	for _, k := range config.Keys() {
		top, _, _ := strings.Cut(k.Path, ".")
		top, _, _ = strings.Cut(top, "[")
		if strings.HasPrefix(top, config.Namespace+":") {
			assert.Check(t, decl.Config[top].Type != "" && decl.Config[top].Description != "", "Pulumi.yaml: %s", top)
		}
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

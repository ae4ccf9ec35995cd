package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cmd/check/check"
	"github.com/dynk8s/dynk8s/cmd/explain/explain"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/cmd/previewgate/previewgate"
	"github.com/dynk8s/dynk8s/cmd/status/status"
	"github.com/dynk8s/dynk8s/cmd/timeline/timeline"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/infra/config/configdoc"
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

// docPages are the repository's Markdown pages: the README, CONTRIBUTING.md and docs/.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	assert.NilError(t, err)
	return append([]string{"README.md", "CONTRIBUTING.md"}, pages...)
}

// TestDocCommandsExist: every `make TARGET` and `go run ./cmd/X` in the pages' code blocks exists, and the README's
// first hour and CONTRIBUTING.md's commands are there.
func TestDocCommandsExist(t *testing.T) {
	for _, page := range docPages(t) {
		text := readFile(t, page)
		lines := codeBlocks(text)
		for _, m := range commandCell.FindAllStringSubmatch(text, -1) {
			lines = append(lines, m[1])
		}
		n := commandsExist(t, strings.Join(lines, "\n"))
		switch page {
		case "README.md":
			assert.Check(t, n >= 3, "the README lost its plan, preview and up commands (%d found)", n)
		case "CONTRIBUTING.md":
			assert.Check(t, n >= 2, "CONTRIBUTING.md lost its make commands (%d found)", n)
		}
	}
}

// commandCell is a table row's first cell that is a command.
var commandCell = regexp.MustCompile("(?m)^\\| `((?:make|go run) [^`]*)`")

// codeBlocks are the lines inside the fenced code blocks of a Markdown page.
func codeBlocks(page string) []string {
	var lines []string
	in := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if in {
			lines = append(lines, line)
		}
	}
	return lines
}

// TestDocLinksResolve: every relative link of the pages names a file of the repository and, with a #fragment, a
// heading of that page, as GitHub renders its anchor.
func TestDocLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	code := regexp.MustCompile("`[^`]*`")
	links := 0
	for _, page := range docPages(t) {
		prose := strings.Join(proseLines(readFile(t, page)), "\n")
		for _, m := range link.FindAllStringSubmatch(code.ReplaceAllString(prose, "``"), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			file, fragment, _ := strings.Cut(target, "#")
			if file == "" {
				file = page
			} else {
				file = filepath.Join(filepath.Dir(page), file)
			}
			info, err := os.Stat(file)
			if !assert.Check(t, err == nil, "%s links to %s, which does not exist", page, target) || fragment == "" {
				continue
			}
			assert.Check(t, !info.IsDir() && slices.Contains(anchors(readFile(t, file)), fragment),
				"%s links to %s: no such heading in %s", page, target, file)
		}
	}
	assert.Check(t, links > 30, "only %d links found", links)
}

// proseLines are the lines outside fenced code blocks.
func proseLines(page string) []string {
	var lines []string
	in := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
		} else if !in {
			lines = append(lines, line)
		}
	}
	return lines
}

// anchors are the fragments GitHub gives a page's headings, a repeated one suffixed -1, -2, ...
func anchors(page string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range proseLines(page) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		a := configdoc.Anchor(strings.TrimSpace(strings.TrimLeft(line, "#")))
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
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

// TestDocFlags: every flag of each command is named on its page (`-name`), so a page's flag list cannot fall behind
// its command; and every flag a page's `go run ./cmd/X` lines pass is one X has.
func TestDocFlags(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		cmd, page string
		main      func(args []string, stdout, stderr io.Writer) int
	}{
		{"plan", "docs/plan.md", plan.Main},
		{"explain", "docs/explain.md", func(a []string, o, e io.Writer) int { return explain.Main(ctx, a, o, e) }},
		{"status", "docs/status.md", func(a []string, o, e io.Writer) int { return status.Main(ctx, a, o, e) }},
		{"check", "docs/check.md", func(a []string, o, e io.Writer) int { return check.Main(ctx, a, o, e) }},
		{"timeline", "docs/timeline.md", func(a []string, o, e io.Writer) int { return timeline.Main(ctx, a, o, e) }},
		{"previewgate", "docs/operations.md", previewgate.Main},
	} {
		t.Run(c.cmd, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := c.main([]string{"-h"}, &stdout, &stderr)
			assert.Check(t, code == 0 || code == 2, "-h is help (0) or a usage exit (2), got %d", code)
			var flags []string
			for _, m := range usageFlag.FindAllStringSubmatch(stderr.String(), -1) {
				flags = append(flags, m[1])
			}
			assert.Assert(t, len(flags) > 0, "no flags in %s -h:\n%s", c.cmd, stderr.String())
			page := readFile(t, c.page)
			for _, f := range flags {
				assert.Check(t, regexp.MustCompile("(?m)(`|\\s)-"+regexp.QuoteMeta(f)+"([ =`]|$)").MatchString(page),
					"%s does not name %s's flag -%s", c.page, c.cmd, f)
			}
			for _, p := range docPages(t) {
				for _, line := range codeBlocks(readFile(t, p)) {
					_, args, ok := strings.Cut(line, "go run ./cmd/"+c.cmd+" ")
					if !ok {
						continue
					}
					for _, m := range lineFlag.FindAllStringSubmatch(args, -1) {
						assert.Check(t, m[1] == "h" || slices.Contains(flags, m[1]), "%s: %q passes -%s, which %s does not have",
							p, line, m[1], c.cmd)
					}
				}
			}
		})
	}
}

// usageFlag is a flag's line in flag.PrintDefaults' output; lineFlag a flag on a command line.
var (
	usageFlag = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	lineFlag  = regexp.MustCompile(`(?:^|\s)-([a-z][a-z0-9-]*)`)
)

// TestDocReadmeNamesTheJoinRoles: README's on-prem step names every role the stack binds its join token group to
// (the dev stack's bindings, as the golden manifests hold them), since those roles come from `kubeadm init` and the
// operator must keep them.
func TestDocReadmeNamesTheJoinRoles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "stacks", "dev", "manifests", "*binding-*.yaml"))
	assert.NilError(t, err)
	readme := readFile(t, "README.md")
	var roles []string
	for _, f := range files {
		var b rbacv1.RoleBinding // a ClusterRoleBinding has the same roleRef and subjects
		assert.NilError(t, yaml.Unmarshal([]byte(readFile(t, f)), &b), f)
		for _, s := range b.Subjects {
			if s.Kind == "Group" && s.Name == addons.NodeBootstrapGroup {
				roles = append(roles, b.RoleRef.Name)
				assert.Check(t, strings.Contains(readme, "`"+b.RoleRef.Name+"`"),
					"README.md does not name %s, which %s binds the join token group to", b.RoleRef.Name, f)
			}
		}
	}
	assert.Check(t, len(roles) >= 4, "the dev stack binds the join token group to %v only", roles)
}

// Package scriptstub shortens user-data goldens: each boot script that a cloud-config's write_files embeds becomes
// its name alone, and what the user data carries of it (sha256 and line count) goes once into a Manifest that a set
// of goldens shares (one per stack). The scripts are pinned by their own tests (shellcheck and the behaviour tests
// that run them), so an edit of one script shows as one changed line per set of goldens, and what the renderer
// writes around the scripts in full.
package scriptstub

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

const header = "#cloud-config\n"

// Manifest maps each stubbed script's name to what the user data carries of it: "sha256:<hex> <n> lines".
type Manifest map[string]string

// String is the manifest as a golden holds it: a line per script, by name.
func (m Manifest) String() string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s %s\n", name, m[name])
	}
	return b.String()
}

// Stub replaces the content of every write_files entry of userData that is one of the *.sh files of scriptsDir: a
// file of that name whose lines are the script's, in order (the renderer drops the comment lines), and records it in
// m. userData must be a cloud-config as the renderer writes it (the header, then YAML that marshals back to itself),
// so that nothing but the scripts changes. Two user datas of one manifest must carry a script the same way.
func Stub(userData, scriptsDir string, m Manifest) (string, error) {
	scripts, err := readScripts(scriptsDir)
	if err != nil {
		return "", err
	}
	body, ok := strings.CutPrefix(userData, header)
	if !ok {
		return "", fmt.Errorf("not a cloud-config: no %q line", strings.TrimSpace(header))
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(body), &doc); err != nil {
		return "", err
	}
	if again, err := yaml.Marshal(doc); err != nil || string(again) != body {
		return "", fmt.Errorf("the cloud-config does not marshal back to itself, so stubbing it would change more " +
			"than its scripts")
	}
	files, _ := doc["write_files"].([]any)
	for _, f := range files {
		entry, ok := f.(map[string]any)
		if !ok {
			continue
		}
		content, _ := entry["content"].(string)
		path, _ := entry["path"].(string)
		name := filepath.Base(path)
		script, ok := scripts[name]
		if !ok {
			continue
		}
		if !linesOf(content, script) {
			return "", fmt.Errorf("%s is not the script %s less some lines: a golden must show it whole", path, name)
		}
		carried := fmt.Sprintf("sha256:%x %d lines", sha256.Sum256([]byte(content)), strings.Count(content, "\n"))
		if was, ok := m[name]; ok && was != carried {
			return "", fmt.Errorf("%s: %s here, %s in another user data of the same manifest", path, carried, was)
		}
		m[name] = carried
		entry["content"] = "<script " + name + ">"
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	return header + string(out), nil
}

// linesOf reports whether every line of embedded is a line of script, in order.
func linesOf(embedded, script string) bool {
	lines := strings.Split(script, "\n")
	for _, line := range strings.Split(embedded, "\n") {
		for len(lines) > 0 && lines[0] != line {
			lines = lines[1:]
		}
		if len(lines) == 0 {
			return false
		}
		lines = lines[1:]
	}
	return true
}

// readScripts maps each script's file name to its content.
func readScripts(dir string) (map[string]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.sh"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no scripts in %s", dir)
	}
	scripts := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		scripts[filepath.Base(p)] = string(b)
	}
	return scripts, nil
}

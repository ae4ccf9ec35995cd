package configdoc

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// PulumiMarker is the line of Pulumi.yaml from which the generator owns the file: what is above it is written by
// hand (the project's name, runtime and comments), the `config:` block below it is generated.
const PulumiMarker = "# Generated from the doc comments and tags of infra/config (go generate ./infra/config): do not edit below."

const width = 118

// PulumiConfig is Pulumi.yaml's `config:` block (after the marker line) for the keys of namespace: one declaration
// per top-level key, with its nested keys described in its description. A key with neither a default nor a
// required key inside gets `default: {}`, since Pulumi treats a declared key without a default as required.
func PulumiConfig(keys []*Key, namespace string) string {
	var b strings.Builder
	b.WriteString(PulumiMarker + "\nconfig:\n")
	for _, k := range keys {
		if !strings.HasPrefix(k.Path, namespace+":") {
			continue // another namespace's key (aws:region) is its provider's to declare
		}
		fmt.Fprintf(&b, "  %s:\n", k.Path)
		switch {
		case k.List && k.Object:
			b.WriteString("    type: array\n    items:\n      type: object\n")
		case k.Object:
			b.WriteString("    type: object\n")
		default:
			fmt.Fprintf(&b, "    type: %s\n", pulumiType(k.Type))
		}
		switch {
		case k.HasDefault:
			fmt.Fprintf(&b, "    default: %s\n", yamlScalar(k))
		case k.Object && !k.List && !requiredInside(k):
			b.WriteString("    default: {}  # optional: every key inside is optional\n")
		}
		b.WriteString("    description: |-\n")
		desc := sentence(k.Doc)
		if k.Required && !k.Object {
			desc = "(required) " + desc
		}
		if len(k.Keys) > 0 {
			entry := "Keys:"
			if k.List {
				entry = "Keys of an entry:"
			}
			desc = strings.TrimSuffix(desc, ".") + ". " + entry
			if k.Required {
				desc = "(required) " + desc
			}
		}
		wrap(&b, "      ", "      ", desc)
		writeNested(&b, k.Keys, "        ")
	}
	return b.String()
}

func writeNested(b *strings.Builder, keys []*Key, indent string) {
	for _, k := range keys {
		wrap(b, indent, indent+"  ", fmt.Sprintf("%s (%s): %s", k.Name, summary(k), k.Doc))
		writeNested(b, k.Keys, indent+"  ")
	}
}

// summary is "type, required", "type, default X" or "type, optional".
func summary(k *Key) string {
	switch {
	case k.Required:
		return k.Type + ", required"
	case k.HasDefault:
		return k.Type + ", default " + yamlScalar(k)
	}
	return k.Type + ", optional"
}

func requiredInside(k *Key) bool {
	for _, c := range k.Keys {
		if c.Required || (c.Object && !c.List && requiredInside(c)) {
			return true
		}
	}
	return false
}

func pulumiType(t string) string {
	switch t {
	case "integer", "boolean":
		return t
	}
	return "string"
}

// yamlScalar is a default as YAML reads it back as the key's type: a string that YAML would read as a number or a
// boolean is quoted.
func yamlScalar(k *Key) string {
	if k.Type == "string" {
		if _, err := strconv.ParseFloat(k.Default, 64); err == nil {
			return strconv.Quote(k.Default)
		}
		if _, err := strconv.ParseBool(k.Default); err == nil {
			return strconv.Quote(k.Default)
		}
	}
	return k.Default
}

// wrap writes text word-wrapped at width, the first line after first, the others after rest.
func wrap(b *strings.Builder, first, rest, text string) {
	line := first
	empty := true
	for _, w := range strings.Fields(text) {
		if !empty && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line, empty = rest, true
		}
		if !empty {
			line += " "
		}
		line += w
		empty = false
	}
	b.WriteString(line + "\n")
}

// Markdown is docs/configuration.md: intro, then a section per top-level key with a table of it and its keys.
func Markdown(keys []*Key, intro string) string {
	var b strings.Builder
	b.WriteString("<!-- Generated from the doc comments and tags of infra/config (go generate ./infra/config): " +
		"do not edit. -->\n\n")
	b.WriteString(strings.TrimSpace(intro) + "\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "\n## `%s`\n\n", k.Path)
		if len(k.Keys) > 0 {
			b.WriteString(linked(sentence(k.Doc)) + "\n\n")
		}
		b.WriteString("| key | type | default | meaning |\n| --- | --- | --- | --- |\n")
		Walk([]*Key{k}, func(c *Key) {
			if c != k || len(c.Keys) == 0 { // a section's own doc is its paragraph, above
				fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", c.Path, c.Type, mdDefault(c), cell(c.Doc))
			}
		})
	}
	return b.String()
}

func mdDefault(k *Key) string {
	switch {
	case k.Required:
		return "required"
	case k.HasDefault:
		return "`" + k.Default + "`"
	}
	return "none"
}

func cell(s string) string { return linked(strings.ReplaceAll(s, "|", `\|`)) }

// pageRef is a doc comment's reference to a page, with the heading it points at: (docs/security.md, "Node
// identity") or (README, "Prepare the on-prem side").
var pageRef = regexp.MustCompile(`(docs/([a-z-]+\.md)|README)(, "([^"]+)")?`)

// linked turns the page references of a doc comment into links from docs/configuration.md, so that the docs test
// checks they resolve.
func linked(s string) string {
	return pageRef.ReplaceAllStringFunc(s, func(ref string) string {
		m := pageRef.FindStringSubmatch(ref)
		target, text := m[2], m[2]
		if m[1] == "README" {
			target, text = "../README.md", "README"
		}
		if m[4] != "" {
			target += "#" + Anchor(m[4])
			text += ", " + m[4]
		}
		return "[" + text + "](" + target + ")"
	})
}

// Anchor is the fragment GitHub gives a heading (without the -1, -2 of a repeated one).
func Anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

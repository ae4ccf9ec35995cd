package configdoc

import (
	"fmt"
	"strings"

	"github.com/dynk8s/dynk8s/infra/config"
)

// intro opens docs/configuration.md.
const intro = `
# Configuration reference

Every key dynk8s reads, with its type, its default and what it does. The program reads each key once, applies the
defaults and validates the whole configuration before anything is declared: every problem is reported at once, with
its key path, e.g. ` + "`dynk8s:nodePools[1].maxSize: must be >= minSize (0), got -1`" + `. A ` + "`dynk8s:`" + ` key the
program does not read, at the top level or inside a section, is refused with the keys known there, and so is a key
of a namespace a typo or two away from ` + "`dynk8s`" + ` (` + "`dynk8:autoscaler`" + `: did you mean ` + "`dynk8s:autoscaler`" + `?), so a
misspelt key is never silently ignored. Set a nested key with ` + "`pulumi config set --path`" + `, e.g.
` + "`pulumi config set --path 'dynk8s:nodePools[0].maxSize' 6`" + `, or edit the stack file (` + "`Pulumi.<stack>.yaml`" + `).
`

// Generate renders Pulumi.yaml, keeping what project has above PulumiMarker, and docs/configuration.md, from the
// source of infra/config's Config.
func Generate(l *Loader, project string) (pulumi, md string, err error) {
	keys, err := l.Keys("infra/config", "Config", config.Namespace)
	if err != nil {
		return "", "", err
	}
	head, _, ok := strings.Cut(project, PulumiMarker)
	if !ok {
		return "", "", fmt.Errorf("the project file lacks the marker line %q", PulumiMarker)
	}
	return head + PulumiConfig(keys, config.Namespace), Markdown(keys, intro), nil
}

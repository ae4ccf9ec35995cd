package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/dynk8s/dynk8s/node/internal/system"
)

// A baked image holds what the prepare phases install (docs/baked-images.md): `dynk8s-node prepare` ran them on
// the image's build instance and left the marker, which says what it installed. A boot that finds the marker
// installs nothing: it checks with rpm that the image holds the packages its own node.json pins, and refuses an
// image baked for something else, so that no node joins with a kubelet of another version.

// MarkerFormat is the marker's format; a marker of another format is refused (the image is rebuilt, not guessed at).
const MarkerFormat = 1

// Marker is /etc/dynk8s/baked.json.
type Marker struct {
	Format    int             `json:"format"`
	Agent     MarkerAgent     `json:"agent"`
	Config    MarkerConfig    `json:"config"`
	Kernel    string          `json:"kernel"`
	Installed []MarkerPackage `json:"installed"`
	CRIO      string          `json:"crio"`
	Images    []string        `json:"images"`
}

// MarkerAgent is the agent that baked the image.
type MarkerAgent struct {
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
}

// MarkerConfig is what the image was baked from: the build's node.json (its hash) and the fields the prepare read.
type MarkerConfig struct {
	SHA256         string   `json:"sha256"`
	Packages       []string `json:"packages"`
	SystemPackages []string `json:"systemPackages"`
	KernelModules  []string `json:"kernelModules"`
	PrePullImages  []string `json:"prePullImages"`
}

// MarkerPackage is one package the prepare installed (or found), as rpm reports it.
type MarkerPackage struct {
	Spec  string `json:"spec"`
	Name  string `json:"name"`
	NEVRA string `json:"nevra"`
}

// ReadMarker reads the marker: nil without one, an error for one this agent cannot read.
func ReadMarker(f system.Files) (*Marker, error) {
	p := f.Baked()
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("baked image: the marker %s is unreadable: %w", p, err)
	}
	var m Marker
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("baked image: the marker %s does not parse (%w): build the pool's image again", p, err)
	}
	if m.Format != MarkerFormat {
		return nil, fmt.Errorf("baked image: the marker %s has format %d, this agent reads %d: build the pool's image again",
			p, m.Format, MarkerFormat)
	}
	return &m, nil
}

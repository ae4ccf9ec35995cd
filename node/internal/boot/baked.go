package boot

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/image"
	"github.com/dynk8s/dynk8s/node/internal/system"
)

// loadBaked reads the marker into j.baked; no marker is a stock image (nil, no error). A marker that cannot be read
// or is of another format fails the boot: the image is not one this agent knows what it holds.
func (pr *preparer) loadBaked() error {
	m, err := image.ReadMarker(pr.files)
	pr.baked = m
	return err
}

// rpmQueryFormat: one line per installed package; rpm expands the \t and \n escapes itself (rpm-queryformat(7)).
const rpmQueryFormat = `%{NAME}\t%{VERSION}\t%{RELEASE}\t%{NEVRA}\n`

// rpmPackage is one installed package, as rpm -q --qf rpmQueryFormat reports it.
type rpmPackage struct {
	name, version, release, nevra string
}

// rpmQuery lists the installed packages named name (whatProvides: those that provide it). None installed is no
// error: rpm -q then exits 1 and says so on stdout.
func (pr *preparer) rpmQuery(ctx context.Context, whatProvides bool, name string) ([]rpmPackage, error) {
	args := []string{"-q"}
	if whatProvides {
		args = append(args, "--whatprovides")
	}
	out, err := pr.host.Output(ctx, time.Minute, "rpm", append(args, "--qf", rpmQueryFormat, name)...)
	if ee := (*system.ExitError)(nil); err != nil && !errors.As(err, &ee) {
		return nil, fmt.Errorf("rpm -q %s: %w", name, err)
	}
	var pkgs []rpmPackage
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Split(line, "\t"); len(f) == 4 {
			pkgs = append(pkgs, rpmPackage{name: f[0], version: f[1], release: f[2], nevra: f[3]})
		}
	}
	return pkgs, nil
}

// packageSpec is a package of node.json as dnf reads it: NAME, NAME-VERSION or NAME-VERSION-RELEASE, where the
// version part may be a glob (dnf(8), "Specifying Packages"). NAME ends before the first "-" that a digit follows:
// "cri-o-1.34.*" is cri-o at 1.34.*.
type packageSpec struct {
	spec, name, version string
}

func parseSpec(spec string) packageSpec {
	for i := 0; i+1 < len(spec); i++ {
		if spec[i] == '-' && spec[i+1] >= '0' && spec[i+1] <= '9' {
			return packageSpec{spec: spec, name: spec[:i], version: spec[i+1:]}
		}
	}
	return packageSpec{spec: spec, name: spec}
}

// matches: the installed package is one dnf would take for the spec (its VERSION or VERSION-RELEASE matches).
func (s packageSpec) matches(p rpmPackage) bool {
	if p.name != s.name {
		return false
	}
	if s.version == "" {
		return true
	}
	for _, v := range []string{p.version, p.version + "-" + p.release} {
		if ok, _ := path.Match(s.version, v); ok {
			return true
		}
	}
	return false
}

// installed is the installed package that satisfies spec (system: a Fedora package, any that provides it), or why
// none does.
func (pr *preparer) installed(ctx context.Context, spec string, system bool) (rpmPackage, error) {
	s := parseSpec(spec)
	if system {
		s = packageSpec{spec: spec, name: spec}
	}
	pkgs, err := pr.rpmQuery(ctx, system, s.name)
	if err != nil {
		return rpmPackage{}, err
	}
	if len(pkgs) == 0 {
		if system {
			return rpmPackage{}, fmt.Errorf("nothing installed provides %s (rpm -q --whatprovides)", s.name)
		}
		return rpmPackage{}, fmt.Errorf("%s is not installed (rpm -q)", s.name)
	}
	if system {
		return pkgs[0], nil
	}
	i := slices.IndexFunc(pkgs, s.matches)
	if i < 0 {
		nevras := make([]string, len(pkgs))
		for k, p := range pkgs {
			nevras[k] = p.nevra
		}
		return rpmPackage{}, fmt.Errorf("%s is installed, not %s", strings.Join(nevras, " "), spec)
	}
	return pkgs[i], nil
}

// checkBaked is the packages phase of a boot from a baked image: nothing is installed; every package this node's
// config pins must be installed at a matching version, and be the one the marker says the image was baked with.
func (pr *preparer) checkBaked(ctx context.Context) error {
	m := pr.baked
	pr.log.Printf("baked image (%s): baked by agent %s (sha256 %s) from a config with sha256 %s, packages %s, kernel %s",
		pr.files.Baked(), m.Agent.Version, m.Agent.SHA256, m.Config.SHA256, strings.Join(m.Config.Packages, " "), m.Kernel)
	var found []string
	for _, spec := range pr.cfg.Packages {
		p, err := pr.installed(ctx, spec, false)
		if err != nil {
			return fmt.Errorf("baked image: %w, and the pool needs %s: the image was baked for packages %s; build the "+
				"pool's image again (a baked boot never installs)", err, spec, strings.Join(m.Config.Packages, " "))
		}
		if !slices.ContainsFunc(m.Installed, func(b image.MarkerPackage) bool { return b.NEVRA == p.nevra }) {
			return fmt.Errorf("baked image: rpm -q has %s, which its marker %s does not list: the image changed after "+
				"it was baked; build the pool's image again", p.nevra, pr.files.Baked())
		}
		found = append(found, p.nevra)
	}
	for _, name := range pr.cfg.SystemPackages {
		if _, err := pr.installed(ctx, name, true); err != nil {
			return fmt.Errorf("baked image: %w, which the pool needs; build the pool's image again", err)
		}
	}
	pr.log.Printf("baked image holds %s and %s (rpm -q): nothing to install", strings.Join(found, " "),
		strings.Join(pr.cfg.SystemPackages, " "))
	return nil
}

// prePullImages are the images this boot pulls: on a baked image, those the image does not hold already.
func (pr *preparer) prePullImages() []string {
	if pr.baked == nil {
		return pr.cfg.PrePullImages
	}
	var out []string
	for _, img := range pr.cfg.PrePullImages {
		if !slices.Contains(pr.baked.Images, img) {
			out = append(out, img)
		}
	}
	return out
}

// bakedMarkerOf is the marker for what the prepare just installed; config is node.json's bytes.
func (pr *preparer) bakedMarkerOf(ctx context.Context, configSHA256 string) (image.Marker, error) {
	m := image.Marker{Format: image.MarkerFormat, Agent: image.MarkerAgent{Version: system.Version, SHA256: system.SelfHash()},
		Config: image.MarkerConfig{SHA256: configSHA256, Packages: pr.cfg.Packages, SystemPackages: pr.cfg.SystemPackages,
			KernelModules: pr.cfg.KernelModules, PrePullImages: pr.cfg.PrePullImages},
		Kernel: kernelRelease(), Images: pr.pulled}
	if m.Images == nil {
		m.Images = []string{}
	}
	for _, spec := range pr.cfg.Packages {
		p, err := pr.installed(ctx, spec, false)
		if err != nil {
			return m, fmt.Errorf("after the install, %w", err)
		}
		m.Installed = append(m.Installed, image.MarkerPackage{Spec: spec, Name: p.name, NEVRA: p.nevra})
		if p.name == "cri-o" {
			m.CRIO = p.version + "-" + p.release
		}
	}
	for _, name := range pr.cfg.SystemPackages {
		p, err := pr.installed(ctx, name, true)
		if err != nil {
			return m, fmt.Errorf("after the install, %w", err)
		}
		m.Installed = append(m.Installed, image.MarkerPackage{Spec: name, Name: p.name, NEVRA: p.nevra})
	}
	return m, nil
}

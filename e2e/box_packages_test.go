//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The node's package phase for real: `dynk8s-node prepare` runs in a root with real dnf and rpm, on dnf4 with
// rpm 4.18 (the box root, Debian bookworm: Fedora up to 40) and on dnf5 with rpm 6.1 (the forky root: Fedora 41 on),
// against signed local repositories whose packages carry upstream's names, versions and dependencies
// (testdata/packages/build-repos.sh), with gpgcheck on. The user data's repositories are written by cloud-init's
// own yum_add_repo, only their base URLs pointed at the local repositories. Each case runs on a throwaway overlay of
// the root, not booted (forky's systemd cannot boot on this host; the package phase needs no boot).
//
// The gateway's `dynk8s-node gateway-packages` runs in both roots too (gatewayPackageCases).
//
// What must hold: the pinned versions install from the upstream repositories, not Fedora's newer cri-o and
// cri-tools; a later `dnf upgrade` leaves them at their pins (and the control: without the lock it would not);
// a package that fails its signature check, an upstream repository not reached and a pin only Fedora's build
// matches each fail the boot with one FAILED line that says why, and install nothing of Fedora's in its place.
func TestBoxPackagesOnRealDnf(t *testing.T) {
	nspawn := requireNspawn(t)
	cfg, files, reposYAML := devPrepareFiles(t)
	var repos struct {
		YumRepos map[string]map[string]any `json:"yum_repos"`
	}
	assert.NilError(t, yaml.Unmarshal(reposYAML, &repos))
	_, okK := repos.YumRepos["dynk8s-kubernetes"]
	_, okC := repos.YumRepos["dynk8s-cri-o"]
	assert.Assert(t, okK && okC, "the user data's repositories: %v", repos.YumRepos)
	kube := cfg.Kubernetes.Version

	const repoDir = "/srv/repos"
	for _, root := range []struct{ dnf, dir string }{{"dnf4", boxRoot(t)}, {"dnf5", forkyRoot(t)}} {
		t.Run(root.dnf, func(t *testing.T) {
			built := buildPackageRepos(t, nspawn, root.dir, kube.String(), pinnedCRIOMinor(t, files))
			// run is one case: the user data's repositories with base URLs (by repository id) from urls, the agent's
			// deadline, and what runs after the prepare.
			run := func(t *testing.T, urls map[string]string, deadline string, after string) packageRun {
				t.Helper()
				ud := userDataDir(t, files, repos.YumRepos, urls)
				env := []string{"REPOS=" + repoDir, "USERDATA=/srv/userdata", "AFTER=" + after,
					"ADD_REPOS=" + cloudinit.AddRepositories("/srv/userdata/repos.yaml")}
				if deadline != "" {
					env = append(env, "DYNK8S_DEADLINE_SECONDS="+deadline)
				}
				return runPackagePhase(t, nspawn, root.dir, root.dnf, built, ud, env)
			}
			gatewayPackageCases(t, nspawn, root.dir, root.dnf, built)

			local := map[string]string{"dynk8s-kubernetes": "kubernetes", "dynk8s-cri-o": "cri-o"}
			pins := []string{"kubelet-" + kube.String() + "-150500.1.1", "kubeadm-" + kube.String() + "-150500.1.1",
				"cri-tools-" + pinnedCRIOMinor(t, files) + ".0-150500.1.1", "cri-o-" + pinnedCRIOMinor(t, files) + ".4-150500.1.1"}

			t.Run("pins hold through dnf upgrade", func(t *testing.T) {
				r := run(t, local, "120", `echo "== marker"; cat /etc/dynk8s/baked.json
dnf upgrade -y >/tmp/upgrade.log 2>&1 || { cat /tmp/upgrade.log; exit 1; }
echo "== upgraded"; rpm -qa --qf '%{NEVRA}\n' | sort
dnf versionlock clear >/dev/null 2>&1 || dnf versionlock delete kubelet kubeadm cri-tools cri-o >/dev/null
dnf upgrade -y >/tmp/unlocked.log 2>&1 || { cat /tmp/unlocked.log; exit 1; }
echo "== unlocked"; rpm -qa --qf '%{NEVRA}\n' | sort`)
				assert.Assert(t, is.Equal(r.rc, 0), r.out)
				assert.Check(t, is.Len(r.failed(), 0))
				for _, p := range pins {
					assert.Check(t, hasPackage(r.installed, p), "%s not installed: %v", p, r.installed)
				}
				assert.Check(t, hasPackage(r.installed, "kubernetes-cni-1.7.1-150500.1.1"))
				// The image lacked container-selinux: Fedora's release repository gave it, not updates.
				assert.Check(t, hasPackage(r.installed, "container-selinux-2:2.240.0-1.fc43"), "%v", r.installed)
				for _, p := range []string{"kubelet-" + kube.String(), "cri-o-" + pinnedCRIOMinor(t, files) + ".4"} {
					assert.Check(t, is.Contains(r.log, p), "the log does not name %s", p)
				}
				if root.dnf == "dnf4" {
					assert.Check(t, is.Contains(r.log, "this dnf has no versionlock command (dnf4 without its plugin)"))
					assert.Check(t, hasPackage(r.installed, "python3-dnf-plugin-versionlock-4.3.1-1.fc43"), "%v", r.installed)
				}
				// The baked boot's rpm queries (name and --whatprovides, the agent's query format) on this rpm: the
				// marker the prepare leaves for a baked image lists what they found, and a baked boot compares the same
				// queries' answers with it.
				var marker struct {
					Config struct {
						Packages       []string `json:"packages"`
						SystemPackages []string `json:"systemPackages"`
					} `json:"config"`
					Installed []struct{ NEVRA string } `json:"installed"`
				}
				assert.NilError(t, json.Unmarshal([]byte(r.sections["marker"]), &marker), r.sections["marker"])
				var queried []string
				for _, p := range marker.Installed {
					queried = append(queried, p.NEVRA)
					assert.Check(t, slices.Contains(r.installed, p.NEVRA), "the marker's %s is not in rpm -qa", p.NEVRA)
				}
				assert.Check(t, is.Len(queried, len(marker.Config.Packages)+len(marker.Config.SystemPackages)), "%v", queried)
				for _, p := range append(pins, "container-selinux-2:2.240.0-1.fc43") {
					assert.Check(t, hasPackage(queried, p), "the marker lacks %s: %v", p, queried)
				}
				upgraded, unlocked := r.section("upgraded"), r.section("unlocked")
				assert.Assert(t, upgraded != nil && unlocked != nil, r.out)
				// The upgrade ran (container-selinux came from updates), and left the pins where they were.
				assert.Check(t, hasPackage(upgraded, "container-selinux-2:2.245.0-1.fc43"), "%v", upgraded)
				for _, p := range pins {
					assert.Check(t, hasPackage(upgraded, p), "dnf upgrade moved %s: %v", p, upgraded)
				}
				// The control: without the lock, Fedora's newer builds replace upstream's (the hazard is real here).
				assert.Check(t, hasPackage(unlocked, "cri-o-"+pinnedCRIOMinor(t, files)+".10-1.fc43"), "%v", unlocked)
				assert.Check(t, hasPackage(unlocked, "cri-tools-"+pinnedCRIOMinor(t, files)+".10-1.fc43"), "%v", unlocked)
			})

			for _, c := range []struct {
				name   string
				urls   map[string]string
				reason *regexp.Regexp
				after  string
				// control: what the after commands must print, showing that the case is a hazard here
				control string
			}{
				{name: "a package that is not signed",
					urls:   map[string]string{"dynk8s-kubernetes": "kubernetes-unsigned", "dynk8s-cri-o": "cri-o"},
					reason: regexp.MustCompile(`dnf install exited 1: .*(is not signed|OpenPGP check for package)`)},
				// Retried to the deadline, and named: with the repository skipped (skip_if_unavailable on, as
				// Fedora's dnf4 dnf.conf has it), the same install fails as a package no repository has, which the
				// agent does not retry.
				{name: "the kubernetes repository not reached",
					urls:   map[string]string{"dynk8s-kubernetes": "missing", "dynk8s-cri-o": "cri-o"},
					reason: regexp.MustCompile(`gave up after .*dnf install exited 1: .*(Failed to download metadata|Cannot download).*dynk8s-kubernetes`),
					after: `dnf install -y --setopt=dynk8s-kubernetes.skip_if_unavailable=True --repo=dynk8s-kubernetes ` +
						`--repo=dynk8s-cri-o kubelet-` + kube.String() + ` 2>&1`,
					control: "No match for argument: kubelet-" + kube.String()},
				{name: "a pin only Fedora's build matches",
					urls: map[string]string{"dynk8s-kubernetes": "kubernetes", "dynk8s-cri-o": "cri-o-old"},
					// dnf4: "All matches were filtered out by exclude filtering for argument: SPEC"; dnf5:
					// "Argument 'SPEC' matches only excluded packages."
					reason: regexp.MustCompile(`dnf install exited 1: (All matches were filtered out by exclude filtering ` +
						`for argument: |Argument ')cri-o-` + regexp.QuoteMeta(pinnedCRIOMinor(t, files)) + `\.\*`),
					after: `dnf install -y --repo=dynk8s-cri-o --repo=fedora 'cri-o-` + pinnedCRIOMinor(t, files) + `.*' >/dev/null 2>&1
rpm -q cri-o`,
					control: "cri-o-" + pinnedCRIOMinor(t, files) + ".9-1.fc43"},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := run(t, c.urls, "20", c.after)
					assert.Check(t, r.rc != 0, "prepare passed:\n%s", r.log)
					failed := r.failed()
					assert.Assert(t, is.Len(failed, 1), r.log)
					assert.Check(t, c.reason.MatchString(failed[0]), "FAILED line %q does not match %s", failed[0], c.reason)
					for _, name := range []string{"kubelet-", "kubeadm-", "cri-o-", "cri-tools-"} {
						assert.Check(t, !hasPackage(r.installed, name), "%s* installed: %v", name, r.installed)
					}
					if c.control != "" {
						assert.Check(t, is.Contains(r.after, c.control), "the control:\n%s", r.after)
					}
				})
			}
		})
	}
}

// runPackagePhase runs prepare.sh in root (its dnf named dnf) with the repositories built, the user data's
// directory ud and the environment env, and reads what it printed.
func runPackagePhase(t *testing.T, nspawn, root, dnf, built, ud string, env []string) packageRun {
	t.Helper()
	args := []string{"--bind-ro=" + built + ":/srv/repos", "--bind-ro=" + ud + ":/srv/userdata",
		"--bind-ro=" + nodetest.BuiltAgent(t) + ":/usr/local/bin/dynk8s-node",
		"--bind-ro=" + testdataPath(t, "packages") + ":/srv/packages"}
	for _, e := range env {
		args = append(args, "--setenv="+e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := nspawnOutput(ctx, t, nspawn, root, append(args, "/srv/packages/prepare.sh")...)
	pr := parsePackageRun(t, out)
	phase := "its packages phase did not end"
	if m := packagesPhaseRE.FindStringSubmatch(pr.log); m != nil {
		phase = "its packages phase " + m[1] + "s"
	}
	t.Logf("%s: the agent's rc=%d in %ss (%s)", dnf, pr.rc, pr.took, phase)
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("DYNK8S_E2E_SHOW") != "" {
			t.Logf("prepare.sh's output:\n%s", out)
		}
	})
	return pr
}

// gatewayPackageCases are the gateway's packages on a root's real dnf and rpm (issue: the gateway's packages on dnf4
// and dnf5): `dynk8s-node gateway-packages` of the rendered gateway user data installs what rpm does not find
// (the image provides nftables; wireguard-tools comes from Fedora's release repository, signed) and enables the
// tunnel's unit, which the package ships; its next run, as at every later boot, only checks; an unsigned
// wireguard-tools fails with one FAILED line that says why, at once, and installs nothing.
func gatewayPackageCases(t *testing.T, nspawn, root, dnf, built string) {
	t.Helper()
	ud := gatewayUserDataDir(t)
	agent := "AGENT=dynk8s-node gateway-packages --config " + nodeconfig.GatewayPath
	t.Run("the gateway's packages", func(t *testing.T) {
		r := runPackagePhase(t, nspawn, root, dnf, built, ud, []string{"REPOS=/srv/repos", "USERDATA=/srv/userdata",
			agent, "DYNK8S_DEADLINE_SECONDS=120",
			"AFTER=echo '== again'; dynk8s-node gateway-packages --config " + nodeconfig.GatewayPath + " 2>&1; echo \"rc=$?\"\n" +
				"echo '== enabled'; ls /etc/systemd/system/multi-user.target.wants/"})
		assert.Assert(t, is.Equal(r.rc, 0), r.log)
		assert.Check(t, is.Len(r.failed(), 0))
		assert.Check(t, hasPackage(r.installed, "wireguard-tools-1.0.20210914-9.fc43"), "%v", r.installed)
		assert.Check(t, is.Contains(r.log, "installed wireguard-tools"))
		assert.Check(t, !strings.Contains(r.log, "installed nftables"), "nftables was installed: the image provides it")
		again := strings.Join(r.section("again"), " ")
		assert.Check(t, is.Contains(again, "nftables wireguard-tools already installed"), again)
		assert.Check(t, is.Contains(again, "rc=0"), again)
		assert.Check(t, is.Contains(strings.Join(r.section("enabled"), " "), "wg-quick@wg0.service"), r.out)
	})
	t.Run("the gateway's packages, unsigned", func(t *testing.T) {
		r := runPackagePhase(t, nspawn, root, dnf, built, ud, []string{"REPOS=/srv/repos", "USERDATA=/srv/userdata",
			agent, "FEDORA=fedora-unsigned", "DYNK8S_DEADLINE_SECONDS=20"})
		assert.Check(t, r.rc != 0, "gateway-packages passed:\n%s", r.log)
		failed := r.failed()
		assert.Assert(t, is.Len(failed, 1), r.log)
		assert.Check(t, is.Regexp(`dnf install exited 1: .*(is not signed|OpenPGP check for package)`, failed[0]))
		assert.Check(t, !hasPackage(r.installed, "wireguard-tools"), "%v", r.installed)
		// At once: a signature failure is not retried to the deadline.
		assert.Check(t, !strings.Contains(r.log, "gave up after"), r.log)
	})
}

// gatewayUserDataDir lays out the files of a gateway user data rendered for the test (cloudinit.Gateway, its
// agent bound in place of the bootstrap's).
func gatewayUserDataDir(t *testing.T) string {
	t.Helper()
	key, err := wgtypes.GeneratePrivateKey()
	assert.NilError(t, err)
	userData, err := cloudinit.Gateway(cloudinit.GatewayInput{ListenPort: 51820, MTU: 1420,
		TunnelAddress: netip.MustParsePrefix("10.99.0.1/30"), PeerPublicKey: key.PublicKey(),
		PeerAllowedIPs:      []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("10.99.0.2/32")},
		PrivateKeyParameter: "/dynk8s/e2e/wireguard-gateway-key"})
	assert.NilError(t, err)
	files, err := cloudinit.Files(userData)
	assert.NilError(t, err)
	dir := t.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, "files", f.Path)
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(f.Content), f.Permissions))
	}
	return dir
}

// pinnedCRIOMinor is the CRI-O stream node.json pins (cri-o-1.34.* gives 1.34).
func pinnedCRIOMinor(t *testing.T, files []cloudinit.File) string {
	t.Helper()
	for _, f := range files {
		if f.Path != "/etc/dynk8s/node.json" {
			continue
		}
		m := regexp.MustCompile(`"cri-o-(\d+\.\d+)\.\*"`).FindStringSubmatch(f.Content)
		assert.Assert(t, m != nil, "node.json pins no cri-o stream: %s", f.Content)
		return m[1]
	}
	t.Fatal("the user data has no node.json")
	return ""
}

// buildPackageRepos builds the signed repositories with the root's own tools (build-repos.sh) into a directory of
// the host, once per root and test run.
func buildPackageRepos(t *testing.T, nspawn, root, kube, crioMinor string) string {
	t.Helper()
	out := t.TempDir()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nspawnOutput(ctx, t, nspawn, root, buildReposArgs(t, out, kube, crioMinor)...)
	t.Logf("the repositories built in %.1fs", time.Since(start).Seconds())
	return out
}

// buildReposArgs are systemd-nspawn's arguments that run build-repos.sh into out.
func buildReposArgs(t *testing.T, out, kube, crioMinor string) []string {
	t.Helper()
	return []string{"--bind=" + out + ":/srv/out", "--bind-ro=" + testdataPath(t, "box") + ":/srv/box",
		"--bind-ro=" + testdataPath(t, "packages") + ":/srv/packages", "--setenv=OUT=/srv/out", "--setenv=BOX=/srv/box",
		"--setenv=KUBE_VERSION=" + kube, "--setenv=CRIO_MINOR=" + crioMinor, "/srv/packages/build-repos.sh"}
}

// userDataDir lays out the user data's prepare files and its repositories, their base URLs and keys pointed at the
// local repositories (urls: repository id to a directory of build-repos.sh's output).
func userDataDir(t *testing.T, files []cloudinit.File, repos map[string]map[string]any, urls map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, "files", f.Path)
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(f.Content), f.Permissions))
	}
	local := map[string]map[string]any{}
	for id, r := range repos {
		c := map[string]any{}
		for k, v := range r {
			c[k] = v
		}
		sub, ok := urls[id]
		assert.Assert(t, ok, "no local repository for %s", id)
		c["baseurl"] = "file:///srv/repos/" + sub + "/"
		c["gpgkey"] = "file:///srv/repos/" + sub + "/repodata/repomd.xml.key"
		local[id] = c
	}
	body, err := yaml.Marshal(map[string]any{"yum_repos": local})
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "repos.yaml"), append([]byte("#cloud-config\n"), body...), 0o644))
	return dir
}

// testdataPath is testdata/name, absolute (nspawn binds need it).
func testdataPath(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	assert.NilError(t, err)
	return p
}

// nspawnOutput runs args in root on a throwaway overlay, not booted, and returns what it wrote (both streams); the
// test fails if it exits non-zero.
func nspawnOutput(ctx context.Context, t *testing.T, nspawn, root string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := nspawnCommand(ctx, nspawn, root, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	assert.NilError(t, cmd.Run(), "systemd-nspawn %s:\n%s", strings.Join(args, " "), out.String())
	return out.String()
}

// packageRun is prepare.sh's output, by section.
type packageRun struct {
	out, log, after string
	rc              int
	took            string
	installed       []string
	sections        map[string]string
}

var (
	rcRE = regexp.MustCompile(`(?m)^rc=(\d+) took=(\S+)$`)
	// packagesPhaseRE is the agent's timing line of the package phase.
	packagesPhaseRE = regexp.MustCompile(`phase=packages took=(\S+)s`)
)

func parsePackageRun(t *testing.T, out string) packageRun {
	t.Helper()
	sections := map[string]string{}
	var cur string
	for line := range strings.Lines(out) {
		if name, ok := strings.CutPrefix(line, "== "); ok {
			// A section is there from its header on, empty or not (the last one, "the end", always is).
			cur = strings.TrimSpace(name)
			sections[cur] += ""
			continue
		}
		sections[cur] += line
	}
	_, ok := sections["the end"]
	assert.Assert(t, ok, "prepare.sh did not finish:\n%s", out)
	m := rcRE.FindStringSubmatch(sections["agent"])
	assert.Assert(t, m != nil, "no rc line:\n%s", out)
	rc, err := strconv.Atoi(m[1])
	assert.NilError(t, err)
	return packageRun{out: out, log: sections["agent"], after: sections["after"], rc: rc, took: m[2],
		installed: strings.Fields(sections["rpm -qa"]), sections: sections}
}

// agentFailedRE is a FAILED line of the agent's, whichever its command (not dnf4's own "Error: GPG check FAILED").
var agentFailedRE = regexp.MustCompile(`dynk8s-[a-z-]+: FAILED: `)

// failed are the agent's FAILED lines.
func (r packageRun) failed() []string {
	var out []string
	for line := range strings.Lines(r.log) {
		if agentFailedRE.MatchString(line) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// section is a "== name" part that the after commands printed, as its lines' fields (nil: none).
func (r packageRun) section(name string) []string {
	s, ok := r.sections[name]
	if !ok {
		return nil
	}
	return strings.Fields(s)
}

// hasPackage: one of the NEVRAs starts with prefix.
func hasPackage(nevras []string, prefix string) bool {
	for _, n := range nevras {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
)

// The pool's repositories, as cloud-init's own yum_add_repo writes them from the user data's yum_repos (a node's
// and a bake instance's cloud-init alike, at their first boot), run by two real cloud-inits on either side of 24.1:
// the box root's (Debian bookworm, 22.4) and the forky root's (26.2). Each writes the pool's .repo files from the
// same cloud-config, and the two write the same files. (The module is run here with cloudinit.AddRepositories,
// outside a boot: Debian's cloud-init leaves yum_add_repo out of its boot stages.)
func TestBakeRepositoriesOnBothCloudInits(t *testing.T) {
	nspawn := requireNspawn(t)
	_, _, repos := devPrepareFiles(t)
	var want struct {
		YumRepos map[string]struct {
			BaseURL  string `json:"baseurl"`
			Priority int    `json:"priority"`
		} `json:"yum_repos"`
	}
	assert.NilError(t, yaml.Unmarshal(repos, &want))
	assert.Assert(t, len(want.YumRepos) > 0)
	reposFile := filepath.Join(t.TempDir(), "repos.yaml")
	assert.NilError(t, os.WriteFile(reposFile, repos, 0o600))

	const config = "/run/dynk8s-image/repos.yaml"
	step := "set -euo pipefail\n" + cloudinit.AddRepositories(config) + "\n" +
		`for f in /etc/yum.repos.d/*.repo; do echo "== $f"; cat "$f"; done`
	written := map[string]string{}
	var before, after bool
	for _, root := range []struct{ name, dir string }{
		{"the box root", boxRoot(t)},
		{"the forky root", forkyRoot(t)},
	} {
		t.Run(root.name, func(t *testing.T) {
			version := cloudInitVersion(t, nspawn, root.dir)
			t.Logf("cloud-init %s", version)
			if version.before(24, 1) {
				before = true
			} else {
				after = true
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := inRoot(ctx, nspawn, root.dir, "--bind-ro="+reposFile+":"+config, "bash", "-c", step)
			assert.NilError(t, err, "the repositories step on cloud-init %s:\n%s", version, out)
			files := repoFiles(out)
			var ids []string
			for id, r := range want.YumRepos {
				ids = append(ids, id)
				body, ok := files["/etc/yum.repos.d/"+id+".repo"]
				if !assert.Check(t, ok, "no %s.repo:\n%s", id, out) {
					continue
				}
				assert.Check(t, is.Contains(body, "["+id+"]\n"))
				assert.Check(t, is.Contains(body, "baseurl = "+r.BaseURL+"\n"))
				if r.Priority != 0 {
					assert.Check(t, is.Contains(body, fmt.Sprintf("priority = %d\n", r.Priority)))
				}
			}
			var got []string
			for f := range files {
				got = append(got, strings.TrimSuffix(filepath.Base(f), ".repo"))
			}
			slices.Sort(ids)
			slices.Sort(got)
			assert.Check(t, is.DeepEqual(got, ids))
			for f, body := range files {
				if prev, ok := written[f]; ok {
					assert.Check(t, is.Equal(body, prev), "%s differs between the two cloud-inits", f)
				}
				written[f] = body
			}
		})
	}
	assert.Check(t, before && after, "the two roots' cloud-inits are not on either side of 24.1")
}

// forkyRoot is hack/tools.sh's forky root, or the test skips (fails under DYNK8S_REQUIRE_TOOLS) without it.
func forkyRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join("..", "hack", "tools.sh"), "--forky-root").Output()
	assert.NilError(t, err, "hack/tools.sh --forky-root")
	root := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(root, ".dynk8s-root")); err != nil {
		missing(t, "the forky root (hack/tools.sh builds it): "+err.Error())
	}
	return root
}

// ciVersion is a cloud-init's major and minor version.
type ciVersion struct{ major, minor int }

func (v ciVersion) String() string { return fmt.Sprintf("%d.%d", v.major, v.minor) }

func (v ciVersion) before(major, minor int) bool {
	return v.major < major || v.major == major && v.minor < minor
}

// cloudInitVersion asks the root's cloud-init for its version ("/usr/bin/cloud-init 22.4.2").
func cloudInitVersion(t *testing.T, nspawn, root string) ciVersion {
	t.Helper()
	out, err := inRoot(context.Background(), nspawn, root, "cloud-init", "--version")
	assert.NilError(t, err, "cloud-init --version: %s", out)
	m := regexp.MustCompile(`cloud-init (\d+)\.(\d+)`).FindStringSubmatch(out)
	assert.Assert(t, m != nil, "cloud-init --version: %s", out)
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return ciVersion{major, minor}
}

// inRoot runs a command in root with systemd-nspawn, not booted, and returns its standard output (nspawn's own
// messages and the command's standard error go into the error). The root stays clean: a tmpfs overlay takes what
// the command writes, gone with the container.
func inRoot(ctx context.Context, nspawn, root string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := nspawnCommand(ctx, nspawn, root, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return stdout.String(), nil
}

// nspawnCommand is args run in root by systemd-nspawn, not booted, on a tmpfs overlay that takes what they write
// (the root stays clean).
func nspawnCommand(ctx context.Context, nspawn, root string, args ...string) *exec.Cmd {
	return nspawnIn(ctx, nspawn, root, append([]string{"--volatile=overlay"}, args...)...)
}

// nspawnIn runs args in root, not booted, writing to root itself (a box's own overlay before its first boot).
func nspawnIn(ctx context.Context, nspawn, root string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, nspawn, append([]string{"--quiet", "--register=no", "--keep-unit",
		"--private-network", "--console=pipe", "--directory=" + root}, args...)...)
}

// requireNspawn is systemd-nspawn, which needs root; without either the test skips (fails under
// DYNK8S_REQUIRE_TOOLS).
func requireNspawn(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "root (systemd-nspawn)")
	}
	return requireTool(t, "systemd-nspawn")
}

// devPrepareFiles are the dev stack's config and, of its pool of this machine's architecture, the rendered user
// data's prepare files and repositories (cloudinit.PrepareFiles).
func devPrepareFiles(t *testing.T) (*config.Config, []cloudinit.File, []byte) {
	t.Helper()
	cfg := devConfig(t)
	userData := stackNode(cfg, hostArchPool(t, cfg), []string{"sha256:" + strings.Repeat("0", 64)},
		"/dynk8s/e2e/join-token").userData(t)
	files, repos, err := cloudinit.PrepareFiles(userData)
	assert.NilError(t, err)
	return cfg, files, repos
}

// repoFiles splits the step's listing ("== path" and the file's lines) into the files, without cloud-init's
// "# Created by cloud-init on <date>" line.
func repoFiles(out string) map[string]string {
	files := map[string]string{}
	var cur string
	for line := range strings.Lines(out) {
		switch {
		case strings.HasPrefix(line, "== "):
			cur = strings.TrimSpace(strings.TrimPrefix(line, "== "))
			files[cur] = ""
		case cur != "" && !strings.HasPrefix(line, "# Created by cloud-init"):
			files[cur] += line
		}
	}
	return files
}

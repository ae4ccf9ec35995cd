package cloudinit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The prepare step's files are those of the pool's user data, byte for byte with their modes, and the repositories'
// cloud-config holds exactly the user data's yum_repos, which cloud-init's own schema accepts.
func TestPrepareFilesAreThePoolsUserData(t *testing.T) {
	raw, err := generalPool().userData()
	assert.NilError(t, err)
	all, err := Files(raw)
	assert.NilError(t, err)
	files, repos, err := PrepareFiles(raw)
	assert.NilError(t, err)
	var paths []string
	for _, f := range files {
		paths = append(paths, f.Path)
		i := slices.IndexFunc(all, func(u File) bool { return u.Path == f.Path })
		assert.Assert(t, i >= 0, f.Path)
		assert.Check(t, is.DeepEqual(f, all[i]), f.Path)
	}
	assert.DeepEqual(t, paths, []string{"/etc/dynk8s/node.json", "/etc/crio/crio.conf.d/90-dynk8s.conf",
		"/etc/modules-load.d/dynk8s.conf", "/etc/sysctl.d/90-dynk8s.conf"})

	var want, got cloudConfig
	assert.NilError(t, yaml.Unmarshal(raw, &want))
	assert.NilError(t, yaml.UnmarshalStrict(repos, &got))
	assert.DeepEqual(t, got, cloudConfig{YumRepos: want.YumRepos})
	assert.Check(t, strings.HasPrefix(string(repos), "#cloud-config\n"))
	f := filepath.Join(t.TempDir(), "repos.yaml")
	assert.NilError(t, os.WriteFile(f, repos, 0o600))
	out, err := exec.Command(realtools.Require(t, "cloud-init"), "schema", "--config-file", f).CombinedOutput()
	assert.NilError(t, err, "cloud-init schema: %s", out)

	_, _, err = PrepareFiles([]byte("#cloud-config\nwrite_files: []\n"))
	assert.Check(t, is.ErrorContains(err, "no /etc/dynk8s/node.json"))
}

// The repositories step takes the spelling of --file that the image's cloud-init parses, under the step's own
// `set -euo pipefail`: stand-ins for cloud-init before and from 24.1 print their subcommand's help (the usage lines of
// 22.4.2 and 26.2) and refuse the other spelling with argparse's exit 2. The real cloud-inits run the step in the e2e
// (TestBakeRepositoriesOnBothCloudInits).
func TestAddRepositoriesTakesEitherSpelling(t *testing.T) {
	const config = "/run/dynk8s-image/repos.yaml"
	for _, tc := range []struct {
		name, help string
		// takes is the argv (after the program's name) that this cloud-init runs the module with.
		takes string
	}{
		{name: "22.4", help: "usage: /usr/bin/cloud-init single [-h] --name NAME\n" +
			"                                  [--frequency {instance,always,once}]\n" +
			"                                  [--report]\n",
			takes: "--file " + config + " single --name yum_add_repo --frequency always"},
		{name: "26.2", help: "usage: /usr/bin/cloud-init single [-h] --name NAME\n" +
			"                                  [--frequency {instance,always,once}]\n" +
			"                                  [--report] [--file FILES]\n",
			takes: "single --name yum_add_repo --frequency always --file " + config},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := realtools.ClosedPath(t)
			calls := filepath.Join(t.TempDir(), "calls")
			realtools.WriteStub(t, dir, "cloud-init", fmt.Sprintf(`#!/bin/bash
if [[ "$*" == "single --help" ]]; then
	printf '%%s' %q
	exit 0
fi
echo "$*" >>%s
[[ "$*" == %q ]] || { echo "cloud-init: error: unrecognized arguments: --file" >&2; exit 2; }
`, tc.help, calls, tc.takes))
			cmd := exec.Command(realtools.Require(t, "bash"), "-c", "set -euo pipefail\n"+AddRepositories(config))
			cmd.Env = []string{"PATH=" + dir}
			out, err := cmd.CombinedOutput()
			realtools.CheckNoMissingCommand(t, string(out))
			assert.NilError(t, err, "%s", out)
			got, err := os.ReadFile(calls)
			assert.NilError(t, err)
			assert.Equal(t, string(got), tc.takes+"\n")
		})
	}
}

func TestBakeGolden(t *testing.T) {
	t.Parallel()
	in := spotPool()
	ud, err := Bake(in.node, in.render)
	assert.NilError(t, err)
	golden.Assert(t, stubScripts(t, ud), "bake-spot-arm64.golden")
}

// A bake instance prepares from exactly what a node of the pool prepares from: the same repositories and the same
// crio, modules and sysctl files, byte for byte and mode; its bake.json is the node.json's prepare fields with a
// bake's deadline, and nothing of the join; its agent bootstrap is the node's with a bake's fetch deadline; its
// unit is started by runcmd after the bootstrap and never enabled, so no boot of the image it leaves runs it.
func TestBakeIsThePoolsPrepare(t *testing.T) {
	t.Parallel()
	in := spotPool()
	nodeUD, err := in.userData()
	assert.NilError(t, err)
	bakeUD, err := Bake(in.node, in.render)
	assert.NilError(t, err)
	node, bake := parseCloudConfig(t, nodeUD), parseCloudConfig(t, bakeUD)
	assert.Check(t, is.DeepEqual(bake.YumRepos, node.YumRepos))
	for _, p := range []string{"/etc/crio/crio.conf.d/90-dynk8s.conf", "/etc/modules-load.d/dynk8s.conf",
		"/etc/sysctl.d/90-dynk8s.conf", agentScript} {
		assert.Check(t, is.DeepEqual(fileByPath(t, bake, p), fileByPath(t, node, p)), p)
	}
	for _, f := range bake.WriteFiles {
		assert.Check(t, f.Path != nodeconfig.Path && !strings.Contains(f.Path, "dynk8s-join"), "a bake writes %s", f.Path)
	}
	full, err := NodeConfig(in.node, in.render)
	assert.NilError(t, err)
	want, err := full.Bake().Encode()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(fileByPath(t, bake, nodeconfig.BakePath).Content, string(want)))
	got, err := nodeconfig.DecodeBake(strings.NewReader(fileByPath(t, bake, nodeconfig.BakePath).Content))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(got.Deadline.D(), nodeconfig.BakeDeadline))
	assert.Check(t, is.Contains(fileByPath(t, bake, agentEnvPath).Content,
		fmt.Sprintf("DYNK8S_AGENT_DEADLINE_SECONDS=%d\n", int(nodeconfig.BakeAgentFetch.Seconds()))))
	assert.Check(t, is.DeepEqual(bake.RunCmd, [][]string{{"systemctl", "daemon-reload"},
		{"systemctl", "start", agentUnitName}, {"systemctl", "start", bakeUnitName},
		runcmdFailsOnFailedUnits(bakeUnitName, agentUnitName)}))
	unit := fileByPath(t, bake, "/etc/systemd/system/"+bakeUnitName).Content
	assert.Check(t, is.Contains(unit, "ExecStart="+agentBinary+" bake --config "+nodeconfig.BakePath+"\n"))
	assert.Check(t, is.Contains(unit, "Requires="+agentUnitName+"\n"))
	assert.Check(t, !strings.Contains(unit, "[Install]"), "the bake unit can be enabled:\n%s", unit)
}

// What the join alone reads changes nothing in a bake's user data but for nothing: the image's identity (infra's
// BakeID hashes this render) stays when the CA pins, the endpoint, the gateway, labels, taints or host settings change.
func TestBakeIgnoresTheJoin(t *testing.T) {
	t.Parallel()
	in := spotPool()
	in.render.Agent = nil
	a, err := Bake(in.node, in.render)
	assert.NilError(t, err)
	other := spotPool()
	other.render.Agent = nil
	other.node.Join.CACertHashes = nil
	other.node.GatewayInstanceID = "i-0fedcba9876543210"
	other.node.Join.Labels = map[string]string{"dynk8s.io/pool": "spot-arm64", "team": "builds"}
	other.node.Join.Taints = nil
	other.node.Host = nodeconfig.Host{}
	other.node.LaunchHook = "another-hook"
	b, err := Bake(other.node, other.render)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(a), string(b)))

	other.node.PrePullImages = append(other.node.PrePullImages, "quay.io/buildah/stable:v1.39")
	c, err := Bake(other.node, other.render)
	assert.NilError(t, err)
	assert.Check(t, string(a) != string(c), "a pre-pull changed nothing")

	other.node.PrePullImages = []string{"not an image"}
	_, err = Bake(other.node, other.render)
	assert.Check(t, is.ErrorContains(err, "PrePullImages[0]"))
}

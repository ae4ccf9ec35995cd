package cloudinit

import (
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// A bake instance (cmd/bake) prepares a pool's image from Bake's user data, at its first boot, as a node does. A
// prepare run outside a boot (an image pipeline of an operator's own, with the agent's prepare, clean-identity and
// check-image commands; the e2e's package roots) takes the pool's files from the rendered user data with
// PrepareFiles, and has the image's own cloud-init write its repositories with AddRepositories.

// preparePaths are the files of a node's user data that the agent's prepare step reads: its configuration, CRI-O's
// drop-in, the kernel modules and sysctls (the agent's baked-image contract, docs/baked-images.md).
var preparePaths = []string{
	nodeconfig.Path,
	"/etc/crio/crio.conf.d/90-dynk8s.conf",
	"/etc/modules-load.d/dynk8s.conf",
	"/etc/sysctl.d/90-dynk8s.conf",
}

// PrepareFiles are the files of a pool's rendered user data (Node's output) that the prepare step reads, with their
// content and mode as write_files has them, and the user data's yum_repos as a cloud-config of its own, from which
// cloud-init's yum_add_repo writes the same .repo files a node's cloud-init writes.
func PrepareFiles(userData []byte) (files []File, repos []byte, err error) {
	all, err := Files(userData)
	if err != nil {
		return nil, nil, err
	}
	byPath := map[string]File{}
	for _, f := range all {
		byPath[f.Path] = f
	}
	for _, p := range preparePaths {
		f, ok := byPath[p]
		if !ok {
			return nil, nil, fmt.Errorf("user data: no %s for the prepare step", p)
		}
		files = append(files, f)
	}
	var cc cloudConfig
	if err := yaml.UnmarshalStrict(userData, &cc); err != nil {
		return nil, nil, fmt.Errorf("user data: %w", err)
	}
	if len(cc.YumRepos) == 0 {
		return nil, nil, fmt.Errorf("user data: no yum_repos for the prepare step")
	}
	repos, err = cloudConfig{YumRepos: cc.YumRepos}.marshal()
	if err != nil {
		return nil, nil, err
	}
	return files, repos, nil
}

// AddRepositories is the bash that has cloud-init's own yum_add_repo write the .repo files of config (PrepareFiles'
// repos, as a file on the machine), outside a boot, so they are byte for byte those a node's cloud-init writes, on
// whichever cloud-init the machine has. Where the --file of additional config goes changed in cloud-init 24.1 ("Breaking
// changes", 24.1: the top-level --file was removed, and a subcommand that supports it takes it): before, only
// `cloud-init --file F single ...` parses, from then on only `cloud-init single ... --file F`. The subcommand's help
// says which one this cloud-init takes (it lists --file from 24.1 on); it is read into a variable, not piped, so
// that pipefail cannot take an early-exiting grep's broken pipe for the answer.
func AddRepositories(config string) string {
	single := "single --name yum_add_repo --frequency always"
	return strings.Join([]string{
		`single_help=$(cloud-init single --help)`,
		`if [[ $single_help == *--file* ]]; then`,
		`  cloud-init ` + single + ` --file ` + config,
		`else`,
		`  cloud-init --file ` + config + ` ` + single,
		`fi`,
	}, "\n")
}

// bakeUnitName is the unit a bake instance's runcmd starts: it is never enabled, so a boot of the image it leaves
// never runs it (and clean-identity removes its configuration).
const bakeUnitName = "dynk8s-bake.service"

// Bake validates the prepare's part of a pool's node.json as infra builds it and r, and renders the cloud-config of an instance that bakes
// the pool's image (cmd/bake launches it from the pool's Fedora image): the repositories and prepare files exactly
// as the pool's nodes get them (preparation), the pool's prepare fields as bake.json (nodeconfig.Bake) instead of
// node.json, the agent's bootstrap with a bake's fetch deadline, and a unit that runs `dynk8s-node bake`, which
// prepares, removes the instance's identity and powers the instance off. r.Agent nil renders no bootstrap: what
// infra hashes into the image's identity, which the agent's pin must not change.
func Bake(node nodeconfig.Node, r NodeRender) ([]byte, error) {
	var e errs
	minor, err := kube.LookupMinor(r.KubernetesVersion)
	e.add("KubernetesVersion", err)
	validatePrepare(&e, node, r)
	if err := e.join("bake user data"); err != nil {
		return nil, err
	}
	// Only the prepare's fields: the join's are not the bake's, and are left out of what it hashes.
	in := nodeconfig.Node{ClusterName: node.ClusterName, PoolName: node.PoolName, PrePullImages: node.PrePullImages}
	completePrepare(&in, r, minor)
	fail := func(err error) ([]byte, error) { return nil, fmt.Errorf("node pool %q: bake: %w", in.PoolName, err) }
	cfg, err := in.Bake().Encode()
	if err != nil {
		return fail(err)
	}
	unit, err := bakeUnit(in, r.Agent != nil).marshal()
	if err != nil {
		return fail(err)
	}
	cc, err := preparation(minor, r, writeFile{Path: nodeconfig.BakePath, Content: string(cfg), Permissions: "0644"})
	if err != nil {
		return fail(err)
	}
	cc.WriteFiles = append(cc.WriteFiles,
		writeFile{Path: "/etc/systemd/system/" + bakeUnitName, Content: unit, Permissions: "0644"})
	start := [][]string{{"systemctl", "daemon-reload"}}
	failedUnits := []string{bakeUnitName}
	if r.Agent != nil {
		if err := addAgent(&cc, *r.Agent, nodeconfig.BakeAgentFetch); err != nil {
			return fail(err)
		}
		start = append(start, []string{"systemctl", "start", agentUnitName})
		failedUnits = append(failedUnits, agentUnitName)
	}
	// The bake powers the instance off once it has succeeded; a failed one leaves it running, its reason on the
	// console, where cmd/bake reads it.
	cc.RunCmd = append(start, []string{"systemctl", "start", bakeUnitName}, runcmdFailsOnFailedUnits(failedUnits...))
	out, err := cc.marshal()
	if err != nil {
		return fail(err)
	}
	return out, nil
}

func bakeUnit(in nodeconfig.Node, fetched bool) unitFile {
	unit := []unitEntry{
		{"Description", fmt.Sprintf("dynk8s: bake the image of pool %s of cluster %s, then power off", in.PoolName,
			in.ClusterName)},
		{"Wants", "network-online.target"},
		{"After", "network-online.target"},
	}
	if fetched {
		unit = append(unit, unitEntry{"Requires", agentUnitName}, unitEntry{"After", agentUnitName})
	}
	return unitFile{
		{Name: "Unit", Entries: unit},
		{Name: "Service", Entries: []unitEntry{
			{"Type", "oneshot"},
			{"ExecStart", agentBinary + " bake --config " + nodeconfig.BakePath},
			{"StandardOutput", "journal+console"},
			{"StandardError", "journal+console"},
			{"SyslogIdentifier", "dynk8s-bake"},
			{"TimeoutStartSec", unitSeconds(nodeconfig.BakeDeadline + nodeconfig.UnitSlack)},
		}},
	}
}

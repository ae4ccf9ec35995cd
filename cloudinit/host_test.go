package cloudinit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/BurntSushi/toml"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"sigs.k8s.io/yaml"
)

// SELinux is decided, not defaulted: CRI-O's drop-in says selinux = false in so many words. CRI-O's own default is
// false today, but documented as deprecated and to follow the host in a future release (cri-o
// internal/config/template.go, templateStringCrioRuntimeSelinux), which on Fedora would confine every pod.
func TestNodeCRIOSELinuxIsExplicit(t *testing.T) {
	t.Parallel()
	ud, err := Node(generalPool())
	assert.NilError(t, err)
	var conf map[string]map[string]map[string]any
	_, err = toml.Decode(fileByPath(t, parseCloudConfig(t, ud), "/etc/crio/crio.conf.d/90-dynk8s.conf").Content, &conf)
	assert.NilError(t, err)
	v, ok := conf["crio"]["runtime"]["selinux"]
	assert.Assert(t, ok, "[crio.runtime] has no selinux key: %v", conf["crio"]["runtime"])
	assert.Check(t, is.Equal(v, false))
}

// The kubelet's resolvConf is the node's own decision, not the cluster's kubelet-config: kubeadm join patches it in
// from the directory the JoinConfiguration names, and join.sh points that directory under its root like every other
// path (the real kubeadm applies it in the e2e TestKubeletJoin).
func TestNodeKubeletPatchSetsResolvConf(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	cc := parseCloudConfig(t, ud)
	patch := fileByPath(t, cc, "/etc/kubernetes/patches/kubeletconfiguration+merge.yaml")
	var p map[string]any
	assert.NilError(t, yaml.UnmarshalStrict([]byte(patch.Content), &p))
	assert.Check(t, is.DeepEqual(p, map[string]any{"resolvConf": "/run/systemd/resolve/resolv.conf"}))

	run := runScript(t, ud, joinScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0)
	jc := parseJoinConfig(t, run.file("join-config.yaml"))
	assert.Check(t, is.Equal(jc.Patches.Directory, filepath.Join(run.root, "etc/kubernetes/patches")))
	_, err := os.Stat(filepath.Join(jc.Patches.Directory, "kubeletconfiguration+merge.yaml"))
	assert.Check(t, err)
}

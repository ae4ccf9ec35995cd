package cloudinit

import (
	"testing"

	"github.com/BurntSushi/toml"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
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

package image

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/node/internal/system"
)

// imageRig is a build instance's root for the image commands, and what they logged.
type imageRig struct {
	t    *testing.T
	root string
	log  *bytes.Buffer
}

func newImageRig(t *testing.T) *imageRig { return &imageRig{t: t, root: t.TempDir()} }

func (r *imageRig) writeMarker(m Marker) {
	r.t.Helper()
	b, err := json.Marshal(m)
	assert.NilError(r.t, err)
	assert.NilError(r.t, system.WriteFileAtomic(filepath.Join(r.root, "etc/dynk8s/baked.json"), b, 0o644))
}

func (r *imageRig) quietLogger() *system.Logger {
	r.log = &bytes.Buffer{}
	l := system.NewLogger("dynk8s-clean-identity", r.log, r.root)
	l.Journal = false
	return l
}

// clean-identity removes what makes the build instance one instance (cloud-init's state and logs but its seed,
// the machine ID, the random seed, the journal, the SSH host keys, the agent's state and the build's config, dnf's
// caches) and keeps the image: the packages' files, the pulled images, the marker, the agent. Without a marker it
// removes nothing; a dry run lists and removes nothing.
func TestCleanIdentity(t *testing.T) {
	t.Parallel()
	removed := []string{
		"var/lib/cloud/instance", "var/lib/cloud/instances/i-0build/user-data.txt", "var/lib/cloud/data/status.json",
		"var/log/cloud-init.log", "var/log/cloud-init-output.log", "var/lib/dbus/machine-id",
		"var/lib/systemd/random-seed", "var/log/journal/0123abcd/system.journal", "etc/ssh/ssh_host_ed25519_key",
		"etc/ssh/ssh_host_ed25519_key.pub", "var/lib/kubelet/pki/kubelet-client.key.tmp",
		"var/lib/kubelet/pki/kubelet-client-current.pem", "var/lib/dynk8s/prepared", "run/dynk8s/timeline.json",
		"etc/dynk8s/node.json", "etc/dynk8s/agent.env", "var/cache/dnf/packages.db", "var/cache/libdnf5/repo.solv",
	}
	kept := []string{
		"var/lib/cloud/seed/nocloud/user-data", "etc/ssh/sshd_config", "etc/dynk8s/baked.json",
		"var/lib/containers/storage/overlay-images/images.json", "usr/local/bin/dynk8s-node", "usr/bin/kubelet",
		"var/lib/kubelet/config.yaml",
		"var/log/dnf5.log",
	}
	for name, c := range map[string]struct {
		marker, dryRun bool
		err            string
	}{
		"after prepare": {marker: true},
		"a dry run":     {marker: true, dryRun: true},
		"no marker":     {err: "no baked marker"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newImageRig(t)
			for _, p := range append(slices.Clone(removed), append(kept, "etc/machine-id")...) {
				if p == "etc/dynk8s/baked.json" && !c.marker {
					continue
				}
				assert.NilError(t, os.MkdirAll(filepath.Dir(filepath.Join(r.root, p)), 0o755))
				assert.NilError(t, os.WriteFile(filepath.Join(r.root, p), []byte("x"), 0o644))
			}
			err := CleanIdentity(system.Files{Root: r.root}, r.quietLogger(), c.dryRun)
			t.Log(r.log.String())
			gone := func(p string) bool {
				_, err := os.Lstat(filepath.Join(r.root, p))
				return os.IsNotExist(err)
			}
			if c.err != "" {
				assert.ErrorContains(t, err, c.err)
			} else {
				assert.NilError(t, err)
			}
			changes := c.err == "" && !c.dryRun
			for _, p := range removed {
				assert.Check(t, is.Equal(gone(p), changes), "%s", p)
			}
			for _, p := range kept {
				assert.Check(t, !gone(p) || (p == "etc/dynk8s/baked.json" && !c.marker), "%s was removed", p)
			}
			for _, d := range []string{"var/lib/cloud/instances", "var/log/journal/0123abcd", "var/lib/dynk8s"} {
				assert.Check(t, is.Equal(gone(d), changes), "%s", d)
			}
			id, err := os.ReadFile(filepath.Join(r.root, "etc/machine-id"))
			assert.NilError(t, err)
			want := "x"
			if changes {
				want = "uninitialized\n"
			}
			assert.Check(t, is.Equal(string(id), want))
		})
	}
}

// The dbus machine ID is often systemd's symlink to /etc/machine-id: that stays.
func TestCleanIdentityKeepsTheDbusSymlink(t *testing.T) {
	t.Parallel()
	r := newImageRig(t)
	r.writeMarker(Marker{Format: 1})
	assert.NilError(t, os.MkdirAll(filepath.Join(r.root, "var/lib/dbus"), 0o755))
	assert.NilError(t, os.Symlink("/etc/machine-id", filepath.Join(r.root, "var/lib/dbus/machine-id")))
	assert.NilError(t, CleanIdentity(system.Files{Root: r.root}, r.quietLogger(), false))
	target, err := os.Readlink(filepath.Join(r.root, "var/lib/dbus/machine-id"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(target, "/etc/machine-id"))
}

// The image build's validate step: the marker names the build's node.json and the identity is gone; anything else
// is one reason.
func TestCheckImage(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		marker    *Marker
		machineID string
		pki       string // a file left in the kubelet's pki directory
		enabled   string // a unit link under etc/systemd/system
		err       string
	}{
		"firewalld enabled": {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "abc"}}, machineID: "uninitialized\n",
			enabled: "multi-user.target.wants/firewalld.service", err: "firewalld is enabled in the image"},
		"firewalld's alias": {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "abc"}}, machineID: "uninitialized\n",
			enabled: "dbus-org.fedoraproject.FirewallD1.service", err: "firewalld is enabled in the image"},
		"another unit enabled": {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "abc"}}, machineID: "uninitialized\n",
			enabled: "multi-user.target.wants/crio.service"},
		"a kubelet key": {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "abc"}}, machineID: "uninitialized\n",
			pki: "kubelet-client.key.tmp", err: "var/lib/kubelet/pki/kubelet-client.key.tmp is in the image"},
		"a kubelet certificate": {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "abc"}}, machineID: "uninitialized\n",
			pki: "kubelet-client-current.pem", err: "kubelet-client-current.pem is in the image"},
		"baked and clean":     {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "abc"}}, machineID: "uninitialized\n"},
		"another node.json":   {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "def"}}, machineID: "uninitialized\n", err: "baked from node.json def, not abc"},
		"identity still here": {marker: &Marker{Format: 1, Config: MarkerConfig{SHA256: "abc"}}, machineID: "0123abcd\n", err: "is not \"uninitialized\""},
		"another format":      {marker: &Marker{Format: 2}, machineID: "uninitialized\n", err: "has format 2"},
		"no marker":           {machineID: "uninitialized\n", err: "no baked marker"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newImageRig(t)
			if c.marker != nil {
				r.writeMarker(*c.marker)
			}
			assert.NilError(t, os.MkdirAll(filepath.Join(r.root, "etc"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(r.root, "etc/machine-id"), []byte(c.machineID), 0o444))
			assert.NilError(t, os.MkdirAll(filepath.Join(r.root, "var/lib/kubelet/pki"), 0o700))
			if c.pki != "" {
				assert.NilError(t, os.WriteFile(filepath.Join(r.root, "var/lib/kubelet/pki", c.pki), []byte("x"), 0o600))
			}
			if c.enabled != "" {
				link := filepath.Join(r.root, "etc/systemd/system", c.enabled)
				assert.NilError(t, os.MkdirAll(filepath.Dir(link), 0o755))
				assert.NilError(t, os.Symlink("/usr/lib/systemd/system/"+filepath.Base(c.enabled), link))
			}
			err := CheckImage(system.Files{Root: r.root}, "abc")
			if c.err == "" {
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, c.err)
		})
	}
}

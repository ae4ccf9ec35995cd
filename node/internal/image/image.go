// Package image is what makes a baked image one: the marker prepare writes (what it installed and pulled, from which
// node.json), the removal of the build instance's identity, and the image's check.
package image

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dynk8s/dynk8s/node/internal/system"
)

// identityGlobs are what clean-identity removes (under DYNK8S_ROOT), identityKeep what it leaves among them. They
// are the effects of `cloud-init clean --logs --machine-id` (canonical/cloud-init, cloudinit/cmd/clean.py: all of
// cloud_dir but its seed, the logs, machine-id), done here so that they do not depend on the image's cloud-init,
// and what else one instance leaves that the next must not share: systemd's random seed, the journal, the SSH host
// keys, the kubelet's keys and certificates (/var/lib/kubelet/pki: the bootstrap key whose hash a node's instance
// carries, see node/internal/boot/kubeletkey.go, would be every node's), the agent's state and the build's
// configuration, and dnf's caches (size only).
var (
	identityGlobs = []string{
		"/var/lib/cloud/*", "/var/log/cloud-init.log", "/var/log/cloud-init-output.log",
		"/var/lib/systemd/random-seed", "/var/log/journal/*", "/etc/ssh/ssh_host_*",
		"/var/lib/kubelet/pki/*",
		"/var/lib/dynk8s", "/run/dynk8s", "/etc/dynk8s/*", "/etc/systemd/system/dynk8s-bake.service",
		"/var/cache/dnf/*", "/var/cache/libdnf5/*",
	}
	identityKeep = []string{"/var/lib/cloud/seed", "/etc/dynk8s/baked.json"}
)

// CleanIdentity removes what made the build instance one instance rather than an image (identityGlobs), and with
// dryRun logs what it would remove. Only an image with a baked marker is cleaned.
func CleanIdentity(f system.Files, log *system.Logger, dryRun bool) error {
	// On a node this would remove the node's identity: only an image build, after prepare, runs it.
	if !f.Exists(f.Baked()) {
		return fmt.Errorf("no baked marker %s: clean-identity is an image build's last step, after dynk8s-node prepare",
			f.Baked())
	}
	var paths []string
	for _, g := range identityGlobs {
		m, err := filepath.Glob(f.Root + g)
		if err != nil {
			return err
		}
		for _, p := range m {
			if !slices.Contains(identityKeep, strings.TrimPrefix(p, f.Root)) {
				paths = append(paths, p)
			}
		}
	}
	dbus := f.Root + "/var/lib/dbus/machine-id"
	if st, err := os.Lstat(dbus); err == nil && st.Mode().IsRegular() {
		paths = append(paths, dbus) // a copy, not systemd's symlink to /etc/machine-id
	}
	machineID := f.Etc("machine-id")
	if dryRun {
		for _, p := range paths {
			log.Printf("dry run: would remove %s", p)
		}
		log.Printf("dry run: would set %s to 'uninitialized'", machineID)
		return nil
	}
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("could not remove %s: %w", p, err)
		}
	}
	// "uninitialized": the next boot is a first boot, and systemd writes the instance's own machine ID
	// (machine-id(5), "First Boot Semantics").
	if err := system.WriteFileAtomic(machineID, []byte("uninitialized\n"), 0o444); err != nil {
		return fmt.Errorf("could not reset %s: %w", machineID, err)
	}
	log.Printf("removed the build instance's identity and state (%d paths: %s); %s is 'uninitialized'", len(paths),
		strings.Join(paths, " "), machineID)
	return nil
}

// CheckImage checks that f holds a baked image fit to boot pool nodes: its marker names the configuration whose
// sha256 is configSHA256, its identity is gone, and firewalld is not enabled.
func CheckImage(f system.Files, configSHA256 string) error {
	m, err := ReadMarker(f)
	if err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("no baked marker %s: dynk8s-node prepare did not finish", f.Baked())
	}
	if m.Config.SHA256 != configSHA256 {
		return fmt.Errorf("baked from node.json %s, not %s", m.Config.SHA256, configSHA256)
	}
	id, err := os.ReadFile(f.Etc("machine-id"))
	if err != nil || strings.TrimSpace(string(id)) != "uninitialized" {
		return fmt.Errorf("%s is not \"uninitialized\": the instance's identity is still in the image (clean-identity)",
			f.Etc("machine-id"))
	}
	// Every node of the image would ask for its certificate with this key, and a node's tag names it.
	if pki, _ := filepath.Glob(f.KubeletPKI() + "/*"); len(pki) > 0 {
		return fmt.Errorf("%s is in the image: the kubelet's keys are the instance's identity (clean-identity)", pki[0])
	}
	for _, link := range firewalldEnabled {
		if _, err := os.Lstat(f.Etc(link)); err == nil {
			return fmt.Errorf("firewalld is enabled in the image (%s): it would start on every node, where its "+
				"default zone drops the pods' forwarded traffic that nothing opens in it; disable it in the image the "+
				"pool starts from (systemctl disable firewalld.service), or use an image without it (Fedora Cloud has none)",
				f.Etc(link))
		}
	}
	return nil
}

// firewalldEnabled are what `systemctl enable firewalld.service` links, by its unit's [Install] section (WantedBy
// multi-user.target, Alias dbus-org.fedoraproject.FirewallD1.service: firewalld, config/firewalld.service.in).
var firewalldEnabled = []string{
	"systemd/system/multi-user.target.wants/firewalld.service",
	"systemd/system/dbus-org.fedoraproject.FirewallD1.service",
}

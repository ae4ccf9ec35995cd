//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// EBS for the boxes. A volume that moto reports attached to a box's instance is a sparse file of the volume's size,
// kept for the whole test as the volume outlives its instances, behind a loop device, which appears in the running
// box as the link a Nitro instance's udev makes for an attached EBS volume: /dev/disk/by-id/ followed by
// nvme-Amazon_Elastic_Block_Store_ and the volume id without its dash ("Amazon EBS and NVMe", Amazon EC2 User
// Guide). The node's cache phase (node/internal/cache) waits for that link after EC2 says the volume is attached, as
// on EC2. What stands in: the device appears when the launcher next reads moto (a second or so after the attach),
// and the loop device is let go when the box stops, as EC2 detaches the volume of a terminated instance (moto
// does). A box's mounts are its own, so its systemd unmounts the file system at poweroff, as a node's does.

// volumeLink is where a Nitro instance's udev links an attached EBS volume's NVMe device.
func volumeLink(id string) string {
	return "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_" + strings.ReplaceAll(id, "-", "")
}

// attachedVolume is a volume attached to an instance, as testdata/moto_aws.py ec2-instances reads it.
type attachedVolume struct {
	ID      string `json:"id"`
	Device  string `json:"device"`
	SizeGiB int64  `json:"sizeGiB"`
}

// volumeStore keeps the volumes' files, by volume id.
type volumeStore struct{ dir string }

func newVolumeStore(t *testing.T) *volumeStore {
	t.Helper()
	requireTool(t, "losetup")
	return &volumeStore{dir: t.TempDir()}
}

// file is the volume's file, made (sparse, of the volume's size) the first time.
func (s *volumeStore) file(v attachedVolume) (string, error) {
	path := filepath.Join(s.dir, v.ID+".img")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	st, err := f.Stat()
	if err == nil && st.Size() == 0 {
		err = f.Truncate(v.SizeGiB << 30)
	}
	return path, errors.Join(err, f.Close())
}

// attachVolumes makes each volume attached to the box's instance appear in the running box, once a boot.
func (b *box) attachVolumes(t *testing.T, store *volumeStore, volumes []attachedVolume) {
	t.Helper()
	if b.cur == nil || !b.running() {
		return
	}
	bb := b.cur
	bb.volumesMu.Lock()
	defer bb.volumesMu.Unlock()
	if !b.running() {
		return // ended meanwhile: its volumes were let go
	}
	for _, v := range volumes {
		if v.Device == "/dev/sda1" || bb.volumes[v.ID] != "" {
			continue // the root volume moto gives every instance is the box's own root
		}
		pid, err := b.leader()
		if err != nil {
			return // not started yet: the next sync
		}
		file, err := store.file(v)
		if err != nil {
			t.Fatalf("volume %s: %v", v.ID, err)
		}
		out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
		if err != nil {
			t.Fatalf("volume %s: losetup: %v: %s", v.ID, err, out)
		}
		loop := strings.TrimSpace(string(out))
		if bb.volumes == nil {
			bb.volumes = map[string]string{}
		}
		bb.volumes[v.ID] = loop
		var st unix.Stat_t
		if err := unix.Stat(loop, &st); err != nil {
			t.Fatalf("volume %s: %v", v.ID, err)
		}
		link := fmt.Sprintf("/proc/%d/root%s", pid, volumeLink(v.ID))
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatalf("volume %s: %v", v.ID, err)
		}
		if err := unix.Mknod(link, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
			t.Fatalf("volume %s: the box's %s: %v", v.ID, volumeLink(v.ID), err)
		}
		t.Logf("box %s: volume %s (%d GiB) attached as %s, over %s", b.name, v.ID, v.SizeGiB, volumeLink(v.ID), loop)
	}
}

// detachVolumes lets the boot's loop devices go once the box has stopped. A device the box still holds open (a
// kill without its unmount) goes when it is closed: losetup -d on a busy loop device only marks it so.
func (bb *boxBoot) detachVolumes() {
	bb.volumesMu.Lock()
	defer bb.volumesMu.Unlock()
	for _, loop := range bb.volumes {
		_ = exec.Command("losetup", "-d", loop).Run()
	}
}

package cache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/cloud/cloudfake"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

const (
	instance = "i-0123456789abcdef0"
	zone     = "eu-central-1a"
)

func poolTags(pool string) map[string]string {
	return map[string]string{names.TagCluster: "homelab", names.TagPool: pool, names.TagCache: pool}
}

// fakeHost answers blkid with the volume's file system and e2fsck with an exit status, and records every command.
type fakeHost struct {
	mu     sync.Mutex
	fs     string // what blkid finds ("": none)
	e2fsck int    // e2fsck's exit status
	calls  []string
}

func (h *fakeHost) Has(string) bool { return true }

func (h *fakeHost) Run(_ context.Context, _ time.Duration, _ bool, name string, args ...string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, name+" "+strings.Join(args, " "))
	if name == "e2fsck" && h.e2fsck != 0 {
		return &system.ExitError{Name: name, Code: h.e2fsck}
	}
	return nil
}

func (h *fakeHost) Output(_ context.Context, _ time.Duration, name string, args ...string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, name+" "+strings.Join(args, " "))
	if h.fs == "" {
		return "", &system.ExitError{Name: name, Code: 2}
	}
	return h.fs + "\n", nil
}

type rig struct {
	ec2   *cloudfake.EC2
	root  string
	host  *fakeHost
	cache *Cache
	log   *nodetest.SyncBuffer
}

func newRig(t *testing.T, maxVolumes int) *rig {
	root := t.TempDir()
	log := &nodetest.SyncBuffer{}
	logger := system.NewLogger("dynk8s-join", log, root)
	logger.Journal = false
	r := &rig{ec2: &cloudfake.EC2{}, root: root, host: &fakeHost{fs: "ext4"}, log: log}
	r.ec2.Volumes.Steal = map[string]bool{}
	// What the kernel and udev make of an attachment on a Nitro instance: the NVMe device, linked by volume id.
	r.ec2.Volumes.OnAttach = func(id string) error {
		dev := filepath.Join(root, "dev/nvme1n1")
		link := filepath.Join(root, "dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_"+strings.ReplaceAll(id, "-", ""))
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dev, nil, 0o600); err != nil {
			return err
		}
		return os.Symlink(dev, link)
	}
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	r.cache = &Cache{EC2: r.ec2, Host: r.host, Files: system.Files{Root: root}, Log: logger,
		Now:     func() time.Time { return now },
		Sleep:   func(context.Context, time.Duration) error { now = now.Add(poll); return nil },
		Cluster: "homelab", Pool: "builders", Instance: instance, Zone: zone,
		Config: nodeconfig.Cache{SizeGiB: 100, VolumeType: "gp3", IOPS: 4000, Throughput: 250,
			MountPath: "/var/lib/dynk8s-cache", MaxVolumes: maxVolumes}}
	return r
}

var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// A free volume of the pool in the node's zone is attached, the oldest first, and mounted as it is when its file
// system is clean; volumes in use, in other zones, of other pools or clusters are left alone.
func TestAttachesAFreeVolume(t *testing.T) {
	r := newRig(t, 4)
	r.ec2.AddVolume("vol-0inuse", zone, ec2types.VolumeStateInUse, t0, poolTags("builders"))
	r.ec2.AddVolume("vol-0otherzone", "eu-central-1b", ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	r.ec2.AddVolume("vol-0otherpool", zone, ec2types.VolumeStateAvailable, t0, poolTags("arm"))
	r.ec2.AddVolume("vol-0newer", zone, ec2types.VolumeStateAvailable, t0.Add(time.Hour), poolTags("builders"))
	r.ec2.AddVolume("vol-0older", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	res, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	assert.Check(t, is.DeepEqual(res, Result{VolumeID: "vol-0older", Device: filepath.Join(r.root, "dev/nvme1n1")}))
	assert.Check(t, is.DeepEqual(r.ec2.VolumeCalls(), []string{"attach vol-0older to " + instance + " as /dev/sdf"}))
	dev := filepath.Join(r.root, "dev/nvme1n1")
	assert.Check(t, is.DeepEqual(r.host.calls, []string{"blkid -o value -s TYPE " + dev, "e2fsck -p " + dev,
		"mount -o noatime " + dev + " /var/lib/dynk8s-cache"}))
	_, err = os.Stat(filepath.Join(r.root, "var/lib/dynk8s-cache"))
	assert.Check(t, err)
}

// The cache is in /etc/fstab by its label, once, beside what was there: a reboot of the joined node mounts it again.
func TestFstab(t *testing.T) {
	r := newRig(t, 4)
	r.ec2.AddVolume("vol-0old", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	fstab := filepath.Join(r.root, "etc/fstab")
	assert.NilError(t, os.MkdirAll(filepath.Dir(fstab), 0o755))
	assert.NilError(t, os.WriteFile(fstab, []byte("UUID=abc / xfs defaults 0 0\nLABEL=old /var/lib/dynk8s-cache ext4 defaults 0 2\n"), 0o644))
	_, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	b, err := os.ReadFile(fstab)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), "UUID=abc / xfs defaults 0 0\nLABEL=dynk8s-cache /var/lib/dynk8s-cache ext4 noatime,nofail 0 2\n"))
}

// Where SELinux is enabled (Fedora's enforcing mode), the cache is mounted with the context of content containers
// share, at the mount and in /etc/fstab; elsewhere without it, which a kernel without SELinux would refuse.
func TestSELinuxContext(t *testing.T) {
	r := newRig(t, 4)
	r.ec2.AddVolume("vol-0old", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	enforce := filepath.Join(r.root, "sys/fs/selinux/enforce")
	assert.NilError(t, os.MkdirAll(filepath.Dir(enforce), 0o755))
	assert.NilError(t, os.WriteFile(enforce, []byte("1"), 0o644))
	_, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	dev := filepath.Join(r.root, "dev/nvme1n1")
	assert.Check(t, slices.Contains(r.host.calls, "mount -o noatime,context=system_u:object_r:container_file_t:s0 "+
		dev+" /var/lib/dynk8s-cache"), "%q", r.host.calls)
	b, err := os.ReadFile(filepath.Join(r.root, "etc/fstab"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), "LABEL=dynk8s-cache /var/lib/dynk8s-cache ext4 "+
		"noatime,context=system_u:object_r:container_file_t:s0,nofail 0 2\n"))
}

// Another node attaching the volume first is normal: the node takes the next free one.
func TestLostRaceTakesTheNext(t *testing.T) {
	r := newRig(t, 4)
	r.ec2.AddVolume("vol-0first", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	r.ec2.AddVolume("vol-0second", zone, ec2types.VolumeStateAvailable, t0.Add(time.Minute), poolTags("builders"))
	r.ec2.Volumes.Steal["vol-0first"] = true
	res, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	assert.Check(t, is.Equal(res.VolumeID, "vol-0second"))
	assert.Check(t, is.Contains(r.log.String(), "volume vol-0first was taken by another node (VolumeInUse): the next"))
}

// None free and the pool below its most: a volume of the configured size, type, IOPS and throughput, encrypted and
// tagged as the pool's cache, is created in the node's zone, attached, and given a file system.
func TestNoneFreeCreatesOne(t *testing.T) {
	r := newRig(t, 2)
	r.ec2.AddVolume("vol-0inuse", zone, ec2types.VolumeStateInUse, t0, poolTags("builders"))
	r.host.fs = ""
	res, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	assert.Check(t, res.Created && res.Formatted && !res.Remade, "%+v", res)
	assert.Check(t, is.Equal(r.ec2.VolumeCalls()[0], "create vol-0new0000000000001 100 GiB gp3 iops=4000 throughput=250 "+
		"encrypted=true in eu-central-1a tags=map[Name:homelab-builders-cache dynk8s:cache:builders "+
		"dynk8s:cluster:homelab dynk8s:pool:builders]"))
	dev := filepath.Join(r.root, "dev/nvme1n1")
	assert.Check(t, slices.Contains(r.host.calls, "mkfs.ext4 -q -F -m 0 -L dynk8s-cache "+dev), "%v", r.host.calls)
	assert.Check(t, !slices.ContainsFunc(r.host.calls, func(c string) bool { return strings.HasPrefix(c, "e2fsck") }))
}

// None free and the pool at its most (volumes in use, or free in another zone): no volume is created, and the
// error says why, for the join's one line.
func TestAtTheMostBootsWithout(t *testing.T) {
	r := newRig(t, 2)
	r.ec2.AddVolume("vol-0inuse", zone, ec2types.VolumeStateInUse, t0, poolTags("builders"))
	r.ec2.AddVolume("vol-0otherzone", "eu-central-1b", ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	_, err := r.cache.Attach(context.Background())
	assert.Check(t, errors.Is(err, ErrNoneFree), "%v", err)
	assert.Check(t, is.ErrorContains(err, "the pool's 2 volumes (its most) are in use or in other zones than eu-central-1a"))
	assert.Check(t, is.Len(r.ec2.VolumeCalls(), 0))
	assert.Check(t, is.Len(r.host.calls, 0))
}

// The API refusing (no permission, throttled past the SDK's retries) ends the attempt with its reason: nothing is
// mounted.
func TestAPIRefusal(t *testing.T) {
	r := newRig(t, 2)
	r.ec2.Volumes.FailCode = "UnauthorizedOperation"
	_, err := r.cache.Attach(context.Background())
	assert.Check(t, is.ErrorContains(err, "list the pool's cache volumes"))
	assert.Check(t, is.ErrorContains(err, "UnauthorizedOperation"))
	assert.Check(t, is.Len(r.host.calls, 0))
}

// An unclean file system that e2fsck repairs is kept; one it cannot repair, or a volume holding another file system,
// is made anew (a cache: its content is dropped, and the log says so).
func TestFileSystemRepairedOrRemade(t *testing.T) {
	for name, tc := range map[string]struct {
		fs                 string
		e2fsck             int
		repaired, remade   bool
		wantMkfs, wantFsck bool
	}{
		"clean":         {fs: "ext4", wantFsck: true},
		"repaired":      {fs: "ext4", e2fsck: 1, repaired: true, wantFsck: true},
		"unrepairable":  {fs: "ext4", e2fsck: 4, remade: true, wantFsck: true, wantMkfs: true},
		"another kind":  {fs: "xfs", remade: true, wantMkfs: true},
		"no filesystem": {fs: "", wantMkfs: true},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, 2)
			r.ec2.AddVolume("vol-0old", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
			r.host.fs, r.host.e2fsck = tc.fs, tc.e2fsck
			res, err := r.cache.Attach(context.Background())
			assert.NilError(t, err, r.log.String())
			assert.Check(t, is.Equal(res.Repaired, tc.repaired))
			assert.Check(t, is.Equal(res.Remade, tc.remade))
			has := func(prefix string) bool {
				return slices.ContainsFunc(r.host.calls, func(c string) bool { return strings.HasPrefix(c, prefix) })
			}
			assert.Check(t, is.Equal(has("mkfs.ext4"), tc.wantMkfs), "%v", r.host.calls)
			assert.Check(t, is.Equal(has("e2fsck"), tc.wantFsck), "%v", r.host.calls)
			assert.Check(t, has("mount -o noatime"))
		})
	}
}

// A device that never appears (the attachment EC2 reports is not reaching the kernel) ends the attempt in
// DeviceWait with the paths looked for.
func TestDeviceThatNeverAppears(t *testing.T) {
	r := newRig(t, 2)
	r.ec2.AddVolume("vol-0old", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	r.cache.Files.Root = t.TempDir() // the fake's links go elsewhere
	_, err := r.cache.Attach(context.Background())
	assert.Check(t, is.ErrorContains(err, "volume vol-0old is attached, but neither /dev/disk/by-id/"+
		"nvme-Amazon_Elastic_Block_Store_vol0old nor /dev/xvdf appeared in 1m0s"))
}

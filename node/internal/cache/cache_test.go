package cache

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

const (
	instance = "i-0123456789abcdef0"
	zone     = "eu-central-1a"
)

func apiErr(code string) error {
	return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 400}},
		Err: &smithy.GenericAPIError{Code: code, Message: code + " (fake)"}}
}

// fakeEC2 is EC2's volumes: DescribeVolumes with the tag filters the cache sends, CreateVolume, and AttachVolume,
// which refuses a volume that is not available and, on success, makes the device's NVMe link as udev would.
type fakeEC2 struct {
	mu      sync.Mutex
	root    string
	volumes []ec2types.Volume
	calls   []string
	// steal makes another node attach these volumes just before this node's attach.
	steal map[string]bool
	// refuse answers every call with this error code.
	refuse string
	n      int
}

func (f *fakeEC2) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeEC2) add(id, zone string, state ec2types.VolumeState, created time.Time, tags map[string]string) {
	v := ec2types.Volume{VolumeId: aws.String(id), AvailabilityZone: aws.String(zone), State: state, Size: aws.Int32(100),
		CreateTime: aws.Time(created)}
	for k, val := range tags {
		v.Tags = append(v.Tags, ec2types.Tag{Key: aws.String(k), Value: aws.String(val)})
	}
	f.volumes = append(f.volumes, v)
}

func poolTags(pool string) map[string]string {
	return map[string]string{names.TagCluster: "homelab", names.TagPool: pool, names.TagCache: pool}
}

func tagged(v ec2types.Volume, key, value string) bool {
	return slices.ContainsFunc(v.Tags, func(t ec2types.Tag) bool { return aws.ToString(t.Key) == key && aws.ToString(t.Value) == value })
}

func (f *fakeEC2) DescribeVolumes(_ context.Context, in *ec2.DescribeVolumesInput, _ ...func(*ec2.Options)) (*ec2.DescribeVolumesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != "" {
		return nil, apiErr(f.refuse)
	}
	out := &ec2.DescribeVolumesOutput{}
	for _, v := range f.volumes {
		ok := len(in.VolumeIds) == 0 || slices.Contains(in.VolumeIds, aws.ToString(v.VolumeId))
		for _, fl := range in.Filters {
			key, _ := strings.CutPrefix(aws.ToString(fl.Name), "tag:")
			ok = ok && tagged(v, key, fl.Values[0])
		}
		if ok {
			out.Volumes = append(out.Volumes, v)
		}
	}
	return out, nil
}

func (f *fakeEC2) CreateVolume(_ context.Context, in *ec2.CreateVolumeInput, _ ...func(*ec2.Options)) (*ec2.CreateVolumeOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	id := fmt.Sprintf("vol-0new%013d", f.n)
	tags := map[string]string{}
	for _, t := range in.TagSpecifications[0].Tags {
		tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	f.record("create %s %d GiB %s iops=%d throughput=%d encrypted=%t in %s tags=%v", id, aws.ToInt32(in.Size),
		in.VolumeType, aws.ToInt32(in.Iops), aws.ToInt32(in.Throughput), aws.ToBool(in.Encrypted),
		aws.ToString(in.AvailabilityZone), tags)
	f.add(id, aws.ToString(in.AvailabilityZone), ec2types.VolumeStateAvailable, time.Now(), tags)
	return &ec2.CreateVolumeOutput{VolumeId: aws.String(id)}, nil
}

func (f *fakeEC2) AttachVolume(_ context.Context, in *ec2.AttachVolumeInput, _ ...func(*ec2.Options)) (*ec2.AttachVolumeOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := aws.ToString(in.VolumeId)
	f.record("attach %s to %s as %s", id, aws.ToString(in.InstanceId), aws.ToString(in.Device))
	if f.refuse != "" {
		return nil, apiErr(f.refuse)
	}
	i := slices.IndexFunc(f.volumes, func(v ec2types.Volume) bool { return aws.ToString(v.VolumeId) == id })
	if f.steal[id] {
		f.volumes[i].State = ec2types.VolumeStateInUse
		f.volumes[i].Attachments = []ec2types.VolumeAttachment{{InstanceId: aws.String("i-0another000000000"),
			State: ec2types.VolumeAttachmentStateAttached}}
	}
	if f.volumes[i].State != ec2types.VolumeStateAvailable {
		return nil, apiErr("VolumeInUse")
	}
	f.volumes[i].State = ec2types.VolumeStateInUse
	f.volumes[i].Attachments = []ec2types.VolumeAttachment{{InstanceId: in.InstanceId,
		State: ec2types.VolumeAttachmentStateAttached}}
	dev := filepath.Join(f.root, "dev/nvme1n1")
	link := filepath.Join(f.root, "dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_"+strings.ReplaceAll(id, "-", ""))
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		return nil, err
	}
	return &ec2.AttachVolumeOutput{}, os.Symlink(dev, link)
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
	ec2   *fakeEC2
	host  *fakeHost
	cache *Cache
	log   *nodetest.SyncBuffer
}

func newRig(t *testing.T, maxVolumes int) *rig {
	root := t.TempDir()
	log := &nodetest.SyncBuffer{}
	logger := system.NewLogger("dynk8s-join", log, root)
	logger.Journal = false
	r := &rig{ec2: &fakeEC2{root: root, steal: map[string]bool{}}, host: &fakeHost{fs: "ext4"}, log: log}
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
	r.ec2.add("vol-0inuse", zone, ec2types.VolumeStateInUse, t0, poolTags("builders"))
	r.ec2.add("vol-0otherzone", "eu-central-1b", ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	r.ec2.add("vol-0otherpool", zone, ec2types.VolumeStateAvailable, t0, poolTags("arm"))
	r.ec2.add("vol-0newer", zone, ec2types.VolumeStateAvailable, t0.Add(time.Hour), poolTags("builders"))
	r.ec2.add("vol-0older", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	res, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	assert.Check(t, is.DeepEqual(res, Result{VolumeID: "vol-0older", Device: filepath.Join(r.ec2.root, "dev/nvme1n1")}))
	assert.Check(t, is.DeepEqual(r.ec2.calls, []string{"attach vol-0older to " + instance + " as /dev/sdf"}))
	dev := filepath.Join(r.ec2.root, "dev/nvme1n1")
	assert.Check(t, is.DeepEqual(r.host.calls, []string{"blkid -o value -s TYPE " + dev, "e2fsck -p " + dev,
		"mount -o noatime " + dev + " /var/lib/dynk8s-cache"}))
	_, err = os.Stat(filepath.Join(r.ec2.root, "var/lib/dynk8s-cache"))
	assert.Check(t, err)
}

// Another node attaching the volume first is normal: the node takes the next free one.
func TestLostRaceTakesTheNext(t *testing.T) {
	r := newRig(t, 4)
	r.ec2.add("vol-0first", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	r.ec2.add("vol-0second", zone, ec2types.VolumeStateAvailable, t0.Add(time.Minute), poolTags("builders"))
	r.ec2.steal["vol-0first"] = true
	res, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	assert.Check(t, is.Equal(res.VolumeID, "vol-0second"))
	assert.Check(t, is.Contains(r.log.String(), "volume vol-0first was taken by another node (VolumeInUse): the next"))
}

// None free and the pool below its most: a volume of the configured size, type, IOPS and throughput, encrypted and
// tagged as the pool's cache, is created in the node's zone, attached, and given a file system.
func TestNoneFreeCreatesOne(t *testing.T) {
	r := newRig(t, 2)
	r.ec2.add("vol-0inuse", zone, ec2types.VolumeStateInUse, t0, poolTags("builders"))
	r.host.fs = ""
	res, err := r.cache.Attach(context.Background())
	assert.NilError(t, err, r.log.String())
	assert.Check(t, res.Created && res.Formatted && !res.Remade, "%+v", res)
	assert.Check(t, is.Equal(r.ec2.calls[0], "create vol-0new0000000000001 100 GiB gp3 iops=4000 throughput=250 "+
		"encrypted=true in eu-central-1a tags=map[Name:homelab-builders-cache dynk8s:cache:builders "+
		"dynk8s:cluster:homelab dynk8s:pool:builders]"))
	dev := filepath.Join(r.ec2.root, "dev/nvme1n1")
	assert.Check(t, slices.Contains(r.host.calls, "mkfs.ext4 -q -F -m 0 -L dynk8s-cache "+dev), "%v", r.host.calls)
	assert.Check(t, !slices.ContainsFunc(r.host.calls, func(c string) bool { return strings.HasPrefix(c, "e2fsck") }))
}

// None free and the pool at its most (volumes in use, or free in another zone): no volume is created, and the
// error says why, for the join's one line.
func TestAtTheMostBootsWithout(t *testing.T) {
	r := newRig(t, 2)
	r.ec2.add("vol-0inuse", zone, ec2types.VolumeStateInUse, t0, poolTags("builders"))
	r.ec2.add("vol-0otherzone", "eu-central-1b", ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	_, err := r.cache.Attach(context.Background())
	assert.Check(t, errors.Is(err, ErrNoneFree), "%v", err)
	assert.Check(t, is.ErrorContains(err, "the pool's 2 volumes (its most) are in use or in other zones than eu-central-1a"))
	assert.Check(t, is.Len(r.ec2.calls, 0))
	assert.Check(t, is.Len(r.host.calls, 0))
}

// The API refusing (no permission, throttled past the SDK's retries) ends the attempt with its reason: nothing is
// mounted.
func TestAPIRefusal(t *testing.T) {
	r := newRig(t, 2)
	r.ec2.refuse = "UnauthorizedOperation"
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
			r.ec2.add("vol-0old", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
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
	r.ec2.add("vol-0old", zone, ec2types.VolumeStateAvailable, t0, poolTags("builders"))
	r.cache.Files.Root = t.TempDir() // the fake's links go elsewhere
	_, err := r.cache.Attach(context.Background())
	assert.Check(t, is.ErrorContains(err, "volume vol-0old is attached, but neither /dev/disk/by-id/"+
		"nvme-Amazon_Elastic_Block_Store_vol0old nor /dev/xvdf appeared in 1m0s"))
}

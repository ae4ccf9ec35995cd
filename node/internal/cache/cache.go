// Package cache gives a pool node its build cache before it joins: one EBS volume of the pool's, kept while the pool
// scales to zero and found again by the next node in the same zone. The node takes a free volume of its cluster,
// pool and zone (another node taking it first is normal: it takes the next), creates one when none is free and the
// pool keeps fewer than its most, waits for the device, makes a file system on a new volume, repairs an unclean one
// or, failing that, makes it anew (it is a cache: what cannot be repaired is dropped), and mounts it. A node
// without a cache (all taken, the pool at its most, the API refusing) boots without one: the caller logs the one
// reason and joins. EC2 detaches the volume when the instance terminates; nothing waits on that.
package cache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Volumes is what the cache asks of EC2; the SDK's client satisfies it.
type Volumes interface {
	DescribeVolumes(context.Context, *ec2.DescribeVolumesInput, ...func(*ec2.Options)) (*ec2.DescribeVolumesOutput, error)
	CreateVolume(context.Context, *ec2.CreateVolumeInput, ...func(*ec2.Options)) (*ec2.CreateVolumeOutput, error)
	AttachVolume(context.Context, *ec2.AttachVolumeInput, ...func(*ec2.Options)) (*ec2.AttachVolumeOutput, error)
}

// Device is the name the attachment asks for. On Nitro instances the volume appears as an NVMe device whatever the
// name, and udev links it by its volume id (EC2 User Guide, "Amazon EBS and NVMe"); on Xen ones the kernel names
// /dev/sdf /dev/xvdf ("Device names on Linux instances").
const Device = "/dev/sdf"

// Label is the file system's label.
const Label = "dynk8s-cache"

// SELinuxContext labels every file of the cache where SELinux is enabled (Fedora enforces it), given as the mount's
// context= option (mount(8), "Mount options for SELinux"): the type container-selinux gives content that containers
// share (container_file_t) at level s0, which every container's categories dominate. Without it the new file system's
// files would carry no label (unlabeled_t), which confined host domains may not touch and which containers could
// not use once CRI-O's selinux is turned on; with it no process can relabel them (there is nothing to restore).
const SELinuxContext = "system_u:object_r:container_file_t:s0"

// selinuxEnforce is selinuxfs's file: it exists where SELinux is enabled (selinuxfs(5)).
const selinuxEnforce = "/sys/fs/selinux/enforce"

// How long the steps that wait on EC2 may take: a new volume's creation, its attachment, its device's appearance.
// A cache that cannot be had in that time is given up: the node joins without it.
const (
	CreateWait = 2 * time.Minute
	AttachWait = 2 * time.Minute
	DeviceWait = time.Minute
	poll       = time.Second
	// rounds bounds the node's tries when other nodes keep taking the volumes it finds or creates.
	rounds = 3
)

// Cache attaches and mounts one node's cache.
type Cache struct {
	EC2   Volumes
	Host  system.Host
	Files system.Files
	Log   *system.Logger
	// Now and Sleep are the clock (tests make it instant).
	Now   func() time.Time
	Sleep func(context.Context, time.Duration) error
	// Cluster, Pool, Instance and Zone are the node's.
	Cluster, Pool, Instance, Zone string
	Config                        nodeconfig.Cache
}

// Result is the cache the node mounted.
type Result struct {
	VolumeID, Device string
	// Created: a volume of its own; Formatted: a new file system; Repaired: fsck fixed it; Remade: fsck could not,
	// and the file system was made anew (its content dropped).
	Created, Formatted, Repaired, Remade bool
}

// ErrNoneFree is a node that found no free volume and could create none, the pool keeping its most.
var ErrNoneFree = errors.New("no free cache volume")

// Attach finds or creates the node's volume, attaches it, and mounts its file system at the configured path.
func (c *Cache) Attach(ctx context.Context) (Result, error) {
	var res Result
	vol, created, err := c.volume(ctx)
	if err != nil {
		return res, err
	}
	res.VolumeID, res.Created = vol, created
	if res.Device, err = c.device(ctx, vol); err != nil {
		return res, err
	}
	if err := c.fileSystem(ctx, &res); err != nil {
		return res, err
	}
	if err := os.MkdirAll(c.Files.Root+c.Config.MountPath, 0o755); err != nil {
		return res, fmt.Errorf("create the mount point %s: %w", c.Config.MountPath, err)
	}
	if err := c.Host.Run(ctx, time.Minute, false, "mount", "-o", c.options(), res.Device, c.Config.MountPath); err != nil {
		return res, fmt.Errorf("mount %s (%s) at %s: %w", res.Device, vol, c.Config.MountPath, err)
	}
	return res, c.fstab()
}

// options are the mount's: noatime, and the SELinux context where SELinux is enabled (a kernel without it refuses
// the option).
func (c *Cache) options() string {
	if _, err := os.Stat(c.Files.Root + selinuxEnforce); err == nil {
		return "noatime,context=" + SELinuxContext
	}
	return "noatime"
}

// fstab mounts the cache at the node's later boots too, by its label: a joined node's reboot does not run the join
// again, and the attachment outlives the reboot. nofail: a boot that cannot mount it goes on (systemd.mount(5)).
func (c *Cache) fstab() error {
	path := c.Files.Etc("fstab")
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var lines []string
	for line := range strings.Lines(string(old)) {
		if f := strings.Fields(line); len(f) < 2 || f[1] != c.Config.MountPath {
			lines = append(lines, line)
		}
	}
	lines = append(lines, fmt.Sprintf("LABEL=%s %s ext4 %s,nofail 0 2\n", Label, c.Config.MountPath, c.options()))
	if err := system.WriteFileAtomic(path, []byte(strings.Join(lines, "")), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// volume attaches a free volume of the pool in the node's zone, or a new one, and waits for the attachment.
func (c *Cache) volume(ctx context.Context) (string, bool, error) {
	for range rounds {
		all, err := c.volumes(ctx)
		if err != nil {
			return "", false, err
		}
		for _, v := range free(all, c.Zone) {
			id := aws.ToString(v.VolumeId)
			switch err := c.attach(ctx, id); {
			case err == nil:
				c.Log.Printf("cache: attached volume %s (%d GiB, created %s)", id, aws.ToInt32(v.Size),
					aws.ToTime(v.CreateTime).UTC().Format(time.RFC3339))
				return id, false, c.waitAttached(ctx, id)
			case taken(err):
				c.Log.Printf("cache: volume %s was taken by another node (%s): the next", id, code(err))
			default:
				return "", false, fmt.Errorf("attach volume %s: %w", id, err)
			}
		}
		if len(all) >= c.Config.MaxVolumes {
			return "", false, fmt.Errorf("%w: the pool's %d volumes (its most) are in use or in other zones than %s",
				ErrNoneFree, len(all), c.Zone)
		}
		id, err := c.create(ctx)
		if err != nil {
			return "", false, err
		}
		switch err := c.attach(ctx, id); {
		case err == nil:
			return id, true, c.waitAttached(ctx, id)
		case taken(err):
			// Another node took the new volume for the pool's cache: it serves the pool all the same.
			c.Log.Printf("cache: the new volume %s was taken by another node: looking again", id)
		default:
			return "", false, fmt.Errorf("attach volume %s: %w", id, err)
		}
	}
	return "", false, fmt.Errorf("%w: other nodes took every volume found or made, %d times", ErrNoneFree, rounds)
}

// volumes are the pool's cache volumes, in every zone and state.
func (c *Cache) volumes(ctx context.Context) ([]ec2types.Volume, error) {
	var all []ec2types.Volume
	pages := ec2.NewDescribeVolumesPaginator(c.EC2, &ec2.DescribeVolumesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag:" + names.TagCluster), Values: []string{c.Cluster}},
		{Name: aws.String("tag:" + names.TagCache), Values: []string{c.Pool}},
	}})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list the pool's cache volumes: %w", err)
		}
		all = append(all, page.Volumes...)
	}
	return all, nil
}

// free are the available volumes in zone, the oldest first: the one most builds have filled.
func free(all []ec2types.Volume, zone string) []ec2types.Volume {
	var out []ec2types.Volume
	for _, v := range all {
		if v.State == ec2types.VolumeStateAvailable && aws.ToString(v.AvailabilityZone) == zone {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b ec2types.Volume) int {
		return cmp.Or(aws.ToTime(a.CreateTime).Compare(aws.ToTime(b.CreateTime)),
			cmp.Compare(aws.ToString(a.VolumeId), aws.ToString(b.VolumeId)))
	})
	return out
}

func (c *Cache) attach(ctx context.Context, id string) error {
	_, err := c.EC2.AttachVolume(ctx, &ec2.AttachVolumeInput{VolumeId: aws.String(id), InstanceId: aws.String(c.Instance),
		Device: aws.String(Device)})
	return err
}

// taken is an attachment refused because the volume is no longer free: another node attached it between the list
// and the attach (EC2 API reference, "Error codes": VolumeInUse, IncorrectState).
func taken(err error) bool {
	return slices.Contains([]string{"VolumeInUse", "IncorrectState"}, code(err))
}

func code(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

// create makes a volume for the pool in the node's zone, tagged as the pool's cache, and waits until it is
// available.
func (c *Cache) create(ctx context.Context) (string, error) {
	cfg := c.Config
	tags := []ec2types.Tag{
		{Key: aws.String("Name"), Value: aws.String(c.Cluster + "-" + c.Pool + "-cache")},
		{Key: aws.String(names.TagCluster), Value: aws.String(c.Cluster)},
		{Key: aws.String(names.TagPool), Value: aws.String(c.Pool)},
		{Key: aws.String(names.TagCache), Value: aws.String(c.Pool)},
	}
	in := &ec2.CreateVolumeInput{
		AvailabilityZone: aws.String(c.Zone), Size: aws.Int32(int32(cfg.SizeGiB)),
		VolumeType: ec2types.VolumeType(cfg.VolumeType), Encrypted: aws.Bool(true),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeVolume, Tags: tags}},
	}
	if cfg.IOPS > 0 {
		in.Iops = aws.Int32(int32(cfg.IOPS))
	}
	if cfg.Throughput > 0 {
		in.Throughput = aws.Int32(int32(cfg.Throughput))
	}
	out, err := c.EC2.CreateVolume(ctx, in)
	if err != nil {
		return "", fmt.Errorf("create a cache volume: %w", err)
	}
	id := aws.ToString(out.VolumeId)
	c.Log.Printf("cache: created volume %s (%d GiB %s in %s)", id, cfg.SizeGiB, cfg.VolumeType, c.Zone)
	err = c.waitFor(ctx, CreateWait, "volume "+id+" to be available", func(v ec2types.Volume) bool {
		return v.State == ec2types.VolumeStateAvailable
	}, id)
	return id, err
}

func (c *Cache) waitAttached(ctx context.Context, id string) error {
	return c.waitFor(ctx, AttachWait, "volume "+id+" to be attached", func(v ec2types.Volume) bool {
		for _, a := range v.Attachments {
			if aws.ToString(a.InstanceId) == c.Instance && a.State == ec2types.VolumeAttachmentStateAttached {
				return true
			}
		}
		return false
	}, id)
}

// waitFor reads volume id until ok, for at most limit.
func (c *Cache) waitFor(ctx context.Context, limit time.Duration, what string, ok func(ec2types.Volume) bool, id string) error {
	deadline := c.Now().Add(limit)
	for {
		out, err := c.EC2.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{VolumeIds: []string{id}})
		if err == nil && len(out.Volumes) == 1 && ok(out.Volumes[0]) {
			return nil
		}
		if c.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("waited %s for %s: %w", limit, what, err)
			}
			return fmt.Errorf("waited %s for %s", limit, what)
		}
		if err := c.Sleep(ctx, poll); err != nil {
			return err
		}
	}
}

// device is the attached volume's block device: the NVMe link udev makes by its volume id, or the Xen name.
func (c *Cache) device(ctx context.Context, id string) (string, error) {
	nvme := c.Files.Root + "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_" + strings.ReplaceAll(id, "-", "")
	xen := c.Files.Root + "/dev/xvd" + strings.TrimPrefix(Device, "/dev/sd")
	deadline := c.Now().Add(DeviceWait)
	for {
		for _, p := range []string{nvme, xen} {
			if _, err := os.Stat(p); err == nil {
				if resolved, err := filepath.EvalSymlinks(p); err == nil {
					return resolved, nil
				}
				return p, nil
			}
		}
		if c.Now().After(deadline) {
			return "", fmt.Errorf("volume %s is attached, but neither %s nor %s appeared in %s", id,
				strings.TrimPrefix(nvme, c.Files.Root), strings.TrimPrefix(xen, c.Files.Root), DeviceWait)
		}
		if err := c.Sleep(ctx, poll); err != nil {
			return "", err
		}
	}
}

// fileSystem makes sure the device holds a clean ext4: made on a new volume, checked and repaired (e2fsck -p) on
// one with a file system, made anew when the repair fails or the volume holds something else.
func (c *Cache) fileSystem(ctx context.Context, res *Result) error {
	out, err := c.Host.Output(ctx, time.Minute, "blkid", "-o", "value", "-s", "TYPE", res.Device)
	fsType := strings.TrimSpace(out)
	// blkid exits 2 when it finds no file system (blkid(8), "RETURN CODE").
	if err != nil && !exitCode(err, 2) {
		return fmt.Errorf("read the file system of %s: %w", res.Device, err)
	}
	switch fsType {
	case "":
		res.Formatted = true
		return c.mkfs(ctx, res.Device, "a new volume")
	case "ext4":
		// e2fsck -p repairs what is safe to repair without a question: 0 clean, 1 repaired (e2fsck(8), "EXIT
		// CODE"); anything else left it unrepaired.
		err := c.Host.Run(ctx, 10*time.Minute, false, "e2fsck", "-p", res.Device)
		switch {
		case err == nil:
			return nil
		case exitCode(err, 1):
			res.Repaired = true
			c.Log.Printf("cache: e2fsck repaired the file system of %s", res.VolumeID)
			return nil
		default:
			res.Remade = true
			c.Log.Printf("cache: e2fsck could not repair the file system of %s (%v): making it anew, its content "+
				"dropped", res.VolumeID, err)
			return c.mkfs(ctx, res.Device, "an unrepairable one")
		}
	default:
		res.Remade = true
		c.Log.Printf("cache: volume %s holds %s, not the cache's ext4: making it anew", res.VolumeID, fsType)
		return c.mkfs(ctx, res.Device, "a "+fsType+" one")
	}
}

func (c *Cache) mkfs(ctx context.Context, dev, instead string) error {
	// -m 0: no blocks reserved for root on a cache; -F: over what was there.
	if err := c.Host.Run(ctx, 10*time.Minute, false, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", Label, dev); err != nil {
		return fmt.Errorf("make a file system on %s (%s): %w", dev, instead, err)
	}
	return nil
}

func exitCode(err error, code int) bool {
	var ee *system.ExitError
	return errors.As(err, &ee) && ee.Code == code
}

package cloudfake

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// Volumes is EC2's volumes, the build cache's (node/internal/cache): DescribeVolumes with ids and tag filters,
// CreateVolume, and AttachVolume, which refuses a volume that is not available (VolumeInUse) as EC2 does.
type Volumes struct {
	List []ec2types.Volume
	// Steal makes another node attach these volumes just before the boot's attach.
	Steal map[string]bool
	// FailCode answers every volume call with this error code ("": none).
	FailCode string
	// OnAttach runs at a successful attachment: what the kernel and udev then make (a test's device link).
	OnAttach func(volumeID string) error
	calls    []string
	created  int
}

// AddVolume is a volume in zone, in state, created at created, with tags.
func (f *EC2) AddVolume(id, zone string, state ec2types.VolumeState, created time.Time, tags map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := ec2types.Volume{VolumeId: aws.String(id), AvailabilityZone: aws.String(zone), State: state, Size: aws.Int32(100),
		CreateTime: aws.Time(created)}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		v.Tags = append(v.Tags, ec2types.Tag{Key: aws.String(k), Value: aws.String(tags[k])})
	}
	f.Volumes.List = append(f.Volumes.List, v)
}

// VolumeCalls are the CreateVolume and AttachVolume calls, one line each.
func (f *EC2) VolumeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.Volumes.calls)
}

func hasTag(v ec2types.Volume, key, value string) bool {
	return slices.ContainsFunc(v.Tags, func(t ec2types.Tag) bool {
		return aws.ToString(t.Key) == key && aws.ToString(t.Value) == value
	})
}

// DescribeVolumes lists the volumes of the ids asked (all without), filtered by "tag:KEY" filters.
func (f *EC2) DescribeVolumes(_ context.Context, in *ec2.DescribeVolumesInput, _ ...func(*ec2.Options)) (*ec2.DescribeVolumesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Volumes.FailCode != "" {
		return nil, APIErr(400, f.Volumes.FailCode, f.Volumes.FailCode+" (fake)")
	}
	out := &ec2.DescribeVolumesOutput{}
	for _, v := range f.Volumes.List {
		ok := len(in.VolumeIds) == 0 || slices.Contains(in.VolumeIds, aws.ToString(v.VolumeId))
		for _, fl := range in.Filters {
			key, isTag := strings.CutPrefix(aws.ToString(fl.Name), "tag:")
			ok = ok && isTag && hasTag(v, key, fl.Values[0])
		}
		if ok {
			out.Volumes = append(out.Volumes, v)
		}
	}
	return out, nil
}

// CreateVolume makes an available volume with the request's zone and tags, and records the request.
func (f *EC2) CreateVolume(_ context.Context, in *ec2.CreateVolumeInput, _ ...func(*ec2.Options)) (*ec2.CreateVolumeOutput, error) {
	f.mu.Lock()
	tags := map[string]string{}
	for _, spec := range in.TagSpecifications {
		for _, t := range spec.Tags {
			tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
		}
	}
	f.Volumes.created++
	id := fmt.Sprintf("vol-0new%013d", f.Volumes.created)
	f.Volumes.calls = append(f.Volumes.calls, fmt.Sprintf("create %s %d GiB %s iops=%d throughput=%d encrypted=%t in %s tags=%v",
		id, aws.ToInt32(in.Size), in.VolumeType, aws.ToInt32(in.Iops), aws.ToInt32(in.Throughput),
		aws.ToBool(in.Encrypted), aws.ToString(in.AvailabilityZone), tags))
	fail := f.Volumes.FailCode
	f.mu.Unlock()
	if fail != "" {
		return nil, APIErr(400, fail, fail+" (fake)")
	}
	f.AddVolume(id, aws.ToString(in.AvailabilityZone), ec2types.VolumeStateAvailable, time.Now(), tags)
	return &ec2.CreateVolumeOutput{VolumeId: aws.String(id)}, nil
}

// AttachVolume attaches an available volume to the instance asked, or answers VolumeInUse.
func (f *EC2) AttachVolume(_ context.Context, in *ec2.AttachVolumeInput, _ ...func(*ec2.Options)) (*ec2.AttachVolumeOutput, error) {
	f.mu.Lock()
	id := aws.ToString(in.VolumeId)
	f.Volumes.calls = append(f.Volumes.calls, fmt.Sprintf("attach %s to %s as %s", id, aws.ToString(in.InstanceId),
		aws.ToString(in.Device)))
	if f.Volumes.FailCode != "" {
		f.mu.Unlock()
		return nil, APIErr(400, f.Volumes.FailCode, f.Volumes.FailCode+" (fake)")
	}
	i := slices.IndexFunc(f.Volumes.List, func(v ec2types.Volume) bool { return aws.ToString(v.VolumeId) == id })
	if i < 0 {
		f.mu.Unlock()
		return nil, APIErr(400, "InvalidVolume.NotFound", "The volume '"+id+"' does not exist.")
	}
	v := &f.Volumes.List[i]
	if f.Volumes.Steal[id] {
		v.State = ec2types.VolumeStateInUse
		v.Attachments = []ec2types.VolumeAttachment{{InstanceId: aws.String("i-0another000000000"),
			State: ec2types.VolumeAttachmentStateAttached}}
	}
	if v.State != ec2types.VolumeStateAvailable {
		f.mu.Unlock()
		return nil, APIErr(400, "VolumeInUse", "vol is already attached to an instance")
	}
	v.State = ec2types.VolumeStateInUse
	v.Attachments = []ec2types.VolumeAttachment{{InstanceId: in.InstanceId, State: ec2types.VolumeAttachmentStateAttached}}
	hook := f.Volumes.OnAttach
	f.mu.Unlock()
	if hook != nil {
		if err := hook(id); err != nil {
			return nil, err
		}
	}
	return &ec2.AttachVolumeOutput{}, nil
}

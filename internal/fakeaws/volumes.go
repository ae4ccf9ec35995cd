package fakeaws

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// EC2Volume is an EBS volume the fake knows: DescribeVolumes lists it, DeleteVolume deletes an available one, and
// CreateTags tags it.
type EC2Volume struct {
	ID, Zone string
	// State is available, in-use, ...; Attached is the instance an in-use volume is attached to.
	State, Attached string
	Created         time.Time
	Tags            map[string]string
}

// AddVolumes makes volumes known.
func (e *EC2) AddVolumes(volumes ...EC2Volume) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, v := range volumes {
		v.Tags = maps.Clone(v.Tags)
		e.volumes = append(e.volumes, &v)
	}
}

// Volume is volume id as the fake has it now, and whether it knows it (a deleted volume is gone).
func (e *EC2) Volume(id string) (EC2Volume, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if v := e.volume(id); v != nil {
		out := *v
		out.Tags = maps.Clone(v.Tags)
		return out, true
	}
	return EC2Volume{}, false
}

// Deleted are the volumes deleted so far, in order.
func (e *EC2) Deleted() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.deleted)
}

// AttachBeforeDelete makes volume id be attached to instance just before a DeleteVolume of it, as a node taking it
// between the controller's list and its delete would.
func (e *EC2) AttachBeforeDelete(id, instance string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.attachBeforeDelete == nil {
		e.attachBeforeDelete = map[string]string{}
	}
	e.attachBeforeDelete[id] = instance
}

func (e *EC2) volume(id string) *EC2Volume {
	for _, v := range e.volumes {
		if v.ID == id {
			return v
		}
	}
	return nil
}

// volumeMatches says whether v passes every filter the controller sends (tag:KEY, tag-key, status).
func (e *EC2) volumeMatches(v *EC2Volume, filters map[string][]string) bool {
	for name, values := range filters {
		var have []string
		switch {
		case name == "status":
			have = []string{v.State}
		case name == "tag-key":
			have = slices.Collect(maps.Keys(v.Tags))
		case strings.HasPrefix(name, "tag:"):
			if val, ok := v.Tags[strings.TrimPrefix(name, "tag:")]; ok {
				have = []string{val}
			}
		default:
			e.problemf("DescribeVolumes: a filter the fake does not know: %s", name)
			return false
		}
		if !slices.ContainsFunc(values, func(val string) bool { return slices.Contains(have, val) }) {
			return false
		}
	}
	return true
}

// describeVolumes is DescribeVolumes with filters, in one page.
func (e *EC2) describeVolumes(w http.ResponseWriter, filters map[string][]string) {
	var b strings.Builder
	fmt.Fprintf(&b, `<DescribeVolumesResponse %s><requestId>fake</requestId><volumeSet>`, ec2NS)
	for _, v := range e.volumes {
		if !e.volumeMatches(v, filters) {
			continue
		}
		fmt.Fprintf(&b, `<item><volumeId>%s</volumeId><size>100</size><availabilityZone>%s</availabilityZone>`+
			`<status>%s</status><createTime>%s</createTime><volumeType>gp3</volumeType><encrypted>true</encrypted>`,
			v.ID, v.Zone, v.State, v.Created.UTC().Format(time.RFC3339Nano))
		if v.Attached != "" {
			fmt.Fprintf(&b, `<attachmentSet><item><volumeId>%s</volumeId><instanceId>%s</instanceId>`+
				`<device>/dev/sdf</device><status>attached</status></item></attachmentSet>`, v.ID, v.Attached)
		} else {
			b.WriteString(`<attachmentSet/>`)
		}
		b.WriteString(`<tagSet>`)
		for _, k := range slices.Sorted(maps.Keys(v.Tags)) {
			fmt.Fprintf(&b, `<item><key>%s</key><value>%s</value></item>`, xmlText(k), xmlText(v.Tags[k]))
		}
		b.WriteString(`</tagSet></item>`)
	}
	b.WriteString(`</volumeSet></DescribeVolumesResponse>`)
	_, _ = io.WriteString(w, b.String())
}

// deleteVolume is DeleteVolume (EC2 API Reference: VolumeId): an available volume goes; one in use is
// VolumeInUse, an unknown one InvalidVolume.NotFound.
func (e *EC2) deleteVolume(w http.ResponseWriter, form url.Values) {
	id := form.Get("VolumeId")
	v := e.volume(id)
	if instance, ok := e.attachBeforeDelete[id]; ok && v != nil {
		v.State, v.Attached = "in-use", instance
	}
	switch {
	case v == nil:
		ec2Error(w, http.StatusBadRequest, "InvalidVolume.NotFound", fmt.Sprintf("The volume '%s' does not exist.", id))
		return
	case v.State != "available":
		ec2Error(w, http.StatusBadRequest, "VolumeInUse", fmt.Sprintf("Volume %s is currently attached to %s", id, v.Attached))
		return
	}
	e.volumes = slices.DeleteFunc(e.volumes, func(x *EC2Volume) bool { return x.ID == id })
	e.deleted = append(e.deleted, id)
	_, _ = fmt.Fprintf(w, `<DeleteVolumeResponse %s><requestId>fake</requestId><return>true</return></DeleteVolumeResponse>`, ec2NS)
}

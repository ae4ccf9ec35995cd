package caches

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/cluster/internal/loop/looptest"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/names"
)

var t0 = time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)

const day = 24 * time.Hour

type fixture struct {
	*looptest.Rig
	c   *Controller
	ec2 *fakeaws.EC2
}

func newFixture(t *testing.T, pools map[string]Pool, volumes ...fakeaws.EC2Volume) *fixture {
	t.Helper()
	rig := looptest.New(t0)
	fake, client := cloudtest.EC2(t)
	fake.AddVolumes(volumes...)
	c, err := New(Config{Cluster: "homelab", Pools: pools, EC2: client}, rig.Deps())
	assert.NilError(t, err)
	return &fixture{Rig: rig, c: c, ec2: fake}
}

// vol is a cache volume of pool, created age before t0, attached to instance ("": available), with its mark ("":
// none) and more tags.
func vol(id, pool string, age time.Duration, instance, used string) fakeaws.EC2Volume {
	v := fakeaws.EC2Volume{ID: id, Zone: "eu-central-1a", State: "available", Created: t0.Add(-age),
		Tags: map[string]string{names.TagCluster: "homelab", names.TagPool: pool, names.TagCache: pool}}
	if instance != "" {
		v.State, v.Attached = "in-use", instance
	}
	if used != "" {
		v.Tags[names.TagCacheUsed] = used
	}
	return v
}

func (f *fixture) deleted(t *testing.T, reason string) float64 {
	return looptest.Counter(t, f.c.deleted.WithLabelValues(reason))
}

func TestParsePools(t *testing.T) {
	pools, err := ParsePools("builders:4:14,arm:2:1")
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(pools, map[string]Pool{"builders": {Max: 4, MaxIdle: 14 * day}, "arm": {Max: 2, MaxIdle: day}}))
	empty, err := ParsePools("")
	assert.NilError(t, err)
	assert.Check(t, is.Len(empty, 0))
	for bad, want := range map[string]string{
		"builders:4":        "is not POOL:MAX:IDLE_DAYS",
		"builders:0:14":     "the most volumes is a positive number",
		"builders:4:x":      "the idle days are a positive number",
		"b:1:1,b:2:2":       "pool b is named twice",
		":1:1":              "is not POOL:MAX:IDLE_DAYS",
		"builders:4:14:yes": "is not POOL:MAX:IDLE_DAYS",
	} {
		_, err := ParsePools(bad)
		assert.Check(t, is.ErrorContains(err, want), bad)
	}
}

func TestConfigNamesWhatIsWrong(t *testing.T) {
	_, err := New(Config{Pools: map[string]Pool{"b": {}}, Every: -time.Second}, looptest.New(t0).Deps())
	assert.Check(t, is.ErrorContains(err, "Cluster is required"))
	assert.Check(t, is.ErrorContains(err, "EC2 is required"))
	assert.Check(t, is.ErrorContains(err, `pool "b" needs a positive most and idle time`))
	assert.Check(t, is.ErrorContains(err, "Every must not be negative"))
}

// One look: a volume of a pool that keeps no cache goes, one unused for longer than its pool's idle time goes
// (counted from its mark, or from its creation without one), the least recently used beyond the pool's most go;
// volumes in use are marked with the time and never deleted, however many or old; another cluster's and a volume
// that is no cache are not even listed.
func TestKeep(t *testing.T) {
	pools := map[string]Pool{"builders": {Max: 2, MaxIdle: 14 * day}, "arm": {Max: 1, MaxIdle: 14 * day}}
	other := vol("vol-0othercluster0001", "builders", 90*day, "", "")
	other.Tags[names.TagCluster] = "another"
	notCache := vol("vol-0notacache000001", "builders", 90*day, "", "")
	delete(notCache.Tags, names.TagCache)
	f := newFixture(t, pools,
		vol("vol-0gonepool0000001", "retired", time.Hour, "", ""),
		vol("vol-0idlemarked00001", "builders", 60*day, "", t0.Add(-20*day).Format(time.RFC3339)),
		vol("vol-0idlecreated0001", "builders", 15*day, "", ""),
		vol("vol-0freshmarked0001", "builders", 60*day, "", t0.Add(-2*day).Format(time.RFC3339)),
		vol("vol-0inuseold0000001", "builders", 90*day, "i-0a", ""),
		vol("vol-0inuseold0000002", "builders", 90*day, "i-0b", t0.Add(-30*day).Format(time.RFC3339)),
		vol("vol-0armolder0000001", "arm", 5*day, "", ""),
		vol("vol-0armnewer0000001", "arm", 1*day, "", ""),
		other, notCache,
	)
	assert.NilError(t, f.c.Keep(context.Background()))
	deleted := f.ec2.Deleted()
	slices.Sort(deleted)
	// builders: the free fresh one is beyond the pool's most of 2 with two in use, and goes too.
	assert.Check(t, is.DeepEqual(deleted, []string{"vol-0armolder0000001", "vol-0freshmarked0001", "vol-0gonepool0000001",
		"vol-0idlecreated0001", "vol-0idlemarked00001"}))
	assert.Check(t, is.Equal(f.deleted(t, ReasonNoPool), 1.0))
	assert.Check(t, is.Equal(f.deleted(t, ReasonIdle), 2.0))
	assert.Check(t, is.Equal(f.deleted(t, ReasonMost), 2.0))
	for _, id := range []string{"vol-0inuseold0000001", "vol-0inuseold0000002"} {
		v, ok := f.ec2.Volume(id)
		assert.Check(t, ok, "an attached volume was deleted")
		assert.Check(t, is.Equal(v.Tags[names.TagCacheUsed], t0.Format(time.RFC3339)), id)
	}
	for _, id := range []string{"vol-0othercluster0001", "vol-0notacache000001", "vol-0armnewer0000001"} {
		_, ok := f.ec2.Volume(id)
		assert.Check(t, ok, "%s was deleted", id)
	}
	assert.Check(t, is.Contains(f.Logs.String(), "volume=vol-0idlemarked00001 pool=builders reason=idle"))

	// A second look at once changes nothing and marks nothing again.
	calls := len(f.ec2.TagCalls())
	assert.NilError(t, f.c.Keep(context.Background()))
	assert.Check(t, is.Len(f.ec2.Deleted(), 5))
	assert.Check(t, is.Len(f.ec2.TagCalls(), calls))
	// An hour and more later the volumes in use are marked again, in one call.
	f.Clock.Step(markAgain + time.Minute)
	assert.NilError(t, f.c.Keep(context.Background()))
	assert.Check(t, is.Len(f.ec2.TagCalls(), calls+1))
	assert.Check(t, strings.Contains(f.ec2.TagCalls()[calls], "ResourceId.2="), f.ec2.TagCalls()[calls])
}

// A node attaching a volume between the list and the delete: EC2 refuses the delete, the volume stays, the error
// says so, and nothing else is held up.
func TestAttachedMeanwhileIsNotDeleted(t *testing.T) {
	f := newFixture(t, map[string]Pool{"builders": {Max: 4, MaxIdle: day}},
		vol("vol-0takenmeanwhile1", "builders", 3*day, "", ""),
		vol("vol-0idle00000000001", "builders", 3*day, "", ""))
	f.ec2.AttachBeforeDelete("vol-0takenmeanwhile1", "i-0c")
	err := f.c.Keep(context.Background())
	assert.Check(t, is.ErrorContains(err, "ec2:DeleteVolume vol-0takenmeanwhile1"))
	assert.Check(t, is.ErrorContains(err, "VolumeInUse"))
	_, ok := f.ec2.Volume("vol-0takenmeanwhile1")
	assert.Check(t, ok)
	assert.Check(t, is.DeepEqual(f.ec2.Deleted(), []string{"vol-0idle00000000001"}))
	assert.Check(t, is.Equal(f.deleted(t, ReasonRefused), 1.0))
}

package cloud_test

import (
	"context"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/cluster/internal/cloud"
	"github.com/dynk8s/dynk8s/cluster/internal/cloud/cloudtest"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

func TestLiveOfClusterAsksOnceForPendingAndRunningOfTheCluster(t *testing.T) {
	fake, c := cloudtest.EC2(t,
		fakeaws.EC2Instance{ID: "i-0000000000000a001", State: "running", Tags: map[string]string{"dynk8s:cluster": "homelab", cloud.TagGroup: "g"}},
		fakeaws.EC2Instance{ID: "i-0000000000000a002", State: "pending", Tags: map[string]string{"dynk8s:cluster": "homelab"}},
		fakeaws.EC2Instance{ID: "i-0000000000000a003", State: "terminated", Tags: map[string]string{"dynk8s:cluster": "homelab"}},
		fakeaws.EC2Instance{ID: "i-0000000000000a004", State: "running", Tags: map[string]string{"dynk8s:cluster": "other"}},
	)
	fake.EmptyPages(2)
	live, err := cloud.LiveOfCluster(context.Background(), c, "homelab")
	assert.NilError(t, err)
	assert.Equal(t, len(live), 2)
	assert.Equal(t, live["i-0000000000000a001"].Tags[cloud.TagGroup], "g")
	assert.Assert(t, live["i-0000000000000a002"].Live())
	assert.DeepEqual(t, fake.Filters()[0], map[string][]string{
		"instance-state-name": {"pending", "running"}, "tag:dynk8s:cluster": {"homelab"}})
}

func TestByIDLeavesOutWhatEC2NoLongerKnows(t *testing.T) {
	_, c := cloudtest.EC2(t,
		fakeaws.EC2Instance{ID: "i-0000000000000a001", State: "terminated"},
		fakeaws.EC2Instance{ID: "i-0000000000000a002", State: "stopped"},
	)
	got, err := cloud.ByID(context.Background(), c, []string{"i-0000000000000a002", "i-0000000000000a001", "i-0000000000000a009", "i-0000000000000a001"})
	assert.NilError(t, err)
	assert.Equal(t, len(got), 2)
	assert.Assert(t, got["i-0000000000000a001"].Gone())
	assert.Assert(t, !got["i-0000000000000a002"].Gone() && !got["i-0000000000000a002"].Live())
}

func TestDescribeSaysWhatFailed(t *testing.T) {
	fake, c := cloudtest.EC2(t)
	fake.Fail(1, 403, "UnauthorizedOperation")
	_, err := cloud.LiveOfCluster(context.Background(), c, "homelab")
	assert.ErrorContains(t, err, "UnauthorizedOperation")
}

package bake

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The agent's and its bootstrap's one reason, as their units print it to the console (journal+console, with the
// syslog identifier), is what a failed bake reports; the kernel log's copy and other units' lines are not taken.
func TestFailureLine(t *testing.T) {
	for console, want := range map[string]string{
		"[  OK  ] Started foo.service\n[   52.1] dynk8s-bake[812]: FAILED: dnf install: no package kubelet-1.34.4 in dynk8s-kubernetes\nmore":
		/**/ "FAILED: dnf install: no package kubelet-1.34.4 in dynk8s-kubernetes",
		"[   20.0] dynk8s-agent[601]: FAILED: the agent's sha256 is 00ff, not abcd\n":
		/**/ "FAILED: the agent's sha256 is 00ff, not abcd",
		"[   20.0] cloud-init[500]: FAILED: something of cloud-init's\n": "",
		"all went well\n": "",
	} {
		assert.Check(t, is.Equal(FailureLine(console), want), console)
	}
}

func image(id, created string, state ec2types.ImageState) ec2types.Image {
	return ec2types.Image{ImageId: aws.String(id), CreationDate: aws.String(created), State: state}
}

// Pruning keeps the current image and the newest others up to keep, never touches a pending image (another bake's),
// and takes a failed one whatever its age.
func TestStale(t *testing.T) {
	av, pe, fa := ec2types.ImageStateAvailable, ec2types.ImageStatePending, ec2types.ImageStateFailed
	images := []ec2types.Image{
		image("ami-1", "2026-01-01T00:00:00.000Z", av),
		image("ami-4", "2026-04-01T00:00:00.000Z", av),
		image("ami-2", "2026-02-01T00:00:00.000Z", av),
		image("ami-5", "2026-05-01T00:00:00.000Z", pe),
		image("ami-3", "2026-03-01T00:00:00.000Z", fa),
		image("ami-0", "2025-12-01T00:00:00.000Z", av),
	}
	ids := func(imgs []ec2types.Image) []string {
		var out []string
		for _, i := range imgs {
			out = append(out, aws.ToString(i.ImageId))
		}
		return out
	}
	assert.Check(t, is.DeepEqual(ids(Stale(images, "ami-4", 2)), []string{"ami-3", "ami-1", "ami-0"}))
	// The current image is kept even when older ones are newer (a rollback's config baked long ago).
	assert.Check(t, is.DeepEqual(ids(Stale(images, "ami-0", 2)), []string{"ami-3", "ami-2", "ami-1"}))
	assert.Check(t, is.DeepEqual(ids(Stale(images, "ami-4", 1)), []string{"ami-3", "ami-2", "ami-1", "ami-0"}))
	assert.Check(t, is.Len(Stale(images, "ami-4", 10), 1), "only the failed image goes")
}

func TestSelectPools(t *testing.T) {
	cfg := &config.Config{NodePools: []config.NodePool{{Name: "a", Image: config.ImageBaked},
		{Name: "b", Image: config.ImageStock}, {Name: "c", Image: config.ImageBaked}}}
	names := func(pools []config.NodePool) []string {
		var out []string
		for _, p := range pools {
			out = append(out, p.Name)
		}
		return out
	}
	all, err := selectPools(cfg, "")
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(names(all), []string{"a", "c"}))
	one, err := selectPools(cfg, "c")
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(names(one), []string{"c"}))
	_, err = selectPools(cfg, "b")
	assert.Check(t, is.ErrorContains(err, "-pool b: no baked pool of that name (baked: a, c)"))
}

// The default -timeout outlasts the bake instance's own worst case, read from the deadlines the user data renders
// (the launch, the agent fetch's unit, the bake unit), and leaves the image's snapshot at least 15 minutes.
func TestTimeoutOutlastsTheBake(t *testing.T) {
	worst := nodeconfig.LaunchEstimate + nodeconfig.AgentFetchUnitTimeout(nodeconfig.BakeAgentFetch) +
		nodeconfig.BakeDeadline + nodeconfig.UnitSlack
	assert.Check(t, Timeout >= worst+15*time.Minute, "-timeout %s, the bake's worst case %s", Timeout, worst)
}

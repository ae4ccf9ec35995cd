package boot

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// withCache gives the rig's pool a build cache of at most most volumes, one free volume of it in the instance's zone
// when free, and the device an attachment makes.
func (r *rig) withCache(most int, free bool) {
	r.cfg.Cache = &nodeconfig.Cache{SizeGiB: 100, VolumeType: "gp3", MountPath: "/var/lib/dynk8s-cache", MaxVolumes: most}
	tags := map[string]string{names.TagCluster: "homelab", names.TagPool: "spot-arm64", names.TagCache: "spot-arm64"}
	state := ec2types.VolumeStateInUse
	if free {
		state = ec2types.VolumeStateAvailable
	}
	r.ec2.AddVolume("vol-0cache00000000001", "eu-central-1a", state, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), tags)
	r.ec2.Volumes.OnAttach = func(id string) error {
		dev := filepath.Join(r.root, "dev/nvme1n1")
		link := filepath.Join(r.root, "dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_"+strings.ReplaceAll(id, "-", ""))
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dev, nil, 0o600); err != nil {
			return err
		}
		return os.Symlink(dev, link)
	}
	r.host.blkid = "ext4"
}

func nodeLabels(t *testing.T, joinConfig string) string {
	t.Helper()
	for _, a := range nodetest.ParseJoinConfig(t, joinConfig).NodeRegistration.KubeletExtraArgs {
		if a.Name == "node-labels" {
			return a.Value
		}
	}
	return ""
}

// A pool with a cache: the boot attaches a free volume and mounts it before kubeadm join starts the kubelet (its own
// phase, timed), and the Node registers with the cache label.
func TestJoinMountsTheCache(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.withCache(2, true)
	run := r.join()
	assert.NilError(t, run.err)
	mount := slices.IndexFunc(run.calls, func(c string) bool { return strings.HasPrefix(c, "mount -o noatime ") })
	join := slices.IndexFunc(run.calls, func(c string) bool { return strings.HasPrefix(c, "kubeadm join") })
	assert.Check(t, mount >= 0 && join > mount, "the cache is not mounted before the join: %v", run.calls)
	assert.Check(t, is.Contains(run.log, "cache: volume vol-0cache00000000001 ("))
	assert.Check(t, is.Contains(run.log, "mounted at /var/lib/dynk8s-cache, as it was"))
	phases := run.phases()
	assert.Check(t, slices.Index(phases, "cache") >= 0 && slices.Index(phases, "cache") < slices.Index(phases, "kubeadm-join"), "%v", phases)
	assert.Check(t, is.Contains(run.log, "phase=cache took="))
	assert.Check(t, is.Contains(nodeLabels(t, r.host.joinConfigs[0]), kube.LabelCache+"=true"))
}

// The cache phase runs beside the prepare and the join's own phases, from the boot's start, not as a step of its
// own: here the attachment completes only once the join's checks have turned swap off, which a cache phase run
// between the prepare and the checks would wait for in vain.
func TestJoinAttachesTheCacheBesideTheBoot(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.withCache(2, true)
	attach := r.ec2.Volumes.OnAttach
	r.ec2.Volumes.OnAttach = func(id string) error {
		// A hang's bound on a loaded machine: the checks come within milliseconds when the phase runs beside them.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if slices.Contains(r.host.Recorded(), "swapoff -a") {
				return attach(id)
			}
			if time.Now().After(deadline) {
				return errors.New("the join's checks did not run while the volume was being attached")
			}
		}
	}
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, is.Contains(run.log, "mounted at /var/lib/dynk8s-cache, as it was"))
	assert.Check(t, is.Contains(nodeLabels(t, r.host.joinConfigs[0]), kube.LabelCache+"=true"))
}

// A node that gets no cache (the pool's one volume in use, and the pool at its most) says why in one line, joins
// without one, and carries no cache label.
func TestJoinWithoutACache(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.withCache(1, false)
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, is.Equal(run.timeline.Result, "joined"))
	assert.Check(t, is.Contains(run.log, "cache: none for this node: no free cache volume: the pool's 1 volumes (its "+
		"most) are in use or in other zones than eu-central-1a; joining without one"))
	assert.Check(t, !strings.Contains(nodeLabels(t, r.host.joinConfigs[0]), kube.LabelCache))
	assert.Check(t, !slices.ContainsFunc(run.calls, func(c string) bool { return strings.HasPrefix(c, "mount ") }))
}

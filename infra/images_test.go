package infra_test

import (
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
)

// containerImages collects the image of every container of every workload in the plan (Deployment, DaemonSet,
// CronJob, Job), by resource name.
func containerImages(t *testing.T, res *plan.Result) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	var walk func(name string, v any)
	walk = func(name string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if img, ok := x["image"].(string); ok {
				out[name] = append(out[name], img)
			}
			for _, e := range x {
				walk(name, e)
			}
		case []any:
			for _, e := range x {
				walk(name, e)
			}
		}
	}
	for _, r := range res.Cloud.Resources() {
		if strings.HasPrefix(r.Type, "kubernetes:apps/v1:") || strings.HasPrefix(r.Type, "kubernetes:batch/v1:") {
			walk(r.Name, in(&r, "spec"))
		}
	}
	return out
}

var (
	pauseImageRE = regexp.MustCompile(`(?m)^\s*pause_image = "([^"]+)"`)
)

// nodeImages are the images a pool's user data makes the node run or pull: CRI-O's pause image and the pre-pulls.
func nodeImages(t *testing.T, res *plan.Result) (pause []string, prePull []string) {
	t.Helper()
	for _, lt := range res.Cloud.ByType("aws:ec2/launchTemplate:LaunchTemplate") {
		raw, err := cloudinit.Decode(in(&lt, "userData").(string))
		assert.NilError(t, err)
		m := pauseImageRE.FindStringSubmatch(string(raw))
		assert.Assert(t, m != nil, "%s: no pause_image in the user data", lt.Name)
		pause = append(pause, m[1])
		prePull = append(prePull, poolNodeConfig(t, &lt).PrePullImages...)
	}
	return pause, prePull
}

const digest = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestEveryImageCanBePinned: with images.* and fuse.images set to references with digests,
// every container of every workload the stack declares, and the nodes' pause image, run pinned content. The one image
// left is kube-proxy's pre-pull: the cluster's own DaemonSet runs kube-proxy (kubeadm's image), the node only
// warms its cache with the tag of its version.
func TestEveryImageCanBePinned(t *testing.T) {
	c := devConfig(t)
	c["dynk8s:images"] = map[string]any{
		"autoscaler":         "mirror.example.com/cluster-autoscaler:v1.34.5" + digest,
		"terminationHandler": "mirror.example.com/aws-node-termination-handler" + digest,
		"scripts":            "mirror.example.com/k8s-scripts:1.36.2" + digest,
		"pause":              "mirror.example.com/pause:3.10.1" + digest,
	}
	obj(c, "fuse")["images"] = map[string]any{
		"x86_64": "mirror.example.com/fuse-device-plugin:v1.0" + digest,
		"arm64":  "mirror.example.com/fuse-device-plugin:v1.1" + digest,
	}
	res := runStack(t, c)
	images := containerImages(t, res)
	for _, w := range []string{"addons-autoscaler", "addons-nth", "addons-controller",
		"addons-fuse-device-plugin-amd64", "addons-fuse-device-plugin-arm64"} {
		assert.Check(t, len(images[w]) > 0, "no images found for %s: %v", w, images)
	}
	for name, list := range images {
		for _, img := range list {
			assert.Check(t, strings.HasPrefix(img, "mirror.example.com/") && strings.HasSuffix(img, digest),
				"%s runs %s", name, img)
		}
	}
	pause, prePull := nodeImages(t, res)
	for _, p := range pause {
		assert.Check(t, is.Equal(p, "mirror.example.com/pause:3.10.1"+digest))
	}
	for _, img := range prePull {
		if !strings.HasPrefix(img, "registry.k8s.io/kube-proxy:") {
			assert.Check(t, strings.HasSuffix(img, digest), "the nodes pre-pull %s", img)
		}
	}
}

// TestDefaultImagesAreTags: without images.*, the defaults run, each a tag (docs/operations.md says so, and that pinning
// is the operator's: mutable tags are what M8 is about).
func TestDefaultImagesAreTags(t *testing.T) {
	res := runStack(t, devConfig(t))
	for name, list := range containerImages(t, res) {
		for _, img := range list {
			assert.Check(t, !strings.Contains(img, "@"), "%s runs %s, not a tag: docs/operations.md names the defaults as tags",
				name, img)
		}
	}
	pause, _ := nodeImages(t, res)
	assert.Check(t, is.Equal(pause[0], "registry.k8s.io/pause:3.10.2"), "the pause image of the stack's Kubernetes 1.36")
}

package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cmd/explain/explain"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// The Jenkins kit (docs/jenkins/): every example pod template fits the dev stack's pool it is named after and no
// other, and the Jenkinsfile's agent caps and the cloud's are what the pools hold.

// kitPods are the example pod templates by pool.
func kitPods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	files, err := filepath.Glob("docs/jenkins/builders-*.yaml")
	assert.NilError(t, err)
	assert.Assert(t, len(files) == 2, "want one pod template per dev pool, got %v", files)
	out := map[string]*corev1.Pod{}
	for _, f := range files {
		r, err := os.Open(f)
		assert.NilError(t, err)
		pods, err := explain.DecodePods(r)
		_ = r.Close()
		assert.NilError(t, err, f)
		assert.Equal(t, len(pods), 1, f)
		out[filepath.Base(f[:len(f)-len(".yaml")])] = pods[0]
	}
	return out
}

func TestJenkinsKitPodsFitTheirPools(t *testing.T) {
	cfg, templates, err := explain.Load("Pulumi.dev.yaml")
	assert.NilError(t, err)
	for pool, pod := range kitPods(t) {
		r := explain.Explain(cfg, templates, pod)
		assert.DeepEqual(t, r.Raise, []string{pool})
		for _, v := range r.Verdicts {
			assert.Equal(t, v.Fits, v.Pool == pool, "%s on %s: %v", pool, v.Pool, v.Reasons)
		}
	}
}

// agentsPerNode is how many of the pod fit one template node of the pool: the least, over the resources the pod
// requests, of the allocatable over the request.
func agentsPerNode(t *testing.T, pod *corev1.Pod, node *corev1.Node) int {
	t.Helper()
	n := -1
	for name, want := range resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}) {
		have := node.Status.Allocatable[name]
		if want.IsZero() {
			continue
		}
		if k := int(have.MilliValue() / want.MilliValue()); n < 0 || k < n {
			n = k
		}
	}
	return n
}

func TestJenkinsKitCapsFollowThePools(t *testing.T) {
	_, templates, err := explain.Load("Pulumi.dev.yaml")
	assert.NilError(t, err)
	pods := kitPods(t)
	jenkinsfile := readFile(t, "docs/jenkins/Jenkinsfile")
	total := 0
	for _, tpl := range templates {
		pod := pods[tpl.Pool.Name]
		// Requests as the API server defaults them: the limits of github.com/fuse count.
		for i := range pod.Spec.Containers {
			c := &pod.Spec.Containers[i]
			for k, v := range c.Resources.Limits {
				if _, ok := c.Resources.Requests[k]; !ok {
					c.Resources.Requests[k] = v
				}
			}
		}
		perNode := agentsPerNode(t, pod, tpl.Node)
		assert.Assert(t, perNode >= 1, "%s: no agent fits a node", tpl.Pool.Name)
		m := regexp.MustCompile(`'` + regexp.QuoteMeta(tpl.Pool.Name) + `': \[yaml: '[^']+', connectTimeout: (\d+), cap: (\d+)\]`).
			FindStringSubmatch(jenkinsfile)
		assert.Assert(t, m != nil, "the Jenkinsfile has no agent entry for %s", tpl.Pool.Name)
		limit, _ := strconv.Atoi(m[2])
		assert.Equal(t, limit, tpl.Pool.MaxSize*perNode, "%s: cap %d, the pool holds %d x %d agents",
			tpl.Pool.Name, limit, tpl.Pool.MaxSize, perNode)
		total += limit
	}
	var casc struct {
		Jenkins struct {
			Clouds []struct {
				Kubernetes struct {
					ContainerCapStr string `json:"containerCapStr"`
				} `json:"kubernetes"`
			} `json:"clouds"`
		} `json:"jenkins"`
	}
	assert.NilError(t, yaml.Unmarshal([]byte(readFile(t, "docs/jenkins/kubernetes-cloud.yaml")), &casc))
	assert.Equal(t, len(casc.Jenkins.Clouds), 1)
	assert.Equal(t, casc.Jenkins.Clouds[0].Kubernetes.ContainerCapStr, strconv.Itoa(total))
}

// TestJenkinsCIAgentStaysOnPrem: the CI agent's pod (ci/jenkins-agent.yaml; on main it runs `pulumi up` with the
// deploy credentials) is never scheduled onto a pool node, by the scheduler's own node-affinity match, and mounts no
// volume that nothing creates (the Go caches are an emptyDir unless the operator makes a claim, docs/operations.md).
func TestJenkinsCIAgentStaysOnPrem(t *testing.T) {
	r, err := os.Open("ci/jenkins-agent.yaml")
	assert.NilError(t, err)
	pods, err := explain.DecodePods(r)
	_ = r.Close()
	assert.NilError(t, err)
	assert.Assert(t, len(pods) == 1)
	pod := pods[0]
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	for name, c := range map[string]struct {
		labels map[string]string
		fits   bool
	}{
		"an on-prem node":    {labels: map[string]string{corev1.LabelArchStable: "amd64"}, fits: true},
		"a pool node":        {labels: map[string]string{kube.LabelPool: "builders-x86", corev1.LabelArchStable: "amd64"}},
		"a spot pool's node": {labels: map[string]string{kube.LabelPool: "arm-spot"}},
	} {
		ok, err := affinity.Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: c.labels}})
		assert.NilError(t, err)
		assert.Check(t, ok == c.fits, "%s: the CI agent fits it: %v, want %v", name, ok, c.fits)
	}
	for _, v := range pod.Spec.Volumes {
		assert.Check(t, v.PersistentVolumeClaim == nil, "volume %s mounts claim %s, which nothing creates", v.Name,
			v.PersistentVolumeClaim)
	}
}

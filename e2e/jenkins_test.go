//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/dynk8s/dynk8s/cmd/explain/explain"
	"github.com/dynk8s/dynk8s/infra/config"
)

// kitAgentImage stands in for the jnlp container's image, which the kubernetes plugin fills in (the example pod
// templates leave it out); the dry run needs one.
const kitAgentImage = "jenkins/inbound-agent"

// TestJenkinsKitPodTemplates: each example pod template of docs/jenkins, completed as the kubernetes plugin
// completes it (a name, the namespace, the jnlp image), is accepted by the real API server (server-side dry run,
// admission included) and explain says it fits the pool it is named after and raises that pool. The API server
// keeps the templates' outage tolerations: DefaultTolerationSeconds adds its 300 s ones only to a pod without them,
// as the same template stripped of them shows. The template of a pool with a build cache mounts a directory of it,
// which a namespace enforcing the baseline Pod Security level refuses (checkKitCache).
func TestJenkinsKitPodTemplates(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := loadStackAutoscaling(t)
	templates, err := explain.Templates(s.cfg, explain.CatalogShape)
	assert.NilError(t, err)
	files, err := filepath.Glob(filepath.Join("..", "docs", "jenkins", "builders-*.yaml"))
	if err != nil || len(files) != 2 {
		t.Fatalf("want the two example pod templates, got %v (%v)", files, err)
	}
	for _, file := range files {
		pool := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(pool, func(t *testing.T) {
			f, err := os.Open(file)
			assert.NilError(t, err)
			pods, err := explain.DecodePods(f)
			_ = f.Close()
			if err != nil || len(pods) != 1 {
				t.Fatalf("%s: %v pods, %v", file, len(pods), err)
			}
			pod := pods[0]
			pod.Name, pod.Namespace = "e2e-kit-"+pool, "default"
			for i := range pod.Spec.Containers {
				if pod.Spec.Containers[i].Image == "" {
					pod.Spec.Containers[i].Image = kitAgentImage
				}
			}
			stored := dryRunPod(ctx, t, c, pod)
			if got := outageTolerations(stored); len(got) != 2 || got[corev1.TaintNodeUnreachable] != 3600 ||
				got[corev1.TaintNodeNotReady] != 3600 {
				t.Errorf("the API server keeps the outage tolerations as %v, want 3600 s for both", got)
			}
			report := explain.Explain(s.cfg, templates, stored)
			if len(report.Raise) != 1 || report.Raise[0] != pool {
				t.Errorf("explain would raise %v for %s's template, want %s:\n%s", report.Raise, pool, pool, report)
			}
			for _, v := range report.Verdicts {
				if v.Fits != (v.Pool == pool) {
					t.Errorf("explain says %s fits %s: %t (%v)", pool, v.Pool, v.Fits, v.Reasons)
				}
			}
			t.Logf("server-side dry run accepted; explain:\n%s", report)

			checkKitCache(ctx, t, c, s.cfg, pool, stored)

			bare := stored.DeepCopy()
			bare.ResourceVersion, bare.UID = "", ""
			bare.Spec.Tolerations = nil
			if got := outageTolerations(dryRunPod(ctx, t, c, bare)); got[corev1.TaintNodeUnreachable] != 300 {
				t.Errorf("without its tolerations the pod gets %v, want DefaultTolerationSeconds' 300 s", got)
			}
		})
	}
}

// checkKitCache: a template mounts a hostPath under its pool's cache mount when the pool keeps a cache, and only
// then; the Pod Security admission of a namespace at the baseline level refuses it, naming the hostPath volume, which
// is why docs/jenkins.md asks for a namespace that does not enforce baseline.
func checkKitCache(ctx context.Context, t *testing.T, c cluster, cfg *config.Config, name string, pod *corev1.Pod) {
	t.Helper()
	i := slices.IndexFunc(cfg.NodePools, func(p config.NodePool) bool { return p.Name == name })
	assert.Assert(t, i >= 0, "no pool %s", name)
	pool := cfg.NodePools[i]
	var paths []string
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			paths = append(paths, v.HostPath.Path)
		}
	}
	if pool.Cache == nil {
		assert.Check(t, len(paths) == 0, "pool %s keeps no cache, its template mounts %v", name, paths)
		return
	}
	if len(paths) != 1 || !strings.HasPrefix(paths[0], pool.Cache.MountPath+"/") {
		t.Fatalf("the template mounts hostPaths %v, want one under the pool's cache at %s", paths, pool.Cache.MountPath)
	}
	ns := "e2e-kit-baseline"
	_, _ = c.kubectl(ctx, "create", "namespace", ns)
	t.Cleanup(func() { _, _ = c.kubectl(context.Background(), "delete", "namespace", ns, "--wait=false") })
	_, err := c.kubectl(ctx, "label", "--overwrite", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline")
	assert.NilError(t, err)
	restricted := pod.DeepCopy()
	restricted.Namespace, restricted.ResourceVersion, restricted.UID = ns, "", ""
	_, err = tryDryRunPod(ctx, t, c, restricted)
	assert.ErrorContains(t, err, `hostPath volumes (volume "cache")`, "the baseline level accepted the cache's hostPath")
}

// dryRunPod sends the pod through the API server's create path without persisting it and returns what it would
// store.
func dryRunPod(ctx context.Context, t *testing.T, c cluster, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := tryDryRunPod(ctx, t, c, pod)
	if err != nil {
		t.Fatalf("server-side dry run of %s: %v", pod.Name, err)
	}
	return out
}

// tryDryRunPod is dryRunPod, returning the API server's refusal.
func tryDryRunPod(ctx context.Context, t *testing.T, c cluster, pod *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	pod = pod.DeepCopy()
	pod.APIVersion, pod.Kind = "v1", "Pod"
	doc, err := json.Marshal(pod)
	assert.NilError(t, err)
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", c.Kubeconfig, "create", "--dry-run=server",
		"-o", "json", "-f", "-")
	cmd.Stdin = bytes.NewReader(doc)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w\n%s\n%s", err, stderr.String(), doc)
	}
	var out corev1.Pod
	assert.NilError(t, json.Unmarshal(stdout.Bytes(), &out))
	return &out, nil
}

// outageTolerations are the pod's NoExecute tolerations of the unreachable and not-ready taints, with their seconds.
func outageTolerations(pod *corev1.Pod) map[string]int64 {
	out := map[string]int64{}
	for _, tt := range pod.Spec.Tolerations {
		if tt.Effect == corev1.TaintEffectNoExecute && tt.TolerationSeconds != nil &&
			(tt.Key == corev1.TaintNodeUnreachable || tt.Key == corev1.TaintNodeNotReady) {
			out[tt.Key] = *tt.TolerationSeconds
		}
	}
	return out
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The autoscaler rig: the real Cluster Autoscaler run with the rendered command line against moto (startAutoscaler),
// and the pending pods it weighs, with the condition kube-scheduler would write (createPendingPod).

const (
	autoscalerName   = "cluster-autoscaler"
	fuseResource     = "github.com/fuse"
	ephemeralStorage = "ephemeral-storage"
	// The test's shortened scale-down timing: the stack's default unneeded time is 10 minutes.
	testUnneededTime = "10s"
)

// testScanInterval is the autoscaler's loop in the tests, 2 s unless the burst benchmark measures another.
var testScanInterval = flag.Duration("burst.scan-interval", 2*time.Second,
	"the autoscaler's --scan-interval in the e2e tests (the burst benchmark measures the stack's with it)")

// autoscalerProcess is a running cluster-autoscaler.
type autoscalerProcess struct {
	logs *nodetest.SyncBuffer
	done chan struct{}
}

// startAutoscaler runs the real autoscaler with the rendered command line, adapted only where this environment
// forces it, under the IAM user key.
func startAutoscaler(ctx context.Context, t *testing.T, c cluster, s stackAutoscaling, a *awsEnv, key awsKey) *autoscalerProcess {
	t.Helper()
	requireTool(t, autoscalerName)
	if len(s.command) != 1 || filepath.Base(s.command[0]) != autoscalerName {
		t.Fatalf("rendered command %q: expected the image's /%s", s.command, autoscalerName)
	}
	// Rendered flags the test replaces, each for a reason.
	replaced := map[string]string{
		// The stack's default is 10 minutes; the scale-down test waits this long for an idle node.
		"--scale-down-unneeded-time": testUnneededTime,
		// Shortened loop (the stack's default is 5 s), so that the tests take seconds; what the loop decides is
		// unchanged. The burst benchmark may set another (-burst.scan-interval).
		"--scan-interval": testScanInterval.String(),
	}
	var args []string
	for _, arg := range s.args {
		name, _, _ := strings.Cut(arg, "=")
		if v, ok := replaced[name]; ok {
			arg = name + "=" + v
			delete(replaced, name)
		}
		args = append(args, arg)
	}
	if len(replaced) > 0 {
		t.Fatalf("the rendered args %q lack %v, which the test means to shorten", s.args, replaced)
	}
	args = append(args,
		// In the cluster the pod uses its service account; here the admin kubeconfig of the test's API server.
		"--kubeconfig="+c.Kubeconfig,
		// moto's endpoints (see cloudConfig).
		"--cloud-config="+a.cloudConfig(t),
		// One autoscaler per test and nothing to fail over to: leader election would only make a second test wait
		// for the first one's lease to expire.
		"--leader-elect=false",
		// Metrics on a loopback port the kernel picks instead of :8085 on every interface (nothing here reads them;
		// a port picked ahead and released could be taken before the autoscaler binds it).
		"--address=127.0.0.1:0",
		// Shortened scale-down delay after a scale-up (default 10 min), so that the tests take seconds instead of
		// minutes; what the loop decides is unchanged.
		"--scale-down-delay-after-add=0s",
		// A node found unremovable (its bare pod running) is weighed again only after this (default 5 minutes):
		// shortened so that the scale-down test sees the node go soon after its pod finished.
		"--unremovable-node-recheck-timeout=5s",
	)
	cmd := exec.Command(autoscalerName, args...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+key.Key, "AWS_SECRET_ACCESS_KEY="+key.Secret,
		// The instance metadata service must never be asked (the SDK would fall back to it).
		"AWS_EC2_METADATA_DISABLED=true")
	for k, v := range s.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &autoscalerProcess{logs: &nodetest.SyncBuffer{}}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.done = stopOnCleanup(t, autoscalerName, cmd, p.logs)
	// Ready when it has registered every group the stack declares.
	p.waitLog(ctx, t, 60*time.Second, func(log string) bool {
		for name := range s.groups {
			if !strings.Contains(log, "Registering ASG "+name) {
				return false
			}
		}
		return true
	})
	return p
}

func (p *autoscalerProcess) waitLog(ctx context.Context, t *testing.T, timeout time.Duration, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok(p.logs.String()) {
		select {
		case <-p.done:
			t.Fatalf("cluster-autoscaler exited:\n%s", tail(p.logs.String(), 40))
		case <-ctx.Done():
			t.Fatalf("%v; cluster-autoscaler log:\n%s", ctx.Err(), tail(p.logs.String(), 40))
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster-autoscaler: condition not met after %s; log:\n%s", timeout, tail(p.logs.String(), 60))
		}
	}
}

// cloudConfig points the autoscaler's AWS clients at moto. Its aws-sdk-go (v1.48.7) ignores AWS_ENDPOINT_URL; the
// provider's cloud config takes one [ServiceOverride] per service, matched on service and region
// (cloudprovider/aws/aws_sdk_provider.go at cluster-autoscaler-1.34.5).
func (a *awsEnv) cloudConfig(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("[Global]\n")
	for i, svc := range []string{"autoscaling", "ec2", "eks"} {
		fmt.Fprintf(&b, "[ServiceOverride %q]\nService = %s\nRegion = %s\nURL = %s\nSigningRegion = %s\n",
			strconv.Itoa(i+1), svc, a.region, a.url, a.region)
	}
	path := filepath.Join(t.TempDir(), "cloud.conf")
	assert.NilError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// podSpec is what a test pod asks for.
type podSpec struct {
	name     string
	selector map[string]string
	tolerate []declaredTaint
	requests map[string]string
}

// fitsPod is the pod a build agent of the spot pool is: it selects the pool's architecture, tolerates its taints
// and asks for a fuse device and, when withEphemeral, ephemeral storage.
func fitsPod(name string, g declaredGroup, withEphemeral bool) podSpec {
	p := podSpec{
		name:     name,
		selector: map[string]string{"kubernetes.io/arch": g.labels["kubernetes.io/arch"]},
		tolerate: g.taints,
		requests: map[string]string{"cpu": "500m", "memory": "512Mi", fuseResource: "1"},
	}
	if withEphemeral {
		p.requests[ephemeralStorage] = "10Gi"
	}
	return p
}

// createPendingPod creates the pod in the default namespace and writes the condition kube-scheduler would write
// when no node fits, which is what the autoscaler's unschedulable-pod lister selects.
func createPendingPod(ctx context.Context, t *testing.T, c cluster, p podSpec) {
	t.Helper()
	applyJSON(ctx, t, c, podObject(p))
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "default", "delete", "pod", p.name, "--ignore-not-found",
			"--wait=false")
	})
	status := map[string]any{"status": map[string]any{"conditions": []map[string]any{{
		"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
		"message":            "0/0 nodes are available (written by the e2e test: no kube-scheduler runs here)",
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}}}}
	patch, err := json.Marshal(status)
	assert.NilError(t, err)
	if _, err := c.kubectl(ctx, "-n", "default", "patch", "pod", p.name, "--subresource=status", "--type=merge",
		"-p", string(patch)); err != nil {
		t.Fatal(err)
	}
}

// podObject is the pod p describes, in the default namespace, as JSON-ready data.
func podObject(p podSpec) map[string]any {
	var tolerations []map[string]string
	for _, tt := range p.tolerate {
		tolerations = append(tolerations, map[string]string{"key": tt.key, "operator": "Equal", "value": tt.value,
			"effect": tt.effect})
	}
	// Extended resources are set as limits (requests default to them; they cannot be overcommitted).
	limits := map[string]string{}
	for k, v := range p.requests {
		if strings.Contains(k, "/") {
			limits[k] = v
		}
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": p.name, "namespace": "default"},
		"spec": map[string]any{
			"nodeSelector": p.selector,
			"tolerations":  tolerations,
			"containers": []map[string]any{{
				"name":      "build",
				"image":     "registry.k8s.io/pause:3.10",
				"resources": map[string]any{"requests": p.requests, "limits": limits},
			}},
		},
	}
	return pod
}

// deletePod deletes a pod (no kubelet: an unbound pod goes at once) and waits until it is gone.
func deletePod(ctx context.Context, t *testing.T, c cluster, name string) {
	t.Helper()
	if _, err := c.kubectl(ctx, "-n", "default", "delete", "pod", name, "--timeout=30s"); err != nil {
		t.Fatal(err)
	}
}

// waitDesired polls moto until cond holds for the groups' desired capacities.
func waitDesired(ctx context.Context, t *testing.T, a *awsEnv, p *autoscalerProcess, timeout time.Duration,
	what string, cond func(map[string]int) bool) map[string]int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d := a.desired(ctx, t)
		if cond(d) {
			return d
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not after %s; desired capacities %v; autoscaler log:\n%s", what, timeout, d,
				tail(p.logs.String(), 60))
		}
		time.Sleep(time.Second)
	}
}

// allZero reports whether every group's desired capacity is 0.
func allZero(d map[string]int) bool {
	for _, n := range d {
		if n != 0 {
			return false
		}
	}
	return true
}

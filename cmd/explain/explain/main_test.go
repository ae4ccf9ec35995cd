package explain

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

const agentManifest = `apiVersion: v1
kind: Pod
metadata: {name: agent, namespace: ci}
spec:
  nodeSelector: {kubernetes.io/arch: arm64}
  tolerations: [{key: example.com/spot, operator: Equal, value: "true", effect: NoSchedule}]
  containers:
    - name: build
      image: example.com/agent:1
      resources:
        requests: {cpu: "2", memory: 4Gi, ephemeral-storage: 20Gi}
        limits: {github.com/fuse: "1"}
---
apiVersion: v1
kind: Pod
metadata: {name: x86}
spec:
  nodeSelector: {kubernetes.io/arch: amd64}
  containers: [{name: build, image: example.com/agent:1}]
`

func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errs bytes.Buffer
	code := Main(context.Background(), args, &out, &errs)
	return code, out.String(), errs.String()
}

func TestMainManifests(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pods.yaml")
	assert.NilError(t, os.WriteFile(file, []byte(agentManifest), 0o600))
	code, out, errs := runMain(t, "-config", "../../../Pulumi.dev.yaml", file)
	assert.Equal(t, code, 0, errs)
	assert.Equal(t, out, `pod ci/agent
  builders-x86: does not fit
    - arch: node selector kubernetes.io/arch=arm64: the pool's nodes have kubernetes.io/arch=amd64
  builders-arm: fits
  scale-up: builders-arm
pod default/x86
  builders-x86: fits
  builders-arm: does not fit
    - untolerated taint example.com/spot=true:NoSchedule
    - arch: node selector kubernetes.io/arch=amd64: the pool's nodes have kubernetes.io/arch=arm64
  scale-up: builders-x86
`)
}

func TestMainUsageAndErrors(t *testing.T) {
	code, _, errs := runMain(t, "-config", "../../../Pulumi.dev.yaml")
	assert.Equal(t, code, 2)
	assert.Check(t, is.Contains(errs, "give pod manifests or -pending"))
	code, _, errs = runMain(t, "-h")
	assert.Equal(t, code, 0)
	assert.Check(t, is.Contains(errs, "usage: explain"))
	assert.Check(t, is.Contains(errs, "-pending"))

	file := filepath.Join(t.TempDir(), "service.yaml")
	assert.NilError(t, os.WriteFile(file, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n"), 0o600))
	code, _, errs = runMain(t, "-config", "../../../Pulumi.dev.yaml", file)
	assert.Equal(t, code, 1)
	assert.Check(t, is.Contains(errs,
		`document 1: kind "Service", want one of Pod, Deployment, StatefulSet, ReplicaSet, Job, CronJob`))

	// A bad stack is refused with its key path.
	bad := filepath.Join(t.TempDir(), "Pulumi.bad.yaml")
	dev, err := os.ReadFile("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(bad, []byte(strings.Replace(string(dev), "expander: least-waste",
		"expander: priority", 1)), 0o600))
	code, _, errs = runMain(t, "-config", bad, file)
	assert.Equal(t, code, 1)
	assert.Check(t, is.Contains(errs, "dynk8s:nodePools[0].autoscaling.priority: is required"))
}

// TestPendingShowsTheAutoscalersView: only pods the scheduler found no node for, each with the autoscaler's latest
// event of each kind.
func TestPendingShowsTheAutoscalersView(t *testing.T) {
	cfg, templates, err := Load("../../../Pulumi.dev.yaml")
	assert.NilError(t, err)
	pods, err := DecodePods(strings.NewReader(agentManifest))
	assert.NilError(t, err)
	unschedulable := corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}}
	pods[0].UID, pods[0].Status = "uid-agent", unschedulable
	pods[1].UID, pods[1].Status = "uid-x86", corev1.PodStatus{Phase: corev1.PodPending} // not yet weighed
	at := func(minute int) metav1.Time {
		return metav1.NewTime(time.Date(2026, 12, 1, 15, minute, 0, 0, time.UTC))
	}
	event := func(name, reason, msg string, minute int) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ci"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ci", Name: "agent", UID: "uid-agent"},
			Reason:         reason, Message: msg, Count: 2, LastTimestamp: at(minute)}
	}
	client := fake.NewClientset(pods[0], pods[1],
		event("e1", "NotTriggerScaleUp", "pod didn't trigger scale-up: old", 1),
		event("e2", "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached", 3),
		event("e3", "TriggeredScaleUp", "pod triggered scale-up: [{builders-arm 0->1 (max: 6)}]", 2),
		event("e4", "FailedScheduling", "0/3 nodes are available", 2))
	var out bytes.Buffer
	unfit, err := explainPending(context.Background(), client, cfg, templates, "", &out)
	assert.NilError(t, err)
	assert.Equal(t, unfit, 0)
	assert.Equal(t, out.String(), `pod ci/agent
  builders-x86: does not fit
    - arch: node selector kubernetes.io/arch=arm64: the pool's nodes have kubernetes.io/arch=amd64
  builders-arm: fits
  scale-up: builders-arm
  autoscaler: TriggeredScaleUp (2x, last 2026-12-01T15:02:00Z): pod triggered scale-up: [{builders-arm 0->1 (max: 6)}]
  autoscaler: NotTriggerScaleUp (2x, last 2026-12-01T15:03:00Z): pod didn't trigger scale-up: 1 max node group size reached
`)
}

// Workloads are read for their pod templates, a pool that only tolerations keep the pod off says which to add, and a
// pod no pool fits makes the exit status 3.
func TestMainWorkloadsHintsAndExitStatus(t *testing.T) {
	const manifests = `apiVersion: apps/v1
kind: Deployment
metadata: {name: agents, namespace: ci}
spec:
  selector: {matchLabels: {app: agents}}
  template:
    metadata: {labels: {app: agents}}
    spec:
      nodeSelector: {kubernetes.io/arch: arm64}
      containers: [{name: build, image: example.com/agent:1, resources: {limits: {github.com/fuse: "1"}}}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          nodeSelector: {kubernetes.io/arch: amd64}
          containers: [{name: build, image: example.com/agent:1}]
`
	file := filepath.Join(t.TempDir(), "workloads.yaml")
	assert.NilError(t, os.WriteFile(file, []byte(manifests), 0o600))
	code, out, errs := runMain(t, "-config", "../../../Pulumi.dev.yaml", file)
	assert.Equal(t, code, 3, errs)
	assert.Equal(t, out, `pod ci/Deployment/agents
  builders-x86: does not fit
    - arch: node selector kubernetes.io/arch=arm64: the pool's nodes have kubernetes.io/arch=amd64
  builders-arm: does not fit
    - untolerated taint example.com/spot=true:NoSchedule
    fits with these in the pod's spec: tolerations: [{key: example.com/spot, operator: Equal, value: "true", effect: NoSchedule}]
  scale-up: none (no pool fits)
pod default/CronJob/nightly
  builders-x86: fits
  builders-arm: does not fit
    - untolerated taint example.com/spot=true:NoSchedule
    - arch: node selector kubernetes.io/arch=amd64: the pool's nodes have kubernetes.io/arch=arm64
  scale-up: builders-x86
`)

	// With the toleration it suggests, the Deployment's pod fits, and every pod fitting is exit status 0.
	fixed := strings.Replace(manifests, "      nodeSelector: {kubernetes.io/arch: arm64}\n",
		"      nodeSelector: {kubernetes.io/arch: arm64}\n"+
			"      tolerations: [{key: example.com/spot, operator: Equal, value: \"true\", effect: NoSchedule}]\n", 1)
	assert.NilError(t, os.WriteFile(file, []byte(fixed), 0o600))
	code, out, errs = runMain(t, "-config", "../../../Pulumi.dev.yaml", file)
	assert.Equal(t, code, 0, errs)
	assert.Check(t, is.Contains(out, "  builders-arm: fits\n  scale-up: builders-arm\n"))
}

// TestMainCountsTheStacksDaemonSets: without a cluster, a pool's template node has room for the stack's own
// DaemonSet pods taken (the fuse plugin's and the termination handler's, as the autoscaler counts them), so a pod
// asking for the whole node does not fit, and explain says why and exits 3 (newcomer review: it said "fits").
func TestMainCountsTheStacksDaemonSets(t *testing.T) {
	file := filepath.Join(t.TempDir(), "whole.yaml")
	assert.NilError(t, os.WriteFile(file, []byte(`apiVersion: v1
kind: Pod
metadata: {name: whole-node}
spec:
  nodeSelector: {dynk8s.io/pool: builders-x86}
  containers:
  - name: c
    image: x
    resources: {requests: {cpu: "8", memory: 1Gi}}
`), 0o600))
	code, out, errs := runMain(t, "-config", "../../../Pulumi.dev.yaml", file)
	assert.Equal(t, code, exitNoPoolFits, errs)
	assert.Check(t, is.Contains(out, "  builders-x86: does not fit\n    - cpu: requests 8, the pool's template node has 8 "+
		"allocatable, 60m of it for the pods of kube-system/aws-node-termination-handler, "+
		"kube-system/fuse-device-plugin-amd64\n"), out)
	assert.Check(t, is.Contains(out, "scale-up: none (no pool fits)"), out)
}

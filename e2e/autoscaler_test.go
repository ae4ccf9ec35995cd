//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// The autoscaler tests run the real Cluster Autoscaler (hack/tools.sh builds upstream's cluster-autoscaler-1.34.5
// with -tags aws) against the real kube-apiserver of hack/start-kube.sh and against moto_server as EC2, Auto Scaling
// and IAM. Nothing about the groups is written by hand: the dev stack runs under the mock engine, and its VPC,
// subnets, security groups, instance profiles, launch templates and Auto Scaling groups are replayed into moto from
// the inputs it declares (testdata/moto_aws.py); the autoscaler runs with the command and args of the Deployment the
// addons component renders, under an IAM user holding the stack's own policy for it.
//
// There is no kube-scheduler, so each pending pod gets the PodScheduled=False/Unschedulable condition the scheduler
// would write (the autoscaler only looks at pods with it), and no kubelet, so the "node" of the scale-down test is a
// Node object registered by the test with the provider ID of the instance moto started.
//
// moto's IAM enforcement (INITIAL_NO_AUTH_ACTION_COUNT) has limits that bound what these tests prove about the
// policy: it checks actions only; a statement whose Resource is anything but "*" denies (even the group's exact
// ARN), and Conditions (the stack's autoscaling:ResourceTag condition on the write actions) are not evaluated. So
// the tests prove that the policy grants every action the autoscaler calls, and that removing one denies it; they
// cannot prove that the condition keeps the autoscaler off another cluster's groups.

const (
	setDesiredCapacity  = "autoscaling:SetDesiredCapacity"
	toBeDeletedTaintKey = "ToBeDeletedByClusterAutoscaler"
)

// policyWithout returns the policy document with action removed from every statement; it fails the test when the
// policy does not grant the action at all (the control would then prove nothing).
func policyWithout(t *testing.T, policy, action string) string {
	t.Helper()
	var doc map[string]any
	assert.NilError(t, json.Unmarshal([]byte(policy), &doc), "policy")
	statements, _ := doc["Statement"].([]any)
	removed := false
	for _, s := range statements {
		st, _ := s.(map[string]any)
		actions, _ := st["Action"].([]any)
		kept := []any{}
		for _, a := range actions {
			if a == action {
				removed = true
				continue
			}
			kept = append(kept, a)
		}
		st["Action"] = kept
	}
	if !removed {
		t.Fatalf("the stack's policy does not grant %s:\n%s", action, policy)
	}
	out, err := json.Marshal(doc)
	assert.NilError(t, err)
	return string(out)
}

// nominalMemoryRaisesNothing: a node reports less memory than its type's nominal size; the group's resources/memory
// tag says so, and the autoscaler must not add a node for a pod that fits the nominal size but not the real node (it
// would add node after node for it). The request is 512Mi under the nominal 16 GiB of the dev pools' types.
func nominalMemoryRaisesNothing(ctx context.Context, t *testing.T, c cluster, s stackAutoscaling, a *awsEnv,
	g declaredGroup, spot string,
	start time.Time) {
	t.Helper()
	// A node reports less memory than its type's nominal size; the group's resources/memory tag says so, and
	// the autoscaler must not add a node for a pod that fits the nominal size but not the real node (it would
	// add node after node for it). The request is 512Mi under the nominal 16 GiB of the dev pools' types.
	if _, ok := g.resources["memory"]; !ok {
		t.Fatalf("group %s declares no %sresources/memory tag", spot, nodeTemplatePrefix)
	}
	p := fitsPod("e2e-nominal-memory", g, false)
	p.requests["memory"] = "15872Mi"
	expectNoScaleUp(ctx, t, c, s, a, p, start, "Insufficient memory")
}

// expectNoScaleUp creates the pending pod p and expects the autoscaler to refuse it: a NotTriggerScaleUp event
// that says why, and no group raised.
func expectNoScaleUp(ctx context.Context, t *testing.T, c cluster, s stackAutoscaling, a *awsEnv, p podSpec,
	start time.Time, why string) {
	t.Helper()
	createPendingPod(ctx, t, c, p)
	msg := waitEvent(ctx, t, c, "default", p.name, "NotTriggerScaleUp", start, 30*time.Second)
	if !strings.Contains(msg, why) {
		t.Errorf("NotTriggerScaleUp says %q, want %q", msg, why)
	}
	explainAgreesWhy(ctx, t, c, s, p.name, "", why)
	if d := a.desired(ctx, t); !allZero(d) {
		t.Errorf("desired capacities %v after pod %s, which no group can run", d, p.name)
	}
	deletePod(ctx, t, c, p.name)
}

// TestAutoscalerScalesTheStacksGroups proves the stack's tags, args and IAM policy work with the real autoscaler:
// pods that cannot run on a pool raise nothing and the autoscaler says why; a build agent of the spot pool raises
// exactly that group from 0 to 1; and the idle node of that group is removed after the unneeded time, through
// TerminateInstanceInAutoScalingGroup, by the stack's IAM user.
func TestAutoscalerScalesTheStacksGroups(t *testing.T) {
	c := requireCluster(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	s := loadStackAutoscaling(t)
	spot, g := s.spotGroup(t)

	a := startAWS(ctx, t, s, []replayUser{{Name: s.userName, Policy: s.policy}})
	inMoto := a.groups(ctx, t)
	for _, decl := range s.replay.Groups {
		name, _ := decl["name"].(string)
		got, ok := inMoto[name]
		if !ok {
			t.Fatalf("group %s not in moto", name)
		}
		if got.Desired != 0 {
			t.Fatalf("group %s starts at %d, want 0 (min size 0, the autoscaler owns the desired capacity)", name,
				got.Desired)
		}
		// The replay is faithful where the autoscaler looks: every declared tag, and no other.
		want := map[string]string{}
		inputs, _ := decl["inputs"].(map[string]any)
		tags, _ := inputs["tags"].([]any)
		for _, e := range tags {
			tag, _ := e.(map[string]any)
			k, _ := tag["key"].(string)
			want[k], _ = tag["value"].(string)
		}
		if !maps.Equal(got.Tags, want) {
			t.Fatalf("group %s in moto has tags %v, declared %v", name, got.Tags, want)
		}
	}
	ca := startAutoscaler(ctx, t, c, s, a, a.users[s.userName])

	t.Run("untolerated taint raises nothing", func(t *testing.T) {
		p := fitsPod("e2e-no-toleration", g, false)
		p.tolerate = nil
		expectNoScaleUp(ctx, t, c, s, a, p, start, "untolerated taint")
	})

	t.Run("larger than the pool's allocatable raises nothing", func(t *testing.T) {
		p := fitsPod("e2e-too-large", g, false)
		// One CPU more than the pool's instance type has (as moto's EC2 describes it; the autoscaler reads the same
		// DescribeInstanceTypes): the autoscaler's template node has the instance type's CPUs as allocatable.
		typ := g.labels["node.kubernetes.io/instance-type"]
		var cpus map[string]int
		a.python(ctx, t, nil, &cpus, "vcpus", a.admin.Key, a.admin.Secret, typ)
		if cpus[typ] == 0 {
			t.Fatalf("moto knows no vCPU count for %q: %v", typ, cpus)
		}
		p.requests["cpu"] = strconv.Itoa(cpus[typ] + 1)
		expectNoScaleUp(ctx, t, c, s, a, p, start, "Insufficient cpu")
	})

	t.Run("between the real node's memory and the nominal raises nothing", func(t *testing.T) {
		nominalMemoryRaisesNothing(ctx, t, c, s, a, g, spot, start)
	})

	// A build agent asks for ephemeral storage: without the group's node-template/resources/ephemeral-storage tag
	// the autoscaler's template node (cloudprovider/aws/aws_manager.go buildNodeFromTemplate: cpu, memory, pods and
	// the resources/ tags only) has none, and such a pod never scales a pool up from zero.
	if _, ok := g.resources[ephemeralStorage]; !ok {
		t.Fatalf("group %s declares no %sresources/%s tag: a pod requesting ephemeral storage cannot scale it "+
			"from zero", spot, nodeTemplatePrefix, ephemeralStorage)
	}

	var instanceID, zone string
	t.Run("build agent raises the spot group 0 to 1", func(t *testing.T) {
		p := fitsPod("e2e-build-agent", g, true)
		createPendingPod(ctx, t, c, p)
		d := waitDesired(ctx, t, a, ca, 60*time.Second, spot+" raised to 1", func(d map[string]int) bool {
			return d[spot] >= 1
		})
		for name, n := range d {
			want := 0
			if name == spot {
				want = 1
			}
			if n != want {
				t.Errorf("group %s desired %d, want %d", name, n, want)
			}
		}
		msg := waitEvent(ctx, t, c, "default", p.name, "TriggeredScaleUp", start, 30*time.Second)
		if !strings.Contains(msg, spot+" 0->1") {
			t.Errorf("TriggeredScaleUp says %q, want %s 0->1", msg, spot)
		}
		explainAgrees(ctx, t, c, s, p.name, spot)
		explainSeesTheGroup(ctx, t, a, s, spot, 1)
		for name := range s.groups {
			if name != spot && strings.Contains(msg, name) {
				t.Errorf("TriggeredScaleUp names %s too: %q", name, msg)
			}
		}
		// moto starts the instance at once; the stand-in node below is registered for it.
		groups := a.groups(ctx, t)
		if n := len(groups[spot].Instances); n != 1 {
			t.Fatalf("group %s has %d instances, want 1", spot, n)
		}
		instanceID, zone = groups[spot].Instances[0].ID, groups[spot].Instances[0].Zone
		// The pod is gone before the node registers: without a scheduler it would never be bound, and the node
		// must be idle.
		deletePod(ctx, t, c, p.name)
	})

	t.Run("node kept while its bare pod runs, removed after the unneeded time once it finished", func(t *testing.T) {
		if instanceID == "" {
			t.Skip("no instance: the scale-up failed")
		}
		node := registerStandInNode(ctx, t, c, g, zone, instanceID)
		unneeded, err := time.ParseDuration(testUnneededTime)
		assert.NilError(t, err)
		// A build agent as the Jenkins kubernetes plugin starts it: a pod of no controller, with an emptyDir. The
		// autoscaler's Replicated drainability rule blocks the removal of a node that runs one
		// (simulator/drainability/rules/replicated/rule.go at cluster-autoscaler-1.34.5); the emptyDir does not,
		// with --skip-nodes-with-local-storage=false.
		agent := fitsPod("e2e-bare-agent", g, true)
		runBarePod(ctx, t, c, agent, node)
		// The autoscaler reads the groups' instances once a minute, so it may take that long to know the node's
		// group and weigh it for removal.
		blocked := "Node " + node + " cannot be removed: default/" + agent.name + " is not replicated"
		ca.waitLog(ctx, t, 2*time.Minute, func(log string) bool { return strings.Contains(log, blocked) })
		// Three unneeded times more, the node is still there: the pod keeps it.
		for hold := time.Now().Add(3 * unneeded); time.Now().Before(hold); time.Sleep(time.Second) {
			if d := a.desired(ctx, t); d[spot] != 1 {
				t.Fatalf("group %s desired %d while the bare pod %s runs on its node; autoscaler log:\n%s", spot,
					d[spot], agent.name, tail(ca.logs.String(), 60))
			}
		}
		if taints := nodeTaintKeys(ctx, t, c, node); slices.Contains(taints, toBeDeletedTaintKey) {
			t.Fatalf("node %s has the %s taint while the bare pod runs", node, toBeDeletedTaintKey)
		}

		setPodPhase(ctx, t, c, agent.name, "Succeeded")
		finished := time.Now()
		// Then the unneeded time, and 5 s between the deletion taint and the termination.
		waitDesired(ctx, t, a, ca, 2*time.Minute, spot+" back to 0", allZero)
		elapsed := time.Since(finished)
		if elapsed < unneeded {
			t.Errorf("scaled down %s after the pod finished, before the unneeded time %s", elapsed, unneeded)
		}
		if state := a.ec2Instances(ctx, t)[instanceID].State; state != "terminated" && state != "shutting-down" {
			t.Errorf("instance %s is %q in moto, want terminated", instanceID, state)
		}
		// The autoscaler logs the activity TerminateInstanceInAutoScalingGroup answered (auto_scaling_groups.go
		// DeleteInstances at cluster-autoscaler-1.34.5); SetDesiredCapacity would have left no such line.
		if log := ca.logs.String(); !strings.Contains(log, "Terminating EC2 instance: "+instanceID) {
			t.Errorf("no TerminateInstanceInAutoScalingGroup activity for %s in the autoscaler log:\n%s", instanceID,
				tail(log, 60))
		}
		if taints := nodeTaintKeys(ctx, t, c, node); !slices.Contains(taints, toBeDeletedTaintKey) {
			t.Errorf("node %s lacks the autoscaler's %s taint: %v", node, toBeDeletedTaintKey, taints)
		}
		t.Logf("scaled down %.1f s after the bare pod finished (unneeded time %s)", elapsed.Seconds(), unneeded)
	})
}

// nodeTaintKeys are the keys of the node's taints.
func nodeTaintKeys(ctx context.Context, t *testing.T, c cluster, node string) []string {
	t.Helper()
	var n struct {
		Spec struct {
			Taints []struct {
				Key string `json:"key"`
			} `json:"taints"`
		} `json:"spec"`
	}
	assert.NilError(t, c.getJSON(ctx, &n, "node", node))
	var keys []string
	for _, tt := range n.Spec.Taints {
		keys = append(keys, tt.Key)
	}
	return keys
}

// runBarePod creates p bound to node, with no owner and an emptyDir, and writes the Running status its kubelet
// would (none runs here).
func runBarePod(ctx context.Context, t *testing.T, c cluster, p podSpec, node string) {
	t.Helper()
	pod := podObject(p)
	spec := pod["spec"].(map[string]any)
	spec["nodeName"] = node
	spec["volumes"] = []map[string]any{{"name": "workspace", "emptyDir": map[string]any{}}}
	spec["containers"].([]map[string]any)[0]["volumeMounts"] = []map[string]any{
		{"name": "workspace", "mountPath": "/home/jenkins/agent"}}
	applyJSON(ctx, t, c, pod)
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "default", "delete", "pod", p.name, "--ignore-not-found",
			"--force", "--grace-period=0", "--wait=false")
	})
	setPodPhase(ctx, t, c, p.name, "Running")
}

// setPodPhase writes the pod's phase, as its kubelet would.
func setPodPhase(ctx context.Context, t *testing.T, c cluster, name, phase string) {
	t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	ready := map[bool]string{true: "True", false: "False"}[phase == "Running"]
	status := map[string]any{"status": map[string]any{"phase": phase, "startTime": now,
		"conditions": []map[string]any{
			{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
			{"type": "Ready", "status": ready, "lastTransitionTime": now},
		}}}
	patch, err := json.Marshal(status)
	assert.NilError(t, err)
	if _, err := c.kubectl(ctx, "-n", "default", "patch", "pod", name, "--subresource=status", "--type=merge",
		"-p", string(patch)); err != nil {
		t.Fatal(err)
	}
}

// registerStandInNode creates the Node the instance's kubelet would register: the pool's labels and taints, the
// provider ID the node agent sets, Ready, and a capacity of the pool's shape (c7g.2xlarge: 8 CPUs, 16 GiB; the
// scale-down only weighs it against the pods on the node, of which there are none). It is deleted when the test
// ends. Returns its name.
func registerStandInNode(ctx context.Context, t *testing.T, c cluster, g declaredGroup, zone, instanceID string) string {
	t.Helper()
	name := "e2e-" + instanceID
	labels := map[string]string{"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}
	for k, v := range g.labels {
		labels[k] = v
	}
	var taints []map[string]string
	for _, tt := range g.taints {
		taints = append(taints, map[string]string{"key": tt.key, "value": tt.value, "effect": tt.effect})
	}
	capacity := map[string]string{"cpu": "8", "memory": "16Gi", "pods": "110", ephemeralStorage: "80Gi"}
	for k, v := range g.resources {
		capacity[k] = v
	}
	now := time.Now().UTC().Format(time.RFC3339)
	applyJSON(ctx, t, c, map[string]any{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata":   map[string]any{"name": name, "labels": labels},
		"spec":       map[string]any{"providerID": "aws:///" + zone + "/" + instanceID, "taints": taints},
		"status": map[string]any{
			"capacity":    capacity,
			"allocatable": capacity,
			"conditions": []map[string]string{{"type": "Ready", "status": "True", "reason": "KubeletReady",
				"message": "stand-in registered by the e2e test", "lastHeartbeatTime": now,
				"lastTransitionTime": now}},
		},
	})
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "delete", "node", name, "--ignore-not-found", "--wait=false")
	})
	heartbeat(ctx, t, c, name)
	return name
}

// heartbeat renews the node's Lease every 10 s until the test ends, as its kubelet would: without it the controller
// manager marks the node NotReady after its grace period (50 s), and the autoscaler, which reads the groups'
// instances only once a minute (cloudprovider/aws/aws_manager.go refreshInterval), may first see the instance
// behind the node after that.
func heartbeat(ctx context.Context, t *testing.T, c cluster, node string) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
		_, _ = c.kubectl(context.Background(), "-n", "kube-node-lease", "delete", "lease.v1.coordination.k8s.io",
			node, "--ignore-not-found")
	})
	renew := func() error {
		lease := map[string]any{
			"apiVersion": "coordination.k8s.io/v1",
			"kind":       "Lease",
			"metadata":   map[string]any{"name": node, "namespace": "kube-node-lease"},
			"spec": map[string]any{"holderIdentity": node, "leaseDurationSeconds": 40,
				"renewTime": time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00")},
		}
		doc, err := json.Marshal(lease)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", c.Kubeconfig, "apply", "-f", "-")
		cmd.Stdin = bytes.NewReader(doc)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("renew lease: %w: %s", err, out)
		}
		return nil
	}
	assert.NilError(t, renew())
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
				// A failed renewal shows as the node going NotReady, which fails the test with the autoscaler's log.
				_ = renew()
			}
		}
	}()
}

// TestAutoscalerNeedsSetDesiredCapacity is the negative control of the IAM proof: the same stack, pod and
// autoscaler as above, under a user whose policy is the stack's minus autoscaling:SetDesiredCapacity, must not scale;
// moto refuses the call (HTTP 403) and the autoscaler reports the failed scale-up. It shows that moto enforces the
// policy, so the scale-up above was allowed by the stack's policy and not by a permissive mock.
func TestAutoscalerNeedsSetDesiredCapacity(t *testing.T) {
	c := requireCluster(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := loadStackAutoscaling(t)
	spot, g := s.spotGroup(t)
	const user = "e2e-no-set-desired-capacity"
	a := startAWS(ctx, t, s, []replayUser{{Name: user, Policy: policyWithout(t, s.policy, setDesiredCapacity)}})
	ca := startAutoscaler(ctx, t, c, s, a, a.users[user])

	_, declaresEphemeral := g.resources[ephemeralStorage]
	createPendingPod(ctx, t, c, fitsPod("e2e-denied-agent", g, declaresEphemeral))
	msg := waitEvent(ctx, t, c, "kube-system", "cluster-autoscaler-status", "FailedToScaleUpGroup", start, 60*time.Second)
	if !strings.Contains(msg, spot) {
		t.Errorf("FailedToScaleUpGroup says %q, want group %s", msg, spot)
	}
	// The autoscaler chose the spot group (and was refused): explain chooses it too.
	explainAgrees(ctx, t, c, s, "e2e-denied-agent", spot)
	if d := a.desired(ctx, t); d[spot] != 0 {
		t.Errorf("group %s desired %d without SetDesiredCapacity", spot, d[spot])
	}
	if !strings.Contains(a.logs.String(), `" 403 `) {
		t.Errorf("moto logged no HTTP 403:\n%s", tail(a.logs.String(), 40))
	}
	// aws-sdk-go v1 cannot parse moto's error document, so the message is empty; the status code is there.
	if log := ca.logs.String(); !strings.Contains(log, "failed to increase node group size") ||
		!strings.Contains(log, "status code: 403") {
		t.Errorf("the autoscaler logged no refused scale-up:\n%s", tail(log, 60))
	}
}

//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/auto/optdestroy"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optup"
	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// Fixed values in place of the access keys the full stack takes from IAM, whose provider cannot run here.
const (
	e2eAWSKeyID         = "AKIAE2ETESTKEY000001"
	e2eAWSSecretKey     = "e2e/secret+access+key+not+real+000000"
	e2eCleanupKeyID     = "AKIAE2ECLEANUPKEY001"
	e2eCleanupSecretKey = "e2e/cleanup+access+key+not+real+00000"
	e2eRotatorKeyID     = "AKIAE2EROTATORKEY001"
	e2eRotatorSecretKey = "e2e/rotator+key+not+real+0000000000"

	autoscalerSA = "cluster-autoscaler"
	controllerSA = addons.ControllerName
	nthSA        = "aws-node-termination-handler"
)

// TestClusterAddonsLifecycle runs the component through up, a no-op up, an in-place update and destroy, checking
// the live objects and their RBAC against the real API server at each step (the controller's rotation runs are
// TestTokenRotator's). The steps share
// one stack and depend on each other, so the first failure ends the test.
func TestClusterAddonsLifecycle(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	cfg := devConfig(t)
	pools := slices.Clone(cfg.NodePools)
	spotPool := slices.IndexFunc(pools, func(p config.NodePool) bool { return p.Spot && len(p.Taints) > 0 })
	if spotPool < 0 {
		t.Fatal("the dev stack has no tainted spot pool; the taint update step needs one")
	}
	s := newStack(ctx, t, c, addonsProgram(c, cfg, &pools))
	destroyed := false
	t.Cleanup(func() {
		if destroyed {
			return
		}
		// Leave the shared API server clean for the other tests even after a failure.
		dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer dcancel()
		if _, err := s.Destroy(dctx, optdestroy.ProgressStreams(s.log)); err != nil {
			t.Logf("cleanup destroy: %v", err)
		}
	})

	// 1. up succeeds and every object the stack manages exists, as the very object Pulumi created.
	start := time.Now()
	up, err := s.Up(ctx, optup.ProgressStreams(s.log), optup.ErrorProgressStreams(s.log))
	assert.NilError(t, err, "up")
	t.Logf("first up: %s, %v", time.Since(start).Round(time.Millisecond), changes(*up.Summary.ResourceChanges))
	objs, err := s.objects(ctx)
	assert.NilError(t, err)
	if len(objs) == 0 {
		t.Fatal(errNoObjects)
	}
	uids := checkLive(ctx, t, c, objs)
	checkDeclared(ctx, t, c, cfg)
	if t.Failed() {
		t.FailNow()
	}

	// 2. RBAC suffices, and no more.
	checkRBAC(ctx, t, c)

	// 3a. A second up with the same config changes nothing.
	start = time.Now()
	again, err := s.Up(ctx, optup.ExpectNoChanges(), optup.ProgressStreams(s.log), optup.ErrorProgressStreams(s.log))
	assert.NilError(t, err, "second up")
	if ch := changes(*again.Summary.ResourceChanges); len(ch) != 0 {
		t.Fatalf("second up changed %v", ch)
	}
	t.Logf("second up: %s, no changes", time.Since(start).Round(time.Millisecond))

	// 3b. A changed pool taint updates the objects that tolerate it in place.
	oldTaint := pools[spotPool].Taints[0]
	newTaint := oldTaint
	newTaint.Value = oldTaint.Value + "-e2e"
	pools[spotPool] = clonePool(pools[spotPool])
	pools[spotPool].Taints[0] = newTaint
	start = time.Now()
	upd, err := s.Up(ctx, optup.ProgressStreams(s.log), optup.ErrorProgressStreams(s.log))
	assert.NilError(t, err, "taint update up")
	ch := changes(*upd.Summary.ResourceChanges)
	t.Logf("taint update: %s, %v", time.Since(start).Round(time.Millisecond), ch)
	if ch["update"] == 0 || len(ch) != 1 {
		t.Errorf("taint change: got %v, want only updates", ch)
	}
	after, err := s.objects(ctx)
	assert.NilError(t, err)
	if len(after) != len(objs) {
		t.Errorf("taint change: %d objects before, %d after", len(objs), len(after))
	}
	for _, o := range after {
		if uids[o.URN] != o.UID {
			t.Errorf("%s: replaced (uid %s -> %s), want an in-place update", o, uids[o.URN], o.UID)
		}
	}
	checkTolerations(ctx, t, c, objs, oldTaint, newTaint)

	// 4. destroy leaves none of the stack's objects behind.
	start = time.Now()
	if _, err := s.Destroy(ctx, optdestroy.ProgressStreams(s.log)); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	destroyed = true
	t.Logf("destroy: %s", time.Since(start).Round(time.Millisecond))
	for _, o := range objs {
		_, err := c.kubectl(ctx, append([]string{"get"}, o.args()...)...)
		switch {
		case err == nil:
			t.Errorf("%s still exists after destroy", o)
		case !isNotFound(err):
			t.Errorf("%s: %v", o, err)
		}
	}
	// What the workloads made (ReplicaSets, pods, a Job if the schedule fired) is deleted by the garbage collector
	// after destroy returns, so give it a moment; anything still there then was leaked.
	deadline := time.Now().Add(time.Minute)
	for {
		left, err := c.kubectl(ctx, "get", "all,secrets,configmaps,serviceaccounts,roles,rolebindings,"+
			"clusterroles,clusterrolebindings", "-A", "-l", "app.kubernetes.io/part-of=dynk8s", "-o", "name")
		assert.NilError(t, err)
		if strings.TrimSpace(left) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("objects labelled part-of=dynk8s left a minute after destroy:\n%s", left)
			break
		}
		time.Sleep(time.Second)
	}
}

func clonePool(p config.NodePool) config.NodePool {
	p.Taints = slices.Clone(p.Taints)
	p.InstanceTypes = slices.Clone(p.InstanceTypes)
	return p
}

// checkLive asserts that every object in the stack's state is live, as the very object Pulumi created (same uid),
// and that the stack manages the objects every dynk8s cluster needs. It returns the uids by URN.
func checkLive(ctx context.Context, t *testing.T, c cluster, objs []k8sObject) map[string]string {
	t.Helper()
	uids := map[string]string{}
	for _, o := range objs {
		var live struct {
			Metadata struct {
				UID string `json:"uid"`
			} `json:"metadata"`
		}
		if err := c.getJSON(ctx, &live, o.args()...); err != nil {
			t.Errorf("%s: %v", o, err)
			continue
		}
		if live.Metadata.UID != o.UID {
			t.Errorf("%s: live uid %s, state uid %s", o, live.Metadata.UID, o.UID)
		}
		uids[o.URN] = o.UID
	}
	t.Logf("%d objects live: %v", len(objs), objs)
	for _, want := range []string{
		"ServiceAccount kube-system/" + autoscalerSA,
		"Deployment kube-system/" + autoscalerSA,
		"ClusterRole " + autoscalerSA,
		"ServiceAccount kube-system/" + controllerSA,
		"Deployment kube-system/" + controllerSA,
		"ClusterRole " + controllerSA,
		"Role kube-system/" + controllerSA,
		"Secret kube-system/" + addons.TokenRotatorCredentialsName,
		"ValidatingAdmissionPolicy dynk8s-controller-nodes",
		"ValidatingAdmissionPolicy " + addons.TokenRotatorName,
		"ServiceAccount kube-system/" + nthSA,
		"DaemonSet kube-system/" + nthSA,
	} {
		if !slices.ContainsFunc(objs, func(o k8sObject) bool { return o.String() == want }) {
			t.Errorf("the stack does not manage %s", want)
		}
	}
	return uids
}

// checkDeclared reads back the objects whose content matters most and compares them with the dev config.
func checkDeclared(ctx context.Context, t *testing.T, c cluster, cfg *config.Config) {
	t.Helper()
	var dep struct {
		Spec struct {
			Template struct {
				Spec templateSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := c.getJSON(ctx, &dep, "deployment.v1.apps", autoscalerSA, "-n", "kube-system"); err != nil {
		t.Errorf("autoscaler deployment: %v", err)
		return
	}
	pod := dep.Spec.Template.Spec
	if pod.ServiceAccountName != autoscalerSA || len(pod.Containers) != 1 {
		t.Errorf("autoscaler pod: service account %q, %d containers", pod.ServiceAccountName, len(pod.Containers))
		return
	}
	ctr := pod.Containers[0]
	if want := "registry.k8s.io/autoscaling/cluster-autoscaler:v" + cfg.Derived.AutoscalerVersion.String(); ctr.Image != want {
		t.Errorf("autoscaler image %q, want %q", ctr.Image, want)
	}
	flags := append(slices.Clone(ctr.Command), ctr.Args...)
	for _, want := range []string{
		"--cloud-provider=aws",
		"--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/" +
			cfg.ClusterName,
		"--expander=" + cfg.Autoscaler.Expander,
		"--scale-down-unneeded-time=" + cfg.Autoscaler.ScaleDownUnneededTime,
	} {
		if !slices.Contains(flags, want) {
			t.Errorf("autoscaler flags %q lack %q", flags, want)
		}
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name
		default:
			env[e.Name] = e.Value
		}
	}
	if env["AWS_REGION"] != cfg.Region {
		t.Errorf("AWS_REGION %q, want %q", env["AWS_REGION"], cfg.Region)
	}
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		if !strings.HasPrefix(env[k], "secret:") {
			t.Errorf("%s is %q, want a secretKeyRef", k, env[k])
			continue
		}
		// The referenced Secret must exist and hold the key, or the pod would never start.
		name := strings.TrimPrefix(env[k], "secret:")
		var sec struct {
			Data map[string]string `json:"data"`
		}
		if err := c.getJSON(ctx, &sec, "secret.v1.", name, "-n", "kube-system"); err != nil {
			t.Errorf("%s: %v", k, err)
		} else if len(sec.Data) == 0 {
			t.Errorf("%s: secret %s is empty", k, name)
		}
	}
}

// canI is one `kubectl auth can-i` question: verb on resource (resource[.group]), optionally a subresource, an
// object name and a namespace.
type canI struct {
	verb, resource, sub, name, ns string
}

func (q canI) args(sa string) []string {
	target := q.resource
	if q.name != "" {
		target += "/" + q.name
	}
	a := []string{"auth", "can-i", q.verb, target, "--as=system:serviceaccount:kube-system:" + sa}
	if q.sub != "" {
		a = append(a, "--subresource="+q.sub)
	}
	if q.ns != "" {
		a = append(a, "-n", q.ns)
	} else {
		a = append(a, "--all-namespaces")
	}
	return a
}

// autoscalerNeeds is the upstream AWS example's RBAC (kubernetes/autoscaler at cluster-autoscaler-1.34.5,
// cluster-autoscaler/cloudprovider/aws/examples/cluster-autoscaler-autodiscover.yaml), written out here rather
// than taken from the component so that the test checks the component against upstream, not against itself. The
// extensions group is left out: this API server does not serve it.
func autoscalerNeeds() []canI {
	var q []canI
	add := func(resource, sub, name, ns string, verbs ...string) {
		for _, v := range verbs {
			q = append(q, canI{v, resource, sub, name, ns})
		}
	}
	add("events", "", "", "", "create", "patch")
	add("endpoints", "", "", "", "create", "patch")
	add("pods", "eviction", "", "", "create")
	add("pods", "status", "", "", "update")
	add("endpoints", "", "cluster-autoscaler", "kube-system", "get", "update")
	add("nodes", "", "", "", "watch", "list", "get", "update")
	for _, r := range []string{"namespaces", "pods", "services", "replicationcontrollers", "persistentvolumeclaims",
		"persistentvolumes"} {
		add(r, "", "", "", "watch", "list", "get")
	}
	add("poddisruptionbudgets.policy", "", "", "", "watch", "list")
	for _, r := range []string{"statefulsets", "replicasets", "daemonsets"} {
		add(r+".apps", "", "", "", "watch", "list", "get")
	}
	for _, r := range []string{"deviceclasses", "resourceslices", "resourceclaims"} {
		add(r+".resource.k8s.io", "", "", "", "watch", "list", "get")
	}
	for _, r := range []string{"storageclasses", "csinodes", "csidrivers", "csistoragecapacities",
		"volumeattachments"} {
		add(r+".storage.k8s.io", "", "", "", "watch", "list", "get")
	}
	add("jobs.batch", "", "", "", "get", "list", "watch", "patch")
	add("leases.coordination.k8s.io", "", "", "kube-system", "create")
	add("leases.coordination.k8s.io", "", "cluster-autoscaler", "kube-system", "get", "update")
	add("configmaps", "", "", "kube-system", "create", "list", "watch")
	for _, n := range []string{"cluster-autoscaler-status", "cluster-autoscaler-priority-expander"} {
		add("configmaps", "", n, "kube-system", "delete", "get", "update", "watch")
	}
	return q
}

func checkRBAC(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	type expect struct {
		sa    string
		q     canI
		allow bool
	}
	var all []expect
	for _, q := range autoscalerNeeds() {
		all = append(all, expect{autoscalerSA, q, true})
	}
	for _, q := range []canI{
		{verb: "get", resource: "secrets", ns: "kube-system"},
		{verb: "delete", resource: "nodes"},
		{verb: "create", resource: "pods", ns: "default"},
		{verb: "update", resource: "configmaps", name: "kube-proxy", ns: "kube-system"},
	} {
		all = append(all, expect{autoscalerSA, q, false})
	}
	// The controller judges CSRs, removes a taint from and deletes Nodes (its node policy narrows both), creates
	// Secrets in kube-system (its token policy narrows that) and keeps its record and Lease; it reads no Secret.
	// Its approve verb on the kubelet client signer is not asked here: `kubectl auth can-i` cannot name a signer
	// whose name holds a '/' (it answers no), and TestNodeCSRApprover proves the approval for real.
	for _, q := range []canI{
		{verb: "list", resource: "certificatesigningrequests.certificates.k8s.io"},
		{verb: "update", resource: "certificatesigningrequests.certificates.k8s.io", sub: "approval"},
		{verb: "watch", resource: "nodes"},
		{verb: "update", resource: "nodes"},
		{verb: "delete", resource: "nodes"},
		{verb: "create", resource: "secrets", ns: "kube-system"},
		{verb: "update", resource: "configmaps", name: addons.ApprovalRecordName, ns: "kube-system"},
		{verb: "update", resource: "leases.coordination.k8s.io", name: controllerSA, ns: "kube-system"},
	} {
		all = append(all, expect{controllerSA, q, true})
	}
	for _, q := range []canI{
		{verb: "get", resource: "secrets", ns: "kube-system"},
		{verb: "get", resource: "secrets", name: "bootstrap-token-abcdef", ns: "kube-system"},
		{verb: "list", resource: "secrets"},
		{verb: "update", resource: "secrets", ns: "kube-system"},
		{verb: "delete", resource: "secrets", ns: "kube-system"},
		{verb: "create", resource: "secrets", ns: "default"},
		{verb: "update", resource: "configmaps", name: "kube-proxy", ns: "kube-system"},
		{verb: "update", resource: "leases.coordination.k8s.io", name: "kube-controller-manager", ns: "kube-system"},
		{verb: "delete", resource: "pods", ns: "default"},
		{verb: "create", resource: "pods", ns: "kube-system"},
	} {
		all = append(all, expect{controllerSA, q, false})
	}
	// The spot drain cordons and evicts, and reads nothing secret.
	for _, q := range []canI{
		{verb: "patch", resource: "nodes"},
		{verb: "list", resource: "pods"},
		{verb: "create", resource: "pods", sub: "eviction"},
		{verb: "get", resource: "daemonsets.apps", ns: "kube-system"},
	} {
		all = append(all, expect{nthSA, q, true})
	}
	all = append(all, expect{nthSA, canI{verb: "get", resource: "secrets", ns: "kube-system"}, false})
	for _, e := range all {
		out, err := c.kubectl(ctx, e.q.args(e.sa)...)
		answer := strings.TrimSpace(out)
		// can-i exits 1 for "no"; anything but a plain yes or no is a broken question, not an answer.
		if answer != "yes" && answer != "no" {
			t.Errorf("%s: can-i %v: %q %v", e.sa, e.q, answer, err)
			continue
		}
		if got := answer == "yes"; got != e.allow {
			t.Errorf("%s: can-i %s %s sub=%q name=%q ns=%q: %s, want allowed=%v", e.sa, e.q.verb, e.q.resource,
				e.q.sub, e.q.name, e.q.ns, answer, e.allow)
		}
	}
	t.Logf("%d RBAC questions checked", len(all))
}

// checkTolerations asserts that every DaemonSet of the stack that tolerated the old taint now tolerates the new one
// instead, and that at least one did.
func checkTolerations(ctx context.Context, t *testing.T, c cluster, objs []k8sObject, oldT, newT kube.Taint) {
	t.Helper()
	type toleration struct {
		Key, Value, Effect string
	}
	matched := 0
	for _, o := range objs {
		if o.Kind != "DaemonSet" {
			continue
		}
		var ds struct {
			Spec struct {
				Template struct {
					Spec struct {
						Tolerations []toleration `json:"tolerations"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := c.getJSON(ctx, &ds, o.args()...); err != nil {
			t.Error(err)
			continue
		}
		tols := ds.Spec.Template.Spec.Tolerations
		hasOld := slices.Contains(tols, toleration{oldT.Key, oldT.Value, string(oldT.Effect)})
		hasNew := slices.Contains(tols, toleration{newT.Key, newT.Value, string(newT.Effect)})
		if hasOld {
			t.Errorf("%s still tolerates the old taint %v", o, oldT)
		}
		if hasNew {
			matched++
		}
	}
	if matched == 0 {
		t.Errorf("no DaemonSet tolerates the new taint %v", newT)
	}
}

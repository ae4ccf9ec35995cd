//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"
	"github.com/dynk8s/dynk8s/cmd/plan/plan"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/node/nodetest"
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
	groupType           = "aws:autoscaling/group:Group"
	launchTemplateType  = "aws:ec2/launchTemplate:LaunchTemplate"
	userPolicyType      = "aws:iam/userPolicy:UserPolicy"
	deploymentType      = "kubernetes:apps/v1:Deployment"
	autoscalerName      = "cluster-autoscaler"
	nodeTemplatePrefix  = "k8s.io/cluster-autoscaler/node-template/"
	fuseResource        = "github.com/fuse"
	ephemeralStorage    = "ephemeral-storage"
	setDesiredCapacity  = "autoscaling:SetDesiredCapacity"
	toBeDeletedTaintKey = "ToBeDeletedByClusterAutoscaler"
	// priorityExpanderConfigMap is the ConfigMap in kube-system the priority expander reads.
	priorityExpanderConfigMap = "cluster-autoscaler-priority-expander"
	// The test's shortened scale-down timing: the stack's default unneeded time is 10 minutes.
	testUnneededTime = "10s"
)

// stackAutoscaling is what the dev stack declares for the autoscaler, read from the mock engine's record.
type stackAutoscaling struct {
	// cfg is the stack's parsed config, for cmd/explain's package.
	cfg    *config.Config
	region string
	// groups are the Auto Scaling groups by name, as declared.
	groups map[string]declaredGroup
	// replay is the document testdata/moto_aws.py setup reads.
	replay replayPlan
	// userName and policy are the autoscaler's IAM user and its user policy document.
	userName, policy string
	// cleanupUser and cleanupPolicy are the stale-node cleanup's IAM user and its user policy document; cleanup is
	// its CronJob as rendered, and cleanupScript the script its ConfigMap holds.
	cleanupUser, cleanupPolicy, cleanupScript string
	cleanup                                   map[string]any
	// priorities is the priority expander's ConfigMap as rendered (nil without the priority expander).
	priorities map[string]any
	// command, args and env are the autoscaler container's, as rendered (env: the plain values only).
	command, args []string
	env           map[string]string
	// rolePolicies are the inline policy documents of each IAM role, by role name (the node's, the gateway's).
	rolePolicies map[string][]string
	// gateway is the gateway instance as declared.
	gateway *replayInstance
	// profileRoles are the instance profiles' roles, by profile name.
	profileRoles map[string]string
}

// declaredGroup is one group's node-template, read from its declared tags.
type declaredGroup struct {
	labels    map[string]string
	taints    []declaredTaint
	resources map[string]string
}

type declaredTaint struct{ key, value, effect string }

type replayPlan struct {
	VPCs             []map[string]any `json:"vpcs"`
	Subnets          []map[string]any `json:"subnets"`
	SecurityGroups   []map[string]any `json:"securityGroups"`
	InstanceProfiles []string         `json:"instanceProfiles"`
	LaunchTemplates  []map[string]any `json:"launchTemplates"`
	Groups           []map[string]any `json:"groups"`
	Users            []replayUser     `json:"users"`
	// Roles are instance roles to create and assume (their temporary credentials come back in awsEnv.roles).
	Roles []replayRole `json:"roles,omitempty"`
	// Gateway, when set, is the gateway instance to launch and leave stopped.
	Gateway *replayInstance `json:"gateway,omitempty"`
}

// replayInstance is a declared instance: the mock engine's id and its inputs.
type replayInstance struct {
	ID     string         `json:"id"`
	Inputs map[string]any `json:"inputs"`
}

// replayRole is an IAM role with its inline policies.
type replayRole struct {
	Name     string   `json:"name"`
	Policies []string `json:"policies"`
}

type replayUser struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
}

// loadStackAutoscaling runs the dev stack under the mock engine.
func loadStackAutoscaling(t *testing.T) stackAutoscaling {
	t.Helper()
	return loadStackVariant(t, func(map[string]any) {})
}

// devStackValues is the dev stack file's config map, for a test to change.
func devStackValues(t *testing.T) map[string]any {
	t.Helper()
	values, err := config.ReadStackFile(filepath.Join("..", "Pulumi.dev.yaml"))
	if err != nil {
		t.Fatalf("read dev stack: %v", err)
	}
	return values
}

// loadStackVariant runs the dev stack, changed by change (its config map), under the mock engine.
func loadStackVariant(t *testing.T, change func(values map[string]any)) stackAutoscaling {
	t.Helper()
	values := devStackValues(t)
	change(values)
	sc, err := mockcloud.ConfigFromMap(values)
	if err != nil {
		t.Fatal(err)
	}
	res, err := plan.RunConfig("dev", sc)
	if err != nil {
		t.Fatalf("dev stack under the mock engine: %v", err)
	}
	cfg, err := config.ParseValues(sc.Values)
	if err != nil {
		t.Fatal(err)
	}
	s := stackAutoscaling{cfg: cfg, region: res.Cloud.Region, groups: map[string]declaredGroup{},
		rolePolicies: map[string][]string{}, profileRoles: map[string]string{}}
	plain := func(r mockcloud.Resource) map[string]any { return mockcloud.PlainMap(r.Inputs, true) }
	str := func(m map[string]any, k string) string { v, _ := m[k].(string); return v }
	for _, r := range res.Resources() {
		in := plain(r)
		switch r.Type {
		case "aws:ec2/vpc:Vpc":
			s.replay.VPCs = append(s.replay.VPCs, map[string]any{"id": r.ID, "cidrBlock": in["cidrBlock"]})
		case "aws:ec2/subnet:Subnet":
			s.replay.Subnets = append(s.replay.Subnets, map[string]any{"id": r.ID, "vpcId": in["vpcId"],
				"cidrBlock": in["cidrBlock"], "availabilityZone": in["availabilityZone"]})
		case "aws:ec2/securityGroup:SecurityGroup":
			s.replay.SecurityGroups = append(s.replay.SecurityGroups,
				map[string]any{"id": r.ID, "name": r.Name, "vpcId": in["vpcId"]})
		case "aws:iam/instanceProfile:InstanceProfile":
			s.replay.InstanceProfiles = append(s.replay.InstanceProfiles, str(in, "name"))
			s.profileRoles[str(in, "name")] = str(in, "role")
		case launchTemplateType:
			s.replay.LaunchTemplates = append(s.replay.LaunchTemplates,
				map[string]any{"id": r.ID, "name": r.Name, "inputs": in})
		case groupType:
			// The mock names a group by its resource name; moto gets the same name.
			s.replay.Groups = append(s.replay.Groups, map[string]any{"name": r.ID, "inputs": in})
			s.groups[r.ID] = groupTemplate(t, r.ID, in)
		case userPolicyType:
			switch str(in, "name") {
			case autoscalerName:
				s.userName, s.policy = str(in, "user"), str(in, "policy")
			case "node-cleanup":
				s.cleanupUser, s.cleanupPolicy = str(in, "user"), str(in, "policy")
			}
		case "aws:iam/rolePolicy:RolePolicy":
			s.rolePolicies[str(in, "role")] = append(s.rolePolicies[str(in, "role")], str(in, "policy"))
		case "aws:ec2/instance:Instance":
			s.gateway = &replayInstance{ID: r.ID, Inputs: in}
		case "kubernetes:batch/v1:CronJob", "kubernetes:core/v1:ConfigMap":
			meta, _ := in["metadata"].(map[string]any)
			if str(meta, "name") == priorityExpanderConfigMap {
				s.priorities = in
			}
			if str(meta, "name") != cleanupSA {
				break
			}
			if data, ok := in["data"].(map[string]any); ok {
				s.cleanupScript = str(data, "cleanup.sh")
			} else {
				s.cleanup = in
			}
		case deploymentType:
			meta, _ := in["metadata"].(map[string]any)
			if str(meta, "name") == autoscalerName {
				s.command, s.args, s.env = autoscalerContainer(t, in)
			}
		}
	}
	if len(s.groups) < 2 || s.policy == "" || len(s.args) == 0 {
		t.Fatalf("dev stack: %d groups, policy %t, autoscaler args %q: the test needs two pools, the "+
			"autoscaler's user policy and its Deployment", len(s.groups), s.policy != "", s.args)
	}
	return s
}

// groupTemplate reads the node-template tags of a declared group.
func groupTemplate(t *testing.T, name string, in map[string]any) declaredGroup {
	t.Helper()
	g := declaredGroup{labels: map[string]string{}, resources: map[string]string{}}
	tags, _ := in["tags"].([]any)
	for _, e := range tags {
		tag, _ := e.(map[string]any)
		k, _ := tag["key"].(string)
		v, _ := tag["value"].(string)
		rest, ok := strings.CutPrefix(k, nodeTemplatePrefix)
		if !ok {
			continue
		}
		switch kind, key, _ := strings.Cut(rest, "/"); kind {
		case "label":
			g.labels[key] = v
		case "resources":
			g.resources[key] = v
		case "taint":
			value, effect, ok := strings.Cut(v, ":")
			if !ok {
				t.Fatalf("group %s: taint tag %s=%q is not value:effect", name, k, v)
			}
			g.taints = append(g.taints, declaredTaint{key: key, value: value, effect: effect})
		}
	}
	return g
}

// autoscalerContainer returns the autoscaler container's command, args and plain env values.
func autoscalerContainer(t *testing.T, deployment map[string]any) (command, args []string, env map[string]string) {
	t.Helper()
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name    string   `json:"name"`
						Command []string `json:"command"`
						Args    []string `json:"args"`
						Env     []struct {
							Name  string `json:"name"`
							Value string `json:"value"`
						} `json:"env"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	raw, err := json.Marshal(deployment)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("autoscaler Deployment: %v", err)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name != autoscalerName {
			continue
		}
		env = map[string]string{}
		for _, e := range c.Env {
			if e.Value != "" {
				env[e.Name] = e.Value
			}
		}
		return c.Command, c.Args, env
	}
	t.Fatalf("autoscaler Deployment has no container %s", autoscalerName)
	return nil, nil, nil
}

// spotGroup is the group of the dev stack's spot pool: the one with a taint, which the scale-up pods must tolerate.
func (s stackAutoscaling) spotGroup(t *testing.T) (string, declaredGroup) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(s.groups)) {
		g := s.groups[name]
		if g.labels["dynk8s.io/capacity-type"] == "spot" && len(g.taints) > 0 {
			return name, g
		}
	}
	t.Fatal("the dev stack declares no tainted spot group")
	return "", declaredGroup{}
}

// policyWithout returns the policy document with action removed from every statement; it fails the test when the
// policy does not grant the action at all (the control would then prove nothing).
func policyWithout(t *testing.T, policy, action string) string {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(policy), &doc); err != nil {
		t.Fatalf("policy: %v", err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// awsEnv is moto with the stack replayed into it.
type awsEnv struct {
	url, region string
	logs        *nodetest.SyncBuffer
	script      string
	admin       awsKey
	users       map[string]awsKey
	// roles are the temporary credentials of the replayed roles, each assumed once, by role name.
	roles map[string]awsKey
	// ids are moto's ids of the replayed resources, by the mock engine's.
	ids map[string]string
}

type awsKey struct {
	Key    string `json:"key"`
	Secret string `json:"secret"`
	// Token is the session token of temporary credentials.
	Token string `json:"token,omitempty"`
}

type groupState struct {
	Desired   int               `json:"desired"`
	Tags      map[string]string `json:"tags"`
	Instances []struct {
		ID   string `json:"id"`
		Zone string `json:"zone"`
	} `json:"instances"`
}

// startAWS starts moto_server with IAM enforcement and replays the stack into it; users are the IAM users to make.
func startAWS(ctx context.Context, t *testing.T, s stackAutoscaling, users []replayUser) *awsEnv {
	t.Helper()
	bin := requireTool(t, "moto_server")
	requireTool(t, "python3")
	// The pyenv shim is a bash script: run the real entry point, so that the signal below reaches the server.
	if out, err := exec.Command("pyenv", "which", "moto_server").Output(); err == nil {
		bin = strings.TrimSpace(string(out))
	}
	// The first three AWS calls are free (moto_aws.py setup spends them on an admin user and its key); every call
	// after them must be signed by a known key and allowed by that user's policies. Readiness asks /moto-api/,
	// which is no AWS action and spends no free call.
	m := startMoto(ctx, t, bin, "INITIAL_NO_AUTH_ACTION_COUNT=3")
	a := &awsEnv{url: m.url, region: s.region, logs: m.logs}

	a.script = filepath.Join("testdata", "moto_aws.py")
	p := s.replay
	p.Users = users
	in, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Admin awsKey            `json:"admin"`
		Users map[string]awsKey `json:"users"`
		Roles map[string]awsKey `json:"roles"`
		IDs   map[string]string `json:"ids"`
	}
	a.python(ctx, t, in, &out, "setup")
	a.admin, a.users, a.roles, a.ids = out.Admin, out.Users, out.Roles, out.IDs
	return a
}

// python runs a moto_aws.py command and decodes its JSON answer into v.
func (a *awsEnv) python(ctx context.Context, t *testing.T, stdin []byte, v any, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "python3", append([]string{a.script, args[0], a.url, a.region}, args[1:]...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("moto_aws.py %s: %v\n%s", args[0], err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		t.Fatalf("moto_aws.py %s: %v: %s", args[0], err, stdout.String())
	}
}

func (a *awsEnv) groups(ctx context.Context, t *testing.T) map[string]groupState {
	t.Helper()
	var g map[string]groupState
	a.python(ctx, t, nil, &g, "groups", a.admin.Key, a.admin.Secret)
	return g
}

func (a *awsEnv) instances(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	var i map[string]string
	a.python(ctx, t, nil, &i, "instances", a.admin.Key, a.admin.Secret)
	return i
}

// desired returns each group's desired capacity.
func (a *awsEnv) desired(ctx context.Context, t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for name, g := range a.groups(ctx, t) {
		out[name] = g.Desired
	}
	return out
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
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

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
		// Shortened loop (default 10 s) and scale-down delay after a scale-up (default 10 min), so that the tests
		// take seconds instead of minutes; what the loop decides is unchanged.
		"--scan-interval=2s",
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

// stopOnCleanup starts cmd and stops it (SIGTERM, then SIGKILL after 5 s) when the test ends, logging its output if
// the test failed. The returned channel is closed when the process has exited.
func stopOnCleanup(t *testing.T, name string, cmd *exec.Cmd, logs *nodetest.SyncBuffer) chan struct{} {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output (last lines):\n%s", name, tail(logs.String(), 80))
		}
		// The whole log beside the control plane's (hack/start-kube.sh keeps them with DYNK8S_KEEP_KUBE_DIR).
		if dir := os.Getenv("DYNK8S_E2E_DIR"); dir != "" {
			file := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + name + ".log"
			_ = os.WriteFile(filepath.Join(dir, "logs", file), []byte(logs.String()), 0o600)
		}
	})
	return done
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
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

// allZero reports whether every group's desired capacity is 0.
func allZero(d map[string]int) bool {
	for _, n := range d {
		if n != 0 {
			return false
		}
	}
	return true
}

// podSpec is what a test pod asks for.
type podSpec struct {
	name     string
	selector map[string]string
	tolerate []declaredTaint
	requests map[string]string
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
	if err != nil {
		t.Fatal(err)
	}
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

// applyJSON creates an object from its JSON form.
func applyJSON(ctx context.Context, t *testing.T, c cluster, obj any) {
	t.Helper()
	kubectlJSON(ctx, t, c, "create", obj)
}

// kubectlJSON runs kubectl verb (create, replace) with obj as its input.
func kubectlJSON(ctx context.Context, t *testing.T, c cluster, verb string, obj any) {
	t.Helper()
	doc, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", c.Kubeconfig, verb, "-f", "-")
	cmd.Stdin = bytes.NewReader(doc)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s\n%s", verb, err, out, doc)
	}
}

// waitEvent waits for an event with reason on the object, last seen at or after since (events outlive the objects
// of an earlier run against the same cluster), and returns its message.
func waitEvent(ctx context.Context, t *testing.T, c cluster, ns, object, reason string, since time.Time,
	timeout time.Duration) string {
	t.Helper()
	since = since.Truncate(time.Second) // event timestamps have second resolution
	deadline := time.Now().Add(timeout)
	for {
		var list struct {
			Items []struct {
				Message       string    `json:"message"`
				LastTimestamp time.Time `json:"lastTimestamp"`
			} `json:"items"`
		}
		err := c.getJSON(ctx, &list, "events", "-n", ns,
			"--field-selector", "involvedObject.name="+object+",reason="+reason)
		for i := len(list.Items) - 1; err == nil && i >= 0; i-- {
			if !list.Items[i].LastTimestamp.Before(since) {
				return list.Items[i].Message
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("no %s event on %s/%s after %s (last error: %v)", reason, ns, object, timeout, err)
		}
		time.Sleep(time.Second)
	}
}

// deletePod deletes a pod (no kubelet: an unbound pod goes at once) and waits until it is gone.
func deletePod(ctx context.Context, t *testing.T, c cluster, name string) {
	t.Helper()
	if _, err := c.kubectl(ctx, "-n", "default", "delete", "pod", name, "--timeout=30s"); err != nil {
		t.Fatal(err)
	}
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
		if err != nil {
			t.Fatal(err)
		}
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
		if state := a.instances(ctx, t)[instanceID]; state != "terminated" && state != "shutting-down" {
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
	if err := c.getJSON(ctx, &n, "node", node); err != nil {
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
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
	if err := renew(); err != nil {
		t.Fatal(err)
	}
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

// instanceRoles are the stack's roles of the node's and the gateway's instance profiles, with their inline
// policies, for moto to create and assume: what IMDS hands an instance are that role's temporary credentials, which
// moto's IAM enforcement checks against the role's policies.
func (s stackAutoscaling) instanceRoles(t *testing.T) []replayRole {
	t.Helper()
	var roles []replayRole
	for _, name := range []string{s.nodeRole(t), s.gatewayRole(t)} {
		if len(s.rolePolicies[name]) == 0 {
			t.Fatalf("the dev stack declares no policy for role %s", name)
		}
		roles = append(roles, replayRole{Name: name, Policies: s.rolePolicies[name]})
	}
	return roles
}

// stopInstance stops an instance as EC2 does when the instance shuts itself down (its shutdown behaviour "stop").
func (a *awsEnv) stopInstance(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	var state string
	a.python(ctx, t, nil, &state, "stop", a.admin.Key, a.admin.Secret, id)
}

// gatewayRole is the role of the gateway instance's profile.
func (s stackAutoscaling) gatewayRole(t *testing.T) string {
	t.Helper()
	profile, _ := s.gateway.Inputs["iamInstanceProfile"].(string)
	role := s.profileRoles[profile]
	if role == "" {
		t.Fatalf("the gateway's instance profile %q has no declared role", profile)
	}
	return role
}

// nodeRole is the role of the profile every pool's launch template names (by ARN: .../instance-profile/NAME).
func (s stackAutoscaling) nodeRole(t *testing.T) string {
	t.Helper()
	var role string
	for _, lt := range s.replay.LaunchTemplates {
		inputs, _ := lt["inputs"].(map[string]any)
		prof, _ := inputs["iamInstanceProfile"].(map[string]any)
		arn, _ := prof["arn"].(string)
		r := s.profileRoles[arn[strings.LastIndexByte(arn, '/')+1:]]
		if r == "" || (role != "" && r != role) {
			t.Fatalf("launch template %v names profile %q: no declared role, or not the other pools' (%s)", lt["name"], arn, role)
		}
		role = r
	}
	return role
}

package addons

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cmd/plan/mockcloud"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// Values of the test fixture that must never show up outside a secret.
const (
	testAWSKeyID         = "AKIAMOCKADDONSKEY001"
	testAWSSecretKey     = "mock/AWS+secret+access+key+0123456789"
	testCleanupKeyID     = "AKIAMOCKCLEANUPKEY01"
	testCleanupSecretKey = "mock/cleanup+secret+access+key+012345"
	testRotatorKeyID     = "AKIAMOCKROTATORKEY01"
	testRotatorSecret    = "mock/rotator+secret+key+9876543210"
	testTokenParameter   = "/dynk8s/dev/join-token"
	testAgentBucket      = "dynk8s-dev-agent-0123"
	// The controller's pinned hashes in the fixture (any 64 hex digits).
	testControllerSHA256Arm = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	testControllerSHA256X86 = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	testComponentName       = "addons"
	testBurstTaintKey       = "dynk8s.io/burst"
	testArchTaintKey        = "dynk8s.io/arch"
	testKubeSystem          = "kube-system"
	typeDeployment          = "kubernetes:apps/v1:Deployment"
	typeDaemonSet           = "kubernetes:apps/v1:DaemonSet"
	typeSecret              = "kubernetes:core/v1:Secret"
	typeConfigMap           = "kubernetes:core/v1:ConfigMap"
	typeServiceAccount      = "kubernetes:core/v1:ServiceAccount"
	typeCronJob             = "kubernetes:batch/v1:CronJob"
	typeJob                 = "kubernetes:batch/v1:Job"
	typeClusterRole         = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
	typeClusterBinding      = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
	typeRole                = "kubernetes:rbac.authorization.k8s.io/v1:Role"
	typeRoleBinding         = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
	typeAdmissionPolicy     = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
	typeAdmissionBinding    = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
)

// testAddonsArgs is a dev-like stack: an x86_64 spot pool and an arm64 on-demand pool, both tainted, fuse and the
// termination handler on. The secret inputs are plain values on purpose: the component must make them secret.
func testAddonsArgs() *ClusterAddonsArgs {
	burst := kube.Taint{Key: testBurstTaintKey, Value: "true", Effect: kube.NoSchedule}
	return &ClusterAddonsArgs{
		ClusterName: "dev",
		Region:      "eu-central-1",
		Autoscaler: config.Autoscaler{
			ScaleDownUnneededTime: "10m", Expander: "least-waste", MaxNodeProvisionTime: 15 * time.Minute,
			ScaleDownDelayAfterAdd: 10 * time.Minute, ScaleDownUnreadyTime: time.Hour,
		},
		AutoscalerVersion: kube.Version{Major: 1, Minor: 34, Patch: 5},
		Fuse:              config.Fuse{Enabled: true, Capacity: 5000},
		Cleanup:           config.Cleanup{NotReadyAfter: 10 * time.Minute},
		TerminationHandler: config.TerminationHandler{
			Enabled: true,
		},
		Pools: []config.NodePool{
			{
				Name: "build-x86", Arch: kube.ArchX86_64, InstanceTypes: []string{"m6i.xlarge"}, MaxSize: 5, Spot: true,
				Labels: map[string]string{"workload": "ci"}, Taints: []kube.Taint{burst},
			},
			{
				Name: "build-arm", Arch: kube.ArchArm64, InstanceTypes: []string{"m7g.xlarge"}, MaxSize: 3,
				Taints: []kube.Taint{burst, {Key: testArchTaintKey, Effect: kube.NoSchedule}},
			},
		},
		AWSAccessKeyID:              pulumi.String(testAWSKeyID),
		AWSSecretAccessKey:          pulumi.String(testAWSSecretKey),
		CleanupAWSAccessKeyID:       pulumi.String(testCleanupKeyID),
		CleanupAWSSecretAccessKey:   pulumi.String(testCleanupSecretKey),
		JoinTokenParameter:          testTokenParameter,
		BootstrapTokenTTL:           2 * time.Hour,
		BootstrapTokenRotation:      "1",
		TokenRotatorAccessKeyID:     pulumi.String(testRotatorKeyID),
		TokenRotatorSecretAccessKey: pulumi.String(testRotatorSecret),
		Controller: ControllerDelivery{Bucket: pulumi.String(testAgentBucket), Objects: []ControllerObject{
			{Arch: kube.ArchArm64, Key: "dynk8s-controller/linux-arm64", VersionID: pulumi.String("v-arm64"),
				SHA256: testControllerSHA256Arm},
			{Arch: kube.ArchX86_64, Key: "dynk8s-controller/linux-amd64", VersionID: pulumi.String("v-amd64"),
				SHA256: testControllerSHA256X86},
		}},
	}
}

// mockRun is what one mock run of the component recorded.
type mockRun struct {
	cloud           *mockcloud.Cloud
	autoscalerImage string
}

// runAddons declares the component under the mock engine. args is built inside the program so that any outputs
// belong to that run.
func runAddons(t *testing.T, mkArgs func() *ClusterAddonsArgs) (*mockRun, error) {
	t.Helper()
	run := &mockRun{cloud: mockcloud.New("eu-central-1")}
	err := mockcloud.Run(func(ctx *pulumi.Context) error {
		comp, err := NewClusterAddons(ctx, testComponentName, mkArgs())
		if err != nil {
			return err
		}
		image, _, err := mockcloud.Await(comp.AutoscalerImage)
		if err != nil {
			return err
		}
		run.autoscalerImage, _ = image.(string)
		return nil
	}, "test", mockcloud.StackConfig{}, run.cloud)
	return run, err
}

func mustRunAddons(t *testing.T, mkArgs func() *ClusterAddonsArgs) *mockRun {
	t.Helper()
	run, err := runAddons(t, mkArgs)
	assert.NilError(t, err)
	return run
}

// object returns the plain inputs of the Kubernetes object of type typ whose metadata.name is name, secrets
// revealed; it fails the test when there is not exactly one.
func (r *mockRun) object(t *testing.T, typ, name string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, res := range r.cloud.ByType(typ) {
		m := mockcloud.PlainMap(res.Inputs, true)
		if dig(t, m, "metadata", "name") == name {
			found = append(found, m)
		}
	}
	assert.Equal(t, len(found), 1, "want one %s named %s", typ, name)
	return found[0]
}

// objectNames returns the metadata.name of every object of type typ, sorted.
func (r *mockRun) objectNames(t *testing.T, typ string) []string {
	t.Helper()
	var out []string
	for _, res := range r.cloud.ByType(typ) {
		out = append(out, fmt.Sprint(dig(t, mockcloud.PlainMap(res.Inputs, true), "metadata", "name")))
	}
	sort.Strings(out)
	return out
}

// dig walks plain data by map keys (string) and slice indexes (int); a missing step gives nil.
func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				return nil
			}
			v = s[k]
		default:
			t.Fatalf("bad path element %#v", p)
		}
	}
	return v
}

// plain converts Go test expectations to the shapes PlainMap produces ([]any, map[string]any, float64), so that
// they compare with DeepEqual.
func plain(t *testing.T, v any) any {
	t.Helper()
	b, err := yaml.Marshal(v)
	assert.NilError(t, err)
	var out any
	assert.NilError(t, yaml.Unmarshal(b, &out))
	return out
}

func podSpec(t *testing.T, obj map[string]any) map[string]any {
	t.Helper()
	var spec any
	if dig(t, obj, "kind") == "CronJob" {
		spec = dig(t, obj, "spec", "jobTemplate", "spec", "template", "spec")
	} else {
		spec = dig(t, obj, "spec", "template", "spec")
	}
	m, ok := spec.(map[string]any)
	assert.Assert(t, ok, "no pod spec in %v", dig(t, obj, "metadata", "name"))
	return m
}

// container is the workload's main container: its only one, or the one named after its app.kubernetes.io/name
// label when there are more.
func container(t *testing.T, obj map[string]any) map[string]any {
	t.Helper()
	cs, ok := podSpec(t, obj)["containers"].([]any)
	assert.Assert(t, ok && len(cs) > 0, "no containers")
	if len(cs) == 1 {
		return cs[0].(map[string]any)
	}
	return containerNamed(t, obj, dig(t, obj, "metadata", "labels", "app.kubernetes.io/name").(string))
}

func containerNamed(t *testing.T, obj map[string]any, name string) map[string]any {
	t.Helper()
	for _, c := range podSpec(t, obj)["containers"].([]any) {
		if m := c.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("no container named %s", name)
	return nil
}

// renderManifests renders every Kubernetes object of a run as the plan does (mockcloud.Manifest: secrets as
// mockcloud.Redacted with their keys), keyed by file name.
func renderManifests(t *testing.T, run *mockRun) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, res := range run.cloud.Resources() {
		if !strings.HasPrefix(res.Type, "kubernetes:") {
			continue
		}
		file, doc, err := mockcloud.Manifest(res)
		assert.NilError(t, err)
		_, dup := out[file]
		assert.Assert(t, !dup, "two objects render to %s", file)
		out[file] = string(doc)
	}
	return out
}

// TestAddonsIndexGolden compares the list of declared resources with index.txt, so that an added or dropped object
// shows. The objects themselves are pinned once, by the whole-stack golden (testdata/stacks/*/manifests at the
// repository's root), which renders them through this component.
func TestAddonsIndexGolden(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	var index []string
	for _, res := range run.cloud.Resources() {
		index = append(index, fmt.Sprintf("%s %s parent=%s", res.Type, res.Name, res.Parent))
	}
	sort.Strings(index)
	golden.Assert(t, strings.Join(index, "\n")+"\n", "index.txt")
}

// TestAddonsDeterministic renders the stack twice, the second time with the pools and their taints in reverse order:
// the manifests must be byte-identical, so that a re-run of pulumi up with the same config changes nothing.
func TestAddonsDeterministic(t *testing.T) {
	first := renderManifests(t, mustRunAddons(t, testAddonsArgs))
	second := renderManifests(t, mustRunAddons(t, func() *ClusterAddonsArgs {
		a := testAddonsArgs()
		slices.Reverse(a.Pools)
		for i := range a.Pools {
			slices.Reverse(a.Pools[i].Taints)
		}
		return a
	}))
	assert.DeepEqual(t, first, second)
}

// TestAddonsComponentShape checks the component conventions: the type token, every child parented to the
// component with a name derived from the component's, and every Kubernetes object with an explicit name (no
// auto-naming suffix) in kube-system unless cluster-scoped.
func TestAddonsComponentShape(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	comps := run.cloud.ByType(ClusterAddonsType)
	assert.Equal(t, len(comps), 1)
	assert.Equal(t, comps[0].Name, testComponentName)

	clusterScoped := map[string]bool{typeClusterRole: true, typeClusterBinding: true, typeAdmissionPolicy: true,
		typeAdmissionBinding: true}
	children := 0
	for _, res := range run.cloud.Resources() {
		if res.Type == ClusterAddonsType || strings.HasPrefix(res.Type, "pulumi:providers:") {
			continue
		}
		children++
		assert.Check(t, is.Equal(res.Parent, testComponentName), "%s %s", res.Type, res.Name)
		assert.Check(t, strings.HasPrefix(res.Name, testComponentName+"-"), "%s %s", res.Type, res.Name)
		m := mockcloud.PlainMap(res.Inputs, true)
		name, _ := dig(t, m, "metadata", "name").(string)
		assert.Check(t, name != "", "%s %s has no explicit metadata.name", res.Type, res.Name)
		ns := dig(t, m, "metadata", "namespace")
		if clusterScoped[res.Type] {
			assert.Check(t, is.Nil(ns), "%s %s", res.Type, res.Name)
		} else {
			assert.Check(t, is.Equal(ns, testKubeSystem), "%s %s", res.Type, res.Name)
		}
		assert.Check(t, is.Equal(dig(t, m, "metadata", "labels", "app.kubernetes.io/part-of"), "dynk8s"))
	}
	assert.Assert(t, children > 0)
	assert.Equal(t, run.autoscalerImage, "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5")
}

// TestAddonsAutoscalerDeployment asserts the autoscaler's flags, environment, placement and hardening one by one.
func TestAddonsAutoscalerDeployment(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	dep := run.object(t, typeDeployment, "cluster-autoscaler")
	c := container(t, dep)
	spec := podSpec(t, dep)

	// The golden file pins the whole object; these are the properties it must keep.
	assert.Equal(t, c["image"], "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5", "the resolved version")
	args := c["args"].([]any)
	for _, want := range []string{
		"--cloud-provider=aws",
		"--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/dev",
		"--expander=least-waste", "--scale-down-unneeded-time=10m", "--scale-down-unready-time=1h0m0s",
	} {
		assert.Check(t, slices.Contains(args, any(want)), "args lack %s", want)
	}
	// The key never appears in the pod spec: both halves come from the Secret.
	for _, e := range c["env"].([]any) {
		assert.Check(t, !strings.Contains(fmt.Sprint(e), testAWSKeyID) && !strings.Contains(fmt.Sprint(e), testAWSSecretKey))
	}
	assert.Equal(t, dig(t, c, "securityContext", "runAsNonRoot"), true)
	// Only on the on-prem Nodes the operator labelled, and off every dynk8s pool node.
	assert.DeepEqual(t, spec["affinity"], plain(t, map[string]any{"nodeAffinity": map[string]any{
		"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{
			map[string]any{"matchExpressions": []any{
				map[string]any{"key": kube.LabelPool, "operator": "DoesNotExist"},
				map[string]any{"key": kube.LabelOnPrem, "operator": "Exists"},
			}},
		}},
	}}))
	// The image brings its own CA bundle: no hostPath of the host's certificates.
	assert.Check(t, is.Nil(spec["volumes"]))
	assert.Check(t, is.Nil(c["volumeMounts"]))
	assert.Equal(t, dig(t, dep, "spec", "replicas"), float64(1))
	assert.Equal(t, dig(t, dep, "metadata", "namespace"), testKubeSystem)
	// The pod template changes with the access key, so a rotated key restarts the autoscaler.
	checksum, _ := dig(t, dep, "spec", "template", "metadata", "annotations", awsKeyChecksumAnnotation).(string)
	assert.Equal(t, len(checksum), 16)
	assert.Check(t, !strings.Contains(checksum, testAWSKeyID))

	rotated := renderManifests(t, mustRunAddons(t, func() *ClusterAddonsArgs {
		a := testAddonsArgs()
		a.AWSAccessKeyID = pulumi.String("AKIAMOCKADDONSKEY002")
		return a
	}))
	const depFile = "deployment-kube-system-cluster-autoscaler.yaml"
	assert.Assert(t, rotated[depFile] != "", "no %s rendered", depFile)
	assert.Check(t, rotated[depFile] != renderManifests(t, run)[depFile], "a new key id did not change the Deployment")
}

// TestAddonsAutoscalerCredentials checks the Secret with the autoscaler's AWS key: the two keys upstream documents,
// marked secret in the recorded inputs even though the test passes them as plain values.
func TestAddonsAutoscalerCredentials(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	secrets := run.cloud.ByType(typeSecret)
	var creds *mockcloud.Resource
	for i := range secrets {
		if secrets[i].Name == testComponentName+"-autoscaler-credentials" {
			creds = &secrets[i]
		}
	}
	assert.Assert(t, creds != nil)
	assert.Check(t, creds.Inputs["stringData"].IsSecret(), "stringData is not a secret input")
	assert.Check(t, slices.Contains(creds.AdditionalSecretOutputs, "stringData"))
	obj := run.object(t, typeSecret, "cluster-autoscaler-aws-credentials")
	assert.Equal(t, obj["type"], "Opaque")
	assert.DeepEqual(t, obj["stringData"], map[string]any{
		"aws_access_key_id":     testAWSKeyID,
		"aws_secret_access_key": testAWSSecretKey,
	})
}

// fixtureSecrets are the secret inputs of the fixture, the one list the scan reads: every pulumi.StringInput field of
// ClusterAddonsArgs is a credential (key ids and secret keys alike), so a credential added to the args is scanned
// without a test naming it.
func fixtureSecrets(t *testing.T, a *ClusterAddonsArgs) map[string]string {
	t.Helper()
	out := map[string]string{}
	v := reflect.ValueOf(a).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type != reflect.TypeFor[pulumi.StringInput]() || v.Field(i).IsNil() {
			continue
		}
		plain, ok := v.Field(i).Interface().(pulumi.String)
		assert.Assert(t, ok, "%s is not a plain value in the fixture", f.Name)
		out[f.Name] = string(plain)
	}
	return out
}

// TestAddonsSecretsStaySecret scans every recorded input, redacted, for the secret values of the fixture
// (fixtureSecrets): none may appear anywhere outside a secret, whether the component gets them plain or as
// secrets.
func TestAddonsSecretsStaySecret(t *testing.T) {
	secrets := fixtureSecrets(t, testAddonsArgs())
	for _, want := range []string{testAWSKeyID, testAWSSecretKey, testCleanupKeyID, testCleanupSecretKey,
		testRotatorKeyID, testRotatorSecret} {
		assert.Check(t, slices.Contains(slices.Collect(maps.Values(secrets)), want), "%s is not scanned", want)
	}
	for _, name := range []string{"plain inputs", "secret inputs"} {
		t.Run(name, func(t *testing.T) {
			run := mustRunAddons(t, func() *ClusterAddonsArgs {
				a := testAddonsArgs()
				if name == "secret inputs" {
					v := reflect.ValueOf(a).Elem()
					for field, value := range secrets {
						v.FieldByName(field).Set(reflect.ValueOf(pulumi.ToSecret(pulumi.String(value))))
					}
				}
				return a
			})
			for _, res := range run.cloud.Resources() {
				for k, v := range res.Inputs {
					redacted, err := yaml.Marshal(mockcloud.Plain(v, false))
					assert.NilError(t, err)
					for field, secret := range secrets {
						assert.Check(t, !strings.Contains(string(redacted), secret),
							"%s %s: %s shows a secret value (%s)", res.Type, res.Name, k, field)
					}
				}
			}
		})
	}
}

// TestAddonsSkipAwait checks that the skipAwait annotation is on every workload when asked for, and on nothing
// otherwise: production objects must let the provider wait for readiness.
func TestAddonsSkipAwait(t *testing.T) {
	workloads := map[string]bool{typeDeployment: true, typeDaemonSet: true, typeJob: true}
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprint(skip), func(t *testing.T) {
			run := mustRunAddons(t, func() *ClusterAddonsArgs {
				a := testAddonsArgs()
				a.SkipAwait = skip
				return a
			})
			for _, res := range run.cloud.Resources() {
				if !strings.HasPrefix(res.Type, "kubernetes:") || strings.HasPrefix(res.Type, "pulumi:") {
					continue
				}
				got := dig(t, mockcloud.PlainMap(res.Inputs, true), "metadata", "annotations", skipAwaitAnnotation)
				if skip && workloads[res.Type] {
					assert.Check(t, is.Equal(got, "true"), "%s %s", res.Type, res.Name)
				} else {
					assert.Check(t, is.Nil(got), "%s %s", res.Type, res.Name)
				}
			}
		})
	}
}

func TestAddonsArgsValidation(t *testing.T) {
	t.Run("nil", func(t *testing.T) {
		_, err := runAddons(t, func() *ClusterAddonsArgs { return nil })
		assert.ErrorContains(t, err, "cluster addons: args are required")
	})
	t.Run("empty", func(t *testing.T) {
		_, err := runAddons(t, func() *ClusterAddonsArgs { return &ClusterAddonsArgs{} })
		for _, want := range []string{
			"missing ClusterName", "missing Region", "missing AutoscalerVersion", "missing Autoscaler.Expander",
			"missing Autoscaler.ScaleDownUnneededTime", "invalid Autoscaler.MaxNodeProvisionTime 0s",
			"invalid Cleanup.NotReadyAfter 0s", "invalid Autoscaler.ScaleDownUnreadyTime 0s", "missing AWSAccessKeyID",
			"missing AWSSecretAccessKey", "missing CleanupAWSAccessKeyID", "missing CleanupAWSSecretAccessKey",
			"missing TokenRotatorAccessKeyID", "missing TokenRotatorSecretAccessKey",
			"missing JoinTokenParameter", "missing BootstrapTokenRotation", "invalid BootstrapTokenTTL 0s",
		} {
			assert.ErrorContains(t, err, want)
		}
	})
	t.Run("fuse without capacity", func(t *testing.T) {
		_, err := runAddons(t, func() *ClusterAddonsArgs {
			a := testAddonsArgs()
			a.Fuse.Capacity = 0
			return a
		})
		assert.ErrorContains(t, err, "invalid Fuse.Capacity 0")
	})
	t.Run("unknown arch", func(t *testing.T) {
		_, err := runAddons(t, func() *ClusterAddonsArgs {
			a := testAddonsArgs()
			a.Pools[0].Arch = "riscv64"
			return a
		})
		assert.ErrorContains(t, err, `no fuse device plugin image for pool arch "riscv64"`)
	})
}

// TestFuseHasNoAPIAccess: the plugin's pods carry no ServiceAccount token and the plugin has no role: a pool node
// holds no token that may change a Node (the controller lifts the startup taint).
func TestFuseHasNoAPIAccess(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	for _, name := range run.objectNames(t, typeDaemonSet) {
		if !strings.HasPrefix(name, fuseComponent) {
			continue
		}
		pod := podSpec(t, run.object(t, typeDaemonSet, name))
		assert.Check(t, is.Equal(pod["automountServiceAccountToken"], false), name)
		assert.Check(t, pod["serviceAccountName"] == nil, "%s runs as %v", name, pod["serviceAccountName"])
		assert.Check(t, is.Len(pod["containers"], 1), "%s: only the plugin", name)
	}
	for _, typ := range []string{typeClusterRole, typeServiceAccount} {
		assert.Check(t, !slices.Contains(run.objectNames(t, typ), fuseComponent), "a %s for the plugin", typ)
	}
}

// TestPoolDaemonSetsAsDeclared: the DaemonSets the component declares on pool nodes are the ones
// config.PoolDaemonSets describes (cmd/explain counts those on a pool's template node without a cluster): the same
// names, node selectors, pool affinity, tolerations and requests.
func TestPoolDaemonSetsAsDeclared(t *testing.T) {
	for name, change := range map[string]func(*ClusterAddonsArgs){
		"fuse and the termination handler": func(*ClusterAddonsArgs) {},
		"no termination handler":           func(a *ClusterAddonsArgs) { a.TerminationHandler.Enabled = false },
		"no fuse, one arch": func(a *ClusterAddonsArgs) {
			a.Fuse.Enabled, a.Pools = false, a.Pools[:1]
		},
	} {
		t.Run(name, func(t *testing.T) {
			mk := func() *ClusterAddonsArgs {
				a := testAddonsArgs()
				change(a)
				return a
			}
			a := mk()
			cfg := &config.Config{NodePools: a.Pools, Fuse: a.Fuse, TerminationHandler: a.TerminationHandler}
			run := mustRunAddons(t, mk)
			var want []string
			for _, ds := range cfg.PoolDaemonSets() {
				want = append(want, ds.Name)
				pod := podSpec(t, run.object(t, typeDaemonSet, ds.Name))
				assert.Check(t, is.DeepEqual(pod["nodeSelector"], plain(t, ds.NodeSelector)), ds.Name)
				assert.Check(t, is.DeepEqual(dig(t, pod, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
					"nodeSelectorTerms"), plain(t, []any{map[string]any{"matchExpressions": []any{
					map[string]any{"key": kube.LabelPool, "operator": "Exists"}}}})), ds.Name)
				var tolerations []any
				for _, taint := range ds.Tolerates {
					tol := map[string]any{"key": taint.Key, "effect": string(taint.Effect), "operator": "Exists"}
					if taint.Value != "" {
						tol["operator"], tol["value"] = "Equal", taint.Value
					}
					tolerations = append(tolerations, tol)
				}
				assert.Check(t, is.DeepEqual(pod["tolerations"], plain(t, tolerations)), ds.Name)
				assert.Check(t, is.DeepEqual(dig(t, pod, "containers", 0, "resources"), plain(t, map[string]any{
					"requests": ds.Requests.Quantities(), "limits": ds.Limits.Quantities()})), ds.Name)
			}
			assert.DeepEqual(t, run.objectNames(t, typeDaemonSet), want)
		})
	}
}

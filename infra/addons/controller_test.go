package addons

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

const (
	typePDB     = "kubernetes:policy/v1:PodDisruptionBudget"
	typeService = "kubernetes:core/v1:Service"
)

// TestAddonsController: the controller runs as operators expect a controller to: two replicas (one leader, a Lease
// its namespaced role may hold) behind a PodDisruptionBudget, probes and metrics on the port the Service names, on an
// on-prem node only, from the pinned binary its init container fetches with the nodes' bootstrap and the cleanup
// user's key, with the flags of the config, and a new rotation value rolls it.
func TestAddonsController(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	d := run.object(t, typeDeployment, ControllerName)
	assert.Equal(t, dig(t, d, "spec", "replicas"), float64(2))
	assert.Equal(t, dig(t, d, "spec", "strategy", "rollingUpdate", "maxUnavailable"), float64(0))
	assert.Equal(t, dig(t, d, "spec", "template", "metadata", "annotations", tokenRotationAnnotation), "1")
	pod := podSpec(t, d)
	assert.Equal(t, pod["serviceAccountName"], ControllerName)
	assert.Equal(t, pod["priorityClassName"], "system-cluster-critical")
	assert.DeepEqual(t, dig(t, pod, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
		"nodeSelectorTerms", 0, "matchExpressions"), []any{
		map[string]any{"key": kube.LabelPool, "operator": "DoesNotExist"},
		map[string]any{"key": kube.LabelOnPrem, "operator": "Exists"},
	})
	assert.Equal(t, dig(t, pod, "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0,
		"podAffinityTerm", "topologyKey"), kube.LabelHostname)

	fetch := dig(t, pod, "initContainers", 0).(map[string]any)
	assert.DeepEqual(t, fetch["command"], []any{"/bin/bash", controllerBootstrapDir + "/" + controllerBootstrapKey})
	assert.DeepEqual(t, envOf(t, fetch), map[string]string{
		"DYNK8S_AGENT_BUCKET":           testAgentBucket,
		"DYNK8S_AGENT_DEADLINE_SECONDS": "120",
		"DYNK8S_AGENT_DEST":             controllerBinDir + "/" + ControllerName,
		"DYNK8S_AWS_REGION":             "eu-central-1",
		"DYNK8S_S3_ENDPOINT":            "https://s3.eu-central-1.amazonaws.com",
		"AWS_ACCESS_KEY_ID":             "secret:" + cleanupCredsName + "/aws_access_key_id",
		"AWS_SECRET_ACCESS_KEY":         "secret:" + cleanupCredsName + "/aws_secret_access_key",
		"DYNK8S_AGENT_KEY_ARM64":        "dynk8s-controller/linux-arm64",
		"DYNK8S_AGENT_VERSION_ID_ARM64": "v-arm64",
		"DYNK8S_AGENT_SHA256_ARM64":     testControllerSHA256Arm,
		"DYNK8S_AGENT_KEY_AMD64":        "dynk8s-controller/linux-amd64",
		"DYNK8S_AGENT_VERSION_ID_AMD64": "v-amd64",
		"DYNK8S_AGENT_SHA256_AMD64":     testControllerSHA256X86,
	})
	assert.Equal(t, dig(t, run.object(t, typeConfigMap, ControllerName+"-bootstrap"), "data", controllerBootstrapKey),
		cloudinit.AgentBootstrap(), "the nodes' bootstrap, as it is")

	c := containerNamed(t, d, "controller")
	assert.DeepEqual(t, c["command"], []any{controllerBinDir + "/" + ControllerName})
	assert.DeepEqual(t, c["args"], []any{
		"--region=eu-central-1", "--cluster=dev", "--pools=build-arm,build-x86",
		"--bootstrap-group=" + NodeBootstrapGroup, "--approval-record=kube-system/" + ApprovalRecordName,
		"--token-parameter=" + testTokenParameter, "--token-kms-key=" + DefaultParameterKey, "--token-ttl=2h0m0s",
		"--not-ready-after=10m0s", "--loops=approve,rotate,cleanup,untaint,cache", "--addr=:8080",
	})
	assert.DeepEqual(t, envOf(t, c), map[string]string{
		"POD_NAME":                     "field:metadata.name",
		"AWS_ACCESS_KEY_ID":            "secret:" + cleanupCredsName + "/aws_access_key_id",
		"AWS_SECRET_ACCESS_KEY":        "secret:" + cleanupCredsName + "/aws_secret_access_key",
		"DYNK8S_SSM_ACCESS_KEY_ID":     "secret:" + TokenRotatorCredentialsName + "/aws_access_key_id",
		"DYNK8S_SSM_SECRET_ACCESS_KEY": "secret:" + TokenRotatorCredentialsName + "/aws_secret_access_key",
	})
	assert.Equal(t, dig(t, c, "livenessProbe", "httpGet", "path"), "/healthz")
	assert.Equal(t, dig(t, c, "readinessProbe", "httpGet", "path"), "/readyz")
	assert.Equal(t, dig(t, c, "ports", 0, "containerPort"), float64(ControllerMetricsPort))
	for _, ctr := range []map[string]any{fetch, c} {
		assert.Equal(t, dig(t, ctr, "securityContext", "readOnlyRootFilesystem"), true)
		assert.Equal(t, dig(t, ctr, "securityContext", "runAsNonRoot"), true)
		assert.Equal(t, dig(t, ctr, "securityContext", "allowPrivilegeEscalation"), false)
	}
	assert.Equal(t, dig(t, c, "volumeMounts", 0, "readOnly"), true, "the controller cannot rewrite its binary")

	pdb := run.object(t, typePDB, ControllerName)
	assert.Equal(t, dig(t, pdb, "spec", "minAvailable"), float64(1))
	svc := run.object(t, typeService, ControllerName+"-metrics")
	assert.Equal(t, dig(t, svc, "spec", "ports", 0, "port"), float64(ControllerMetricsPort))

	// Without fuse, no untaint loop.
	noFuse := testAddonsArgs()
	noFuse.Fuse.Enabled = false
	args := dig(t, containerNamed(t, mustRunAddons(t, func() *ClusterAddonsArgs { return noFuse }).object(t,
		typeDeployment, ControllerName), "controller"), "args").([]any)
	assert.Check(t, slices.Contains(args, any("--loops=approve,rotate,cleanup,cache")), "%v", args)

	// With a sleeping gateway, the wake-up: its loop, the gateway and the groups, sorted.
	wakes := testAddonsArgs()
	wakes.GatewayInstanceID = pulumi.String("i-0123456789abcdef0")
	wakes.GroupNames = pulumi.StringMap{"build-x86": pulumi.String("dev-build-x86-2"), "build-arm": pulumi.String("dev-build-arm-1")}
	args = dig(t, containerNamed(t, mustRunAddons(t, func() *ClusterAddonsArgs { return wakes }).object(t,
		typeDeployment, ControllerName), "controller"), "args").([]any)
	for _, want := range []string{"--loops=approve,rotate,cleanup,untaint,wake,cache", "--wake-gateway=i-0123456789abcdef0",
		"--wake-groups=dev-build-arm-1,dev-build-x86-2"} {
		assert.Check(t, slices.Contains(args, any(want)), "%s not in %v", want, args)
	}

	// With a warm pool, the warm pools' loop, for that pool's group alone.
	warm := testAddonsArgs()
	warm.Pools[1].WarmPool = &config.WarmPool{Size: 1, State: config.WarmStopped}
	warm.GroupNames = pulumi.StringMap{"build-x86": pulumi.String("dev-build-x86-2"), "build-arm": pulumi.String("dev-build-arm-1")}
	args = dig(t, containerNamed(t, mustRunAddons(t, func() *ClusterAddonsArgs { return warm }).object(t,
		typeDeployment, ControllerName), "controller"), "args").([]any)
	for _, want := range []string{"--loops=approve,rotate,cleanup,untaint,warm,cache", "--warm-groups=dev-build-arm-1"} {
		assert.Check(t, slices.Contains(args, any(want)), "%s not in %v", want, args)
	}

	// With a pool's cache, the cache loop keeps that pool's volumes: at most its maxSize by default, for its idle
	// days; without, the loop runs all the same (a cache turned off leaves volumes to delete) with no --cache-pools.
	cached := testAddonsArgs()
	cached.Pools[0].Cache = &config.Cache{SizeGiB: 100, IOPS: 3000, Throughput: 125, MountPath: "/var/lib/dynk8s-cache",
		MaxIdleDays: 7}
	args = dig(t, containerNamed(t, mustRunAddons(t, func() *ClusterAddonsArgs { return cached }).object(t,
		typeDeployment, ControllerName), "controller"), "args").([]any)
	want := fmt.Sprintf("--cache-pools=%s:%d:7", cached.Pools[0].Name, cached.Pools[0].MaxSize)
	assert.Check(t, slices.Contains(args, any(want)), "%s not in %v", want, args)
	assert.Check(t, !slices.ContainsFunc(c["args"].([]any), func(a any) bool { return strings.HasPrefix(a.(string), "--cache-pools") }))

	// The old script workloads are gone.
	for _, name := range []string{ApproverName, TokenRotatorName, cleanupName} {
		for _, typ := range []string{typeDeployment, typeCronJob, typeJob, typeConfigMap, typeServiceAccount} {
			assert.Check(t, !slices.Contains(run.objectNames(t, typ), name), "a %s %s", typ, name)
		}
	}
}

// TestControllerRBAC: exactly what the loops do, cluster-wide and in kube-system. No get, list or watch of Secrets
// (that would read every Secret of kube-system), the record and the Lease by name.
func TestControllerRBAC(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	assert.DeepEqual(t, run.object(t, typeClusterRole, ControllerName)["rules"], plain(t, []any{
		map[string]any{"apiGroups": []string{"certificates.k8s.io"}, "resources": []string{"certificatesigningrequests"},
			"verbs": []string{"get", "list", "watch"}},
		map[string]any{"apiGroups": []string{"certificates.k8s.io"},
			"resources": []string{"certificatesigningrequests/approval"}, "verbs": []string{"update"}},
		map[string]any{"apiGroups": []string{"certificates.k8s.io"}, "resources": []string{"signers"},
			"resourceNames": []string{KubeletClientSigner}, "verbs": []string{"approve"}},
		map[string]any{"apiGroups": []string{""}, "resources": []string{"nodes"},
			"verbs": []string{"get", "list", "watch", "update", "delete"}},
		map[string]any{"apiGroups": []string{""}, "resources": []string{"events"}, "verbs": []string{"create", "patch"}},
	}))
	assert.DeepEqual(t, run.object(t, typeRole, ControllerName)["rules"], plain(t, []any{
		map[string]any{"apiGroups": []string{""}, "resources": []string{"secrets"}, "verbs": []string{"create"}},
		map[string]any{"apiGroups": []string{""}, "resources": []string{"configmaps"}, "verbs": []string{"create"}},
		map[string]any{"apiGroups": []string{""}, "resources": []string{"configmaps"},
			"resourceNames": []string{ApprovalRecordName}, "verbs": []string{"get", "update"}},
		map[string]any{"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"},
			"verbs": []string{"create"}},
		map[string]any{"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"},
			"resourceNames": []string{ControllerName}, "verbs": []string{"get", "update"}},
	}))

	// With the wake-up, the autoscaler's status too, by name.
	wakes := testAddonsArgs()
	wakes.GatewayInstanceID = pulumi.String("i-0123456789abcdef0")
	wakes.GroupNames = pulumi.StringMap{"build-x86": pulumi.String("dev-build-x86-2")}
	rules := mustRunAddons(t, func() *ClusterAddonsArgs { return wakes }).object(t, typeRole, ControllerName)["rules"].([]any)
	assert.DeepEqual(t, rules[len(rules)-1], plain(t, map[string]any{"apiGroups": []string{""},
		"resources": []string{"configmaps"}, "resourceNames": []string{"cluster-autoscaler-status"},
		"verbs": []string{"get", "list", "watch"}}))
}

// TestControllerNodePolicy: admission narrows the controller's Node rights to its two jobs: an update removes the
// fuse startup taint and nothing else, a delete is of a pool node that is not Ready. The e2e TestControllerNodePolicy
// proves them against the real API server.
func TestControllerNodePolicy(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	policy := run.object(t, typeAdmissionPolicy, controllerNodePolicyName)
	assert.Equal(t, dig(t, policy, "spec", "matchConditions", 0, "expression"),
		"request.userInfo.username == 'system:serviceaccount:kube-system:"+ControllerName+"'")
	assert.DeepEqual(t, dig(t, policy, "spec", "matchConstraints", "resourceRules", 0, "operations"),
		[]any{"UPDATE", "DELETE"})
	update := dig(t, policy, "spec", "validations", 0, "expression").(string)
	assert.Check(t, strings.HasPrefix(update, "request.operation != 'UPDATE' || ("))
	assert.Check(t, is.Contains(update, ".filter(t, t.key != '"+kube.FuseStartupTaint.Key+"')"))
	del := dig(t, policy, "spec", "validations", 1, "expression").(string)
	assert.Check(t, is.Contains(del, "'"+kube.LabelPool+"' in oldObject.metadata.labels"))
	assert.Check(t, is.Contains(del, "c.type == 'Ready' && c.status == 'True'"))
}

// TestOwnNodePolicies: the termination handler's ServiceAccount is held to the Node its pod runs on (the token's
// node-name claim). The e2e TestDaemonSetTokensActOnTheirOwnNode proves it against the real API server with a bound
// token.
func TestOwnNodePolicies(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	policy := run.object(t, typeAdmissionPolicy, TerminationHandlerNodePolicyName)
	assert.Equal(t, dig(t, policy, "spec", "matchConditions", 0, "expression"),
		"request.userInfo.username == 'system:serviceaccount:kube-system:"+nthName+"'")
	assert.Equal(t, dig(t, policy, "spec", "validations", 0, "expression"),
		"'authentication.kubernetes.io/node-name' in request.userInfo.extra && object.metadata.name == "+
			"request.userInfo.extra['authentication.kubernetes.io/node-name'][0]")
	assert.DeepEqual(t, dig(t, policy, "spec", "matchConstraints", "resourceRules", 0, "operations"),
		[]any{"UPDATE", "DELETE"})
}

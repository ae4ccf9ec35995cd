package addons

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestAddonsTokenRotator checks what the controller's rotation loop writes under: the policy that holds the Secrets
// its ServiceAccount creates to expiring join tokens of the node group, and the token writer's AWS key in a Secret
// the controller's pod references.
func TestAddonsTokenRotator(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	for _, typ := range []string{typeRole, typeClusterRole, typeServiceAccount, typeCronJob, typeJob, typeConfigMap} {
		assert.Check(t, !slices.Contains(run.objectNames(t, typ), TokenRotatorName), "a %s of the old rotator", typ)
	}
	// What RBAC cannot say, admission does: the controller's Secrets must be expiring bootstrap tokens.
	policy := run.object(t, typeAdmissionPolicy, TokenRotatorName)
	assert.Equal(t, dig(t, policy, "spec", "matchConditions", 0, "expression"),
		"request.userInfo.username == 'system:serviceaccount:kube-system:"+ControllerName+"'")
	assert.Equal(t, dig(t, policy, "spec", "failurePolicy"), "Fail")
	// Each rule by its own text, not by the slice that declares it: dropping or weakening one (the expiration rule
	// above all, the backstop against a token that never expires) fails here by name. The real API server's verdict
	// on them is the e2e test's (TestTokenRotator, checkRotatorAdmission). Secret data is base64 text in CEL: the
	// group rule compares the base64 of the node group, the group the controller writes (cluster/internal/rotate).
	group := base64.StdEncoding.EncodeToString([]byte("system:bootstrappers:dynk8s:pool-nodes"))
	assert.DeepEqual(t, dig(t, policy, "spec", "validations"), []any{
		map[string]any{"expression": "object.type == 'bootstrap.kubernetes.io/token'",
			"message": "the join token rotator may create bootstrap token Secrets only"},
		map[string]any{"expression": "object.metadata.name.startsWith('bootstrap-token-')",
			"message": "a bootstrap token Secret is named bootstrap-token-<id>"},
		// The test args' TTL is 2h; 10 minutes of slack.
		map[string]any{"expression": "has(object.data) && 'expiration' in object.data && " +
			"size(object.data['expiration']) == 28 && timestamp(variables.expiration) <= " +
			"timestamp(object.metadata.creationTimestamp) + duration('7800s')",
			"message": "a join token expires, as a UTC RFC 3339 time in whole seconds, within 2h10m0s of its creation"},
		map[string]any{"expression": "has(object.data) && 'auth-extra-groups' in object.data && " +
			"object.data['auth-extra-groups'] == '" + group + "'",
			"message": "a join token authenticates with exactly the group system:bootstrappers:dynk8s:pool-nodes"},
	})
	// The decoding tables, against encoding/base64: the digit of value v is the first character of the byte v<<2.
	vars := dig(t, policy, "spec", "variables").([]any)
	names := make([]string, len(vars))
	for i, v := range vars {
		names[i] = v.(map[string]any)["name"].(string)
	}
	assert.DeepEqual(t, names, []string{"expirationBase64", "base64Digits", "expirationBits", "expiration"})
	digits := vars[1].(map[string]any)["expression"].(string)
	for v := range 64 {
		c := base64.StdEncoding.EncodeToString([]byte{byte(v << 2)})[0]
		assert.Check(t, is.Contains(digits, fmt.Sprintf("'%c': %d,", c, v)), "base64 digit %d", v)
	}
	vap := run.object(t, typeAdmissionBinding, TokenRotatorName)
	assert.Equal(t, dig(t, vap, "spec", "policyName"), TokenRotatorName)
	assert.DeepEqual(t, dig(t, vap, "spec", "validationActions"), []any{"Deny"})

	creds := run.object(t, typeSecret, TokenRotatorCredentialsName)
	assert.DeepEqual(t, creds["stringData"], map[string]any{
		"aws_access_key_id": testRotatorKeyID, "aws_secret_access_key": testRotatorSecret,
	})
	for _, r := range run.cloud.ByType(typeSecret) {
		if r.Name == testComponentName+"-token-rotator-credentials" {
			assert.Check(t, r.Inputs["stringData"].IsSecret(), "stringData is not a secret input")
		}
	}
}

// TestAWSEndpoint: the controller's init container fetches from S3 in its region's partition, so a China region's
// download goes to amazonaws.com.cn rather than to a domain where that region does not exist. Config refuses the
// isolated partitions' regions, whose domains are their own. (The controller's own SDK clients resolve theirs.)
func TestAWSEndpoint(t *testing.T) {
	for region, want := range map[string]string{
		"cn-north-1":    "https://s3.cn-north-1.amazonaws.com.cn",
		"us-gov-west-1": "https://s3.us-gov-west-1.amazonaws.com",
		"eu-central-1":  "https://s3.eu-central-1.amazonaws.com",
	} {
		args := testAddonsArgs()
		args.Region = region
		run := mustRunAddons(t, func() *ClusterAddonsArgs { return args })
		fetch := dig(t, podSpec(t, run.object(t, typeDeployment, ControllerName)), "initContainers", 0).(map[string]any)
		assert.Equal(t, envOf(t, fetch)["DYNK8S_S3_ENDPOINT"], want, region)
	}
}

// envOf is a container's environment: plain values as they are, Secret references as secret:<name>/<key>, field
// references as field:<path>.
func envOf(t *testing.T, c map[string]any) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c["env"].([]any) {
		e := e.(map[string]any)
		switch {
		case e["value"] != nil:
			env[e["name"].(string)] = e["value"].(string)
		case dig(t, e, "valueFrom").(map[string]any)["secretKeyRef"] != nil:
			ref := dig(t, e, "valueFrom", "secretKeyRef").(map[string]any)
			env[e["name"].(string)] = "secret:" + ref["name"].(string) + "/" + ref["key"].(string)
		default:
			env[e["name"].(string)] = "field:" + dig(t, e, "valueFrom", "fieldRef", "fieldPath").(string)
		}
	}
	return env
}

// TestNodeAdmission: kubelets (system:nodes) are held to the pool label: no change of it on UPDATE, a stack's pool
// (sorted, whatever the pools' order) on CREATE, and, only with OnPremNodes, one of those names for a Node without
// it; on nodes and on nodes/status alike, the two resources the Node authorizer lets a kubelet write. The e2e
// TestTokenRotator proves each rule against the real API server.
func TestNodeAdmission(t *testing.T) {
	rules := func(a *ClusterAddonsArgs) (exprs []string, messages string) {
		run := mustRunAddons(t, func() *ClusterAddonsArgs { return a })
		policy := run.object(t, typeAdmissionPolicy, NodeAdmissionName)
		assert.Equal(t, dig(t, policy, "spec", "matchConditions", 0, "expression"), "'system:nodes' in request.userInfo.groups")
		assert.DeepEqual(t, dig(t, policy, "spec", "matchConstraints", "resourceRules", 0, "resources"), []any{"nodes", "nodes/status"})
		assert.Equal(t, dig(t, run.object(t, typeAdmissionBinding, NodeAdmissionName), "spec", "validationActions", 0), "Deny")
		for _, v := range dig(t, policy, "spec", "validations").([]any) {
			exprs = append(exprs, v.(map[string]any)["expression"].(string))
			messages += v.(map[string]any)["message"].(string) + "\n"
		}
		return exprs, messages
	}
	a := testAddonsArgs()
	slices.Reverse(a.Pools)
	exprs, _ := rules(a)
	assert.Equal(t, len(exprs), 4, "without OnPremNodes, an unlabelled Node is judged by name only if it is an instance id")
	names := make([]string, len(a.Pools))
	for i, p := range a.Pools {
		names[i] = p.Name
	}
	slices.Sort(names)
	assert.Check(t, is.Contains(exprs[1], "object.metadata.labels['dynk8s.io/pool'] in "+celList(names)))
	assert.Check(t, strings.HasPrefix(exprs[0], "request.operation != 'UPDATE' || "))
	assert.Check(t, is.Contains(exprs[2], "object.metadata.name.matches('^i-[0-9a-f]{8}([0-9a-f]{9})?$')"),
		"a pool Node is named after its instance")
	assert.Check(t, is.Contains(exprs[3], "!object.metadata.name.matches('^i-[0-9a-f]{8}([0-9a-f]{9})?$')"),
		"an unlabelled Node is not named after an instance")

	a = testAddonsArgs()
	a.OnPremNodes = []string{"cp-1", "worker-1"}
	exprs, messages := rules(a)
	assert.Equal(t, len(exprs), 5)
	assert.Check(t, is.Contains(exprs[4], "object.metadata.name in ['cp-1', 'worker-1']"))
	assert.Check(t, is.Contains(messages, "add its name there first"))
}

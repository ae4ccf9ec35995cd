package addons

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/robfig/cron/v3"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
)

// TestAddonsTokenRotator checks the rotator's objects: a Role that may create Secrets in kube-system and nothing
// else (and no cluster-wide role at all), the AWS key in a Secret the pods reference, the script, and the CronJob and
// install Job running the same pod with the parameter, region and TTL of the config.
func TestAddonsTokenRotator(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)

	assert.DeepEqual(t, run.object(t, typeRole, TokenRotatorName)["rules"], plain(t, []any{map[string]any{
		"apiGroups": []string{""}, "resources": []string{"secrets"}, "verbs": []string{"create"},
	}}))
	for _, cr := range run.cloud.ByType(typeClusterRole) {
		assert.Check(t, !strings.Contains(cr.Name, "token-rotator"), "a cluster role for the rotator: %s", cr.Name)
	}
	// What RBAC cannot say, admission does: the rotator's Secrets must be expiring bootstrap tokens.
	policy := run.object(t, typeAdmissionPolicy, TokenRotatorName)
	assert.Equal(t, dig(t, policy, "spec", "matchConditions", 0, "expression"),
		"request.userInfo.username == 'system:serviceaccount:kube-system:"+TokenRotatorName+"'")
	assert.Equal(t, dig(t, policy, "spec", "failurePolicy"), "Fail")
	// Each rule by its own text, not by the slice that declares it: dropping or weakening one (the expiration rule
	// above all, the backstop against a token that never expires) fails here by name. The real API server's verdict
	// on them is the e2e test's (TestTokenRotator, checkRotatorAdmission). Secret data is base64 text in CEL: the
	// group rule compares the base64 of kubeadm's node group, the group the script writes.
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
	assert.Check(t, is.Contains(rotateTokenScript, `"auth-extra-groups": "`+NodeBootstrapGroup+`"`),
		"the script issues tokens of another group than the policy admits")
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
	assert.Check(t, is.Contains(rotateTokenScript, `$t | todate`), "the script's expiration is no longer jq's todate form")
	vap := run.object(t, typeAdmissionBinding, TokenRotatorName)
	assert.Equal(t, dig(t, vap, "spec", "policyName"), TokenRotatorName)
	assert.DeepEqual(t, dig(t, vap, "spec", "validationActions"), []any{"Deny"})

	binding := run.object(t, typeRoleBinding, TokenRotatorName)
	assert.DeepEqual(t, binding["roleRef"], map[string]any{
		"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TokenRotatorName,
	})
	assert.DeepEqual(t, binding["subjects"], []any{map[string]any{
		"kind": "ServiceAccount", "name": TokenRotatorName, "namespace": testKubeSystem,
	}})
	run.object(t, typeServiceAccount, TokenRotatorName)

	creds := run.object(t, typeSecret, TokenRotatorCredentialsName)
	assert.DeepEqual(t, creds["stringData"], map[string]any{
		"aws_access_key_id": testRotatorKeyID, "aws_secret_access_key": testRotatorSecret,
	})
	for _, r := range run.cloud.ByType(typeSecret) {
		if r.Name == testComponentName+"-token-rotator-credentials" {
			assert.Check(t, r.Inputs["stringData"].IsSecret(), "stringData is not a secret input")
		}
	}
	assert.Equal(t, dig(t, run.object(t, typeConfigMap, TokenRotatorName), "data", tokenRotatorScriptKey),
		rotateTokenScript)

	cronJob := run.object(t, typeCronJob, TokenRotatorName)
	assert.Equal(t, dig(t, cronJob, "spec", "schedule"), "*/40 * * * *", "a third of the 2h TTL")
	assert.Equal(t, dig(t, cronJob, "spec", "timeZone"), "Etc/UTC")
	assert.Equal(t, dig(t, cronJob, "spec", "concurrencyPolicy"), "Forbid")
	assert.Equal(t, run.rotatorJobName, TokenRotatorJobName(testAddonsArgs()))
	job := run.object(t, typeJob, run.rotatorJobName)
	cronPod := dig(t, cronJob, "spec", "jobTemplate", "spec", "template", "spec")
	assert.DeepEqual(t, dig(t, job, "spec", "template", "spec"), cronPod)
	assert.DeepEqual(t, dig(t, job, "spec", "backoffLimit"), dig(t, cronJob, "spec", "jobTemplate", "spec",
		"backoffLimit"))

	pod := cronPod.(map[string]any)
	assert.Equal(t, pod["serviceAccountName"], TokenRotatorName)
	assert.Equal(t, pod["restartPolicy"], "Never")
	c := containerNamed(t, map[string]any{"spec": map[string]any{"template": map[string]any{"spec": pod}}}, "rotate")
	assert.DeepEqual(t, c["command"], []any{"/bin/bash", "/scripts/" + tokenRotatorScriptKey})
	env := map[string]string{}
	for _, e := range c["env"].([]any) {
		e := e.(map[string]any)
		if v, ok := e["value"].(string); ok {
			env[e["name"].(string)] = v
			continue
		}
		ref := dig(t, e, "valueFrom", "secretKeyRef").(map[string]any)
		env[e["name"].(string)] = "secret:" + ref["name"].(string) + "/" + ref["key"].(string)
	}
	assert.DeepEqual(t, env, map[string]string{
		"SSM_PARAMETER":         testTokenParameter,
		"AWS_REGION":            "eu-central-1",
		"SSM_ENDPOINT":          "https://ssm.eu-central-1.amazonaws.com",
		"KMS_KEY_ID":            "alias/aws/ssm", // without the parameter resource: SSM's default key
		"TOKEN_TTL_SECONDS":     "7200",
		"HOME":                  "/tmp",
		"AWS_ACCESS_KEY_ID":     "secret:" + TokenRotatorCredentialsName + "/aws_access_key_id",
		"AWS_SECRET_ACCESS_KEY": "secret:" + TokenRotatorCredentialsName + "/aws_secret_access_key",
	})
	assert.Equal(t, dig(t, c, "securityContext", "readOnlyRootFilesystem"), true)
	assert.DeepEqual(t, dig(t, pod, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
		"nodeSelectorTerms", 0, "matchExpressions"), []any{
		map[string]any{"key": kube.LabelPool, "operator": "DoesNotExist"},
		map[string]any{"key": kube.LabelOnPrem, "operator": "Exists"},
	}) // only on a labelled on-prem node, never on a pool node
}

// TestTokenRotatorSSMEndpoint: the rotator talks to SSM in its region's partition, so a China region's
// PutParameter goes to amazonaws.com.cn rather than to a domain where that region does not exist (AWS N11). Config
// refuses the isolated partitions' regions, whose domains are their own.
func TestTokenRotatorSSMEndpoint(t *testing.T) {
	for region, want := range map[string]string{
		"cn-north-1":    "https://ssm.cn-north-1.amazonaws.com.cn",
		"us-gov-west-1": "https://ssm.us-gov-west-1.amazonaws.com",
		"eu-central-1":  "https://ssm.eu-central-1.amazonaws.com",
	} {
		args := testAddonsArgs()
		args.Region = region
		run := mustRunAddons(t, func() *ClusterAddonsArgs { return args })
		c := containerNamed(t, run.object(t, typeCronJob, TokenRotatorName)["spec"].(map[string]any)["jobTemplate"].(map[string]any), "rotate")
		var got string
		for _, e := range c["env"].([]any) {
			if e := e.(map[string]any); e["name"] == "SSM_ENDPOINT" {
				got, _ = e["value"].(string)
			}
		}
		assert.Equal(t, got, want, region)
	}
}

// TestTokenRotatorJobName: the same config names the same Job (a second `pulumi up` leaves the finished Job alone);
// a new rotation value or TTL names a new one, which runs.
func TestTokenRotatorJobName(t *testing.T) {
	base := TokenRotatorJobName(testAddonsArgs())
	assert.Check(t, regexp.MustCompile(`^`+TokenRotatorName+`-[0-9a-f]{10}$`).MatchString(base), base)
	assert.Check(t, len(base) <= 63, "%s is not a valid label value for the Job's pods", base)
	assert.Equal(t, TokenRotatorJobName(testAddonsArgs()), base)
	for what, mutate := range map[string]func(*ClusterAddonsArgs){
		"rotation":  func(a *ClusterAddonsArgs) { a.BootstrapTokenRotation = "2" },
		"ttl":       func(a *ClusterAddonsArgs) { a.BootstrapTokenTTL = 3 * time.Hour },
		"parameter": func(a *ClusterAddonsArgs) { a.JoinTokenParameter = "/dynk8s/other/join-token" },
	} {
		a := testAddonsArgs()
		mutate(a)
		assert.Check(t, TokenRotatorJobName(a) != base, "a new %s keeps the Job name", what)
	}
	rotated := mustRunAddons(t, func() *ClusterAddonsArgs {
		a := testAddonsArgs()
		a.BootstrapTokenRotation = "2026-12-01"
		return a
	})
	assert.Check(t, rotated.rotatorJobName != base)
	assert.DeepEqual(t, rotated.objectNames(t, typeJob), []string{rotated.rotatorJobName})
}

// TestTokenRotationSchedule parses every schedule a valid TTL gives (each minute from 30m to 24h) with the cron
// library the CronJob controller uses, and walks two days of its runs: no gap between two runs may exceed the
// rotation period, which is at most a third of the TTL.
func TestTokenRotationSchedule(t *testing.T) {
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for ttl := config.MinBootstrapTokenTTL; ttl <= config.MaxBootstrapTokenTTL; ttl += time.Minute {
		period := config.BootstrapTokenRotationPeriod(ttl)
		assert.Assert(t, period <= ttl/3 && period >= 10*time.Minute, "ttl %s: period %s", ttl, period)
		spec, err := TokenRotationSchedule(ttl)
		assert.NilError(t, err, "ttl %s", ttl)
		sched, err := parser.Parse(spec)
		assert.NilError(t, err, "ttl %s: %q", ttl, spec)
		prev, longest := sched.Next(start), time.Duration(0)
		for at := sched.Next(prev); at.Before(start.Add(48 * time.Hour)); at = sched.Next(at) {
			longest = max(longest, at.Sub(prev))
			prev = at
		}
		assert.Assert(t, longest > 0 && longest <= period, "ttl %s: %q leaves %s between runs, period %s", ttl,
			spec, longest, period)
	}
	for _, ttl := range []time.Duration{2 * time.Minute, 100 * time.Hour} {
		_, err := TokenRotationSchedule(ttl)
		assert.Check(t, err != nil, "ttl %s", ttl)
	}
}

// rotatorSSM is SSM as the rotator reaches it: signed with the rotator's long-term key, in the test args' region.
func rotatorSSM(t *testing.T) *fakeaws.SSM {
	return fakeaws.NewSSM(t, fakeaws.SigV4{Region: "eu-central-1",
		Credentials: aws.Credentials{AccessKeyID: testRotatorKeyID, SecretAccessKey: testRotatorSecret}})
}

type rotateRun struct {
	output   string
	status   int
	argv     string // every kubectl and curl command line
	manifest map[string]any
}

// testTokenKey is the key the rotator's runs below are given.
const testTokenKey = "arn:aws:kms:eu-central-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"

// runRotateScript runs the embedded script with the real curl and jq, a stub kubectl that keeps what it is given
// on stdin, and SSM at ssm; env replaces or adds to the environment the pods give it.
func runRotateScript(t *testing.T, ssm *fakeaws.SSM, kubectlFails bool, env ...string) rotateRun {
	t.Helper()
	realCurl := realtools.Require(t, "curl")
	dir := realtools.ClosedPath(t, "jq")
	write := func(name, body string) {
		realtools.WriteStub(t, dir, name, "#!/usr/bin/env bash\n"+body+"\n")
	}
	failure := "0"
	if kubectlFails {
		failure = "1"
	}
	write("kubectl", `echo "kubectl $*" >>"$STUB_DIR/argv"
cat >"$STUB_DIR/manifest.json"
if [[ `+failure+` == 1 ]]; then echo 'Error from server (Forbidden): secrets is forbidden (stub)' >&2; exit 1; fi
echo secret/stub`)
	write("curl", `echo "curl $*" >>"$STUB_DIR/argv"
exec "$STUB_REAL_CURL" "$@"`)
	cmd := exec.Command("bash", "-c", rotateTokenScript)
	cmd.Env = []string{
		"PATH=" + dir,
		"STUB_DIR=" + dir, "STUB_REAL_CURL=" + realCurl,
		"SSM_PARAMETER=" + testTokenParameter, "AWS_REGION=eu-central-1", "TOKEN_TTL_SECONDS=7200",
		"AWS_ACCESS_KEY_ID=" + testRotatorKeyID, "AWS_SECRET_ACCESS_KEY=" + testRotatorSecret,
		"SSM_ENDPOINT=" + ssm.URL, "KMS_KEY_ID=" + testTokenKey,
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	realtools.CheckNoMissingCommand(t, string(out))
	run := rotateRun{output: string(out)}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		run.status = exit.ExitCode()
	} else {
		assert.NilError(t, err)
	}
	argv, _ := os.ReadFile(filepath.Join(dir, "argv"))
	run.argv = string(argv)
	if doc, err := os.ReadFile(filepath.Join(dir, "manifest.json")); err == nil {
		assert.NilError(t, json.Unmarshal(doc, &run.manifest), "kubectl was given %s", doc)
	}
	t.Logf("rotate-token.sh exited %d:\n%s", run.status, run.output)
	return run
}

// TestRotateTokenScript runs the real script against a stub kubectl and a fake SSM: it creates a bootstrap token
// Secret as kubeadm's token discovery and the authenticator need it, expiring a TTL from now, and only then writes
// "<id>.<secret>" of that very token to the parameter, SigV4-signed, with the key it was given (so an overwrite
// never leaves the key to SSM's default); two runs make two different tokens; no secret is ever on a command line
// or in the log.
func TestRotateTokenScript(t *testing.T) {
	ssm := rotatorSSM(t)

	var tokens []string
	for range 2 {
		before := time.Now().UTC().Truncate(time.Second)
		run := runRotateScript(t, ssm, false)
		assert.Equal(t, run.status, 0)
		m := run.manifest
		sd := dig(t, m, "stringData").(map[string]any)
		id, secret := sd["token-id"].(string), sd["token-secret"].(string)
		assert.Check(t, regexp.MustCompile(`^[a-z0-9]{6}$`).MatchString(id), id)
		assert.Check(t, regexp.MustCompile(`^[a-z0-9]{16}$`).MatchString(secret))
		assert.Equal(t, dig(t, m, "metadata", "name"), "bootstrap-token-"+id)
		assert.Equal(t, dig(t, m, "metadata", "namespace"), testKubeSystem)
		assert.Equal(t, m["type"], "bootstrap.kubernetes.io/token")
		assert.Equal(t, sd["usage-bootstrap-authentication"], "true")
		assert.Equal(t, sd["usage-bootstrap-signing"], "true")
		assert.Equal(t, sd["auth-extra-groups"], NodeBootstrapGroup)
		expiration, ok := sd["expiration"].(string)
		assert.Assert(t, ok, "the bootstrap token Secret carries no expiration: %v", sd["expiration"])
		exp, err := time.Parse(time.RFC3339, expiration)
		assert.NilError(t, err)
		assert.Check(t, !exp.Before(before.Add(2*time.Hour)) && !exp.After(time.Now().Add(2*time.Hour)),
			"expiration %s is not the TTL from now", exp)
		assert.Check(t, is.Contains(run.argv, "kubectl create --filename - --output name\n"))

		puts := ssm.Puts()
		assert.DeepEqual(t, puts[len(puts)-1], fakeaws.SSMPut{Name: testTokenParameter, Value: id + "." + secret, Type: "SecureString",
			KeyID: testTokenKey, Overwrite: true})
		assert.Check(t, is.Contains(run.output, "wrote token "+id+" to SSM parameter "+testTokenParameter))
		for _, s := range []string{secret, testRotatorSecret} {
			assert.Check(t, !strings.Contains(run.argv, s), "a secret is on a command line:\n%s", run.argv)
			assert.Check(t, !strings.Contains(run.output, s), "a secret is in the log")
		}
		tokens = append(tokens, id+"."+secret)
	}
	assert.Check(t, tokens[0] != tokens[1], "two runs issued the same token")
}

// TestRotateTokenScriptFailures: a Secret the API server refuses means no SSM write at all (a token in SSM the
// cluster does not know would fail every join); an SSM error fails the run with SSM's reason.
func TestRotateTokenScriptFailures(t *testing.T) {
	ssm := rotatorSSM(t)

	run := runRotateScript(t, ssm, true)
	assert.Equal(t, run.status, 1)
	assert.Check(t, is.Contains(run.output, "FAILED: could not create Secret kube-system/bootstrap-token-"))
	assert.Check(t, !strings.Contains(run.argv, "curl "), "SSM was called after the Secret failed")

	ssm.Fail(-1, "AccessDeniedException")
	run = runRotateScript(t, ssm, false)
	assert.Equal(t, run.status, 1)
	assert.Check(t, is.Contains(run.output, "FAILED: SSM PutParameter "+testTokenParameter+": curl exit 0, HTTP 400"))
	assert.Check(t, is.Contains(run.output, "AccessDeniedException"))
	assert.Check(t, is.Contains(run.output, "stays unused until it expires"))
	assert.Check(t, !strings.Contains(run.output, dig(t, run.manifest, "stringData", "token-secret").(string)))

	// Without a key, or with something else than a key ARN or alias, nothing happens at all.
	ssm.Fail(0, "")
	for _, key := range []string{"", `alias/a"b`, "1234abcd-12ab-34cd-56ef-1234567890ab"} {
		run = runRotateScript(t, ssm, false, "KMS_KEY_ID="+key)
		assert.Check(t, run.status != 0, "KMS_KEY_ID=%q", key)
		assert.Check(t, is.Contains(run.output, "KMS_KEY_ID"), "KMS_KEY_ID=%q", key)
		assert.Check(t, run.argv == "", "KMS_KEY_ID=%q: %s ran", key, run.argv)
	}
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

//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/auto/optup"
	"gotest.tools/v3/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// rotatorIssued selects the token Secrets the rotation loop makes (it labels them so).
const rotatorIssued = "app.kubernetes.io/managed-by=dynk8s-join-token-rotator"

// TestTokenRotator deploys the component with the real engine, then runs dynk8s-controller's rotation loop exactly
// as the cluster would (the args and the environment of the live Deployment, the AWS keys from the live Secrets, and
// the controller's own ServiceAccount token, so its RBAC and the token admission policy are the ones under test),
// with moto_server as SSM:
//   - each leader issues a bootstrap token Secret that expires a TTL later when it starts leading and overwrites
//     the SSM parameter with it, encrypted with the configured key; the next leader issues the next one without
//     touching the first;
//   - the token SSM holds authenticates as a kubeadm join token, and the node agent joins with it
//     (kubeadm join --dry-run: token discovery through the signed cluster-info, CA pinned);
//   - the token policy refuses, from the controller's ServiceAccount, Secrets the loop never makes;
//   - a token past its expiration (the controller's shape, as its ServiceAccount creates it, but a TTL of 4 s,
//     under the loop's floor) is refused by the API server, deleted by the controller manager's token cleaner, no
//     longer signs cluster-info, and the node agent does not join with it;
//   - `pulumi up` after those rotations changes nothing, and a new rotation value updates only the controller's
//     Deployment (its pod template's annotation, which rolls the pods, whose new leader issues a token).
func TestTokenRotator(t *testing.T) {
	c := requireCluster(t)
	realKubeadm := requireTool(t, "kubeadm")
	moto := requireTool(t, "moto_server")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)

	cfg := devConfig(t)
	// cluster-info and kubeadm's bootstrap RBAC, as `kubeadm init` leaves them, with a token of this test's own that
	// nothing below uses.
	kubeadmInit(ctx, t, c, "e2ert0.0123456789abcdef")
	ssm := startMoto(ctx, t, moto)
	param := infra.JoinTokenParameter(cfg.ClusterName)
	// What the stack's Identity declares before the rotator's first run.
	ssm.putSecureString(t, cfg.Region, param, infra.JoinTokenPlaceholder)

	// The on-prem Node names the node admission policy lets a kubelet register without a pool label.
	cfg.Kubernetes.OnPremNodes = []string{e2eOnPremNode}
	s := applyAddons(ctx, t, c, cfg)
	t.Cleanup(func() {
		// The issued tokens outlive the stack until they expire; the other tests want a clean kube-system.
		bg := context.Background()
		if _, err := c.kubectl(bg, "-n", "kube-system", "delete", "secret", "-l", rotatorIssued); err != nil {
			t.Logf("cleanup of issued tokens: %v", err)
		}
		_, _ = c.kubectl(bg, "-n", "kube-system", "delete", "lease", addons.ControllerName, "--ignore-not-found")
	})
	r := liveRotator(ctx, t, c, ssm.url)
	if argValue(r.args, "token-ttl") != "2h0m0s" || argValue(r.args, "token-parameter") != param ||
		argValue(r.args, "region") != cfg.Region || argValue(r.args, "token-kms-key") == "" {
		t.Fatalf("the Deployment runs the controller with %q", r.args)
	}

	// 1. The first leader issues a token and hands it to SSM; the next leader issues the next.
	first := r.run(ctx, t, c, ssm, "e2e-rotator-1")
	checkIssued(ctx, t, c, first, cfg.Kubernetes.BootstrapTokenTTL)
	second := r.run(ctx, t, c, ssm, "e2e-rotator-2")
	checkIssued(ctx, t, c, second, cfg.Kubernetes.BootstrapTokenTTL)
	if second.token == first.token {
		t.Fatal("the second leader issued the same token")
	}
	if _, err := c.kubectl(ctx, "-n", "kube-system", "get", "secret", first.name); err != nil {
		t.Errorf("the second leader touched the first token, which must age out by itself: %v", err)
	}
	checkWhoAmI(ctx, t, c, second.token, true)
	checkRotatorAdmission(ctx, t, c)
	checkNodeAdmission(ctx, t, c, cfg.NodePools[0].Name, cfg.NodePools[1].Name)
	if t.Failed() {
		t.FailNow()
	}

	// 2. A node joins with what SSM holds.
	role := fakeRoleInstance(fakeInstanceID, cfg.Region+fakeZoneSuffix, cfg.Region, fakeNodeIP, "")
	imds := fakeaws.NewIMDS(t, role)
	ec2 := fakeRoleEC2(t, cfg.Region, role)
	endpoint := apiServerEndpoint(t, c)
	nodeCfg := *cfg
	nodeCfg.Kubernetes.APIServerEndpoint = endpoint
	input := stackNode(&nodeCfg, cfg.NodePools[0], []string{clusterInfoCAHash(ctx, t, c)}, param)
	node := nodeEnv{realKubeadm: realKubeadm, imds: imds.URL, ssm: ssm.url, ec2: ec2.URL}
	run := node.join(ctx, t, input, 90)
	if run.err != nil || !strings.Contains(run.output, "This node has joined the cluster") {
		t.Fatalf("the agent's join with the rotated token: %v\n%s", run.err, run.output)
	}
	checkJoinConfiguration(t, run.joinConfig, second.token, endpoint.String(), clusterInfoCAHash(ctx, t, c),
		cfg.Region)

	// 3. Pulumi does not own the tokens: after rotations, up changes nothing.
	again, err := s.Up(ctx, optup.ExpectNoChanges(), optup.ProgressStreams(s.log), optup.ErrorProgressStreams(s.log))
	assert.NilError(t, err, "up after rotations")
	if ch := changes(*again.Summary.ResourceChanges); len(ch) != 0 {
		t.Fatalf("up after rotations changed %v", ch)
	}

	// 4. A token past its expiration (a rotator stopped for longer than the TTL, shortened here) is refused. The
	// loop's TTL has a floor of 30 minutes, so the test creates the token as the loop would, as its ServiceAccount.
	expiring := expiringToken(ctx, t, c, 4*time.Second)
	ssm.putSecureString(t, cfg.Region, param, expiring.token)
	checkExpiredToken(ctx, t, c, expiring, second, func() joinRun { return node.join(ctx, t, input, 10) })

	// 5. Rotate now: a new rotation value changes the controller's pod template and nothing else.
	cfg.Kubernetes.BootstrapTokenRotation = "e2e-rotate-now"
	checkRotateNow(ctx, t, s, c, cfg.Kubernetes.BootstrapTokenRotation)
}

// expiringToken creates, as the controller's ServiceAccount, a join token of the loop's shape that expires ttl
// from now.
func expiringToken(ctx context.Context, t *testing.T, c cluster, ttl time.Duration) issued {
	t.Helper()
	const id = "e2eex9"
	name := "bootstrap-token-" + id
	file := filepath.Join(t.TempDir(), "secret.json")
	assert.NilError(t, os.WriteFile(file, []byte(rotatorToken(name, id,
		time.Now().Add(ttl).UTC().Format(time.RFC3339), addons.NodeBootstrapGroup)), 0o600))
	if out, err := c.kubectl(ctx, "--as=system:serviceaccount:kube-system:"+addons.ControllerName, "create", "-f",
		file); err != nil {
		t.Fatalf("create the expiring token as the controller: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "kube-system", "delete", "secret", name, "--ignore-not-found")
	})
	return issued{name: name, id: id, token: id + ".0123456789abcdef"}
}

// checkExpiredToken waits for the token cleaner to delete the expiring token, then checks that the API server
// refuses it, that cluster-info is no longer signed with it (while still with the valid one), and that join fails.
func checkExpiredToken(ctx context.Context, t *testing.T, c cluster, expiring, valid issued, join func() joinRun) {
	t.Helper()
	waitGone(ctx, t, c, expiring.name, 90*time.Second)
	checkWhoAmI(ctx, t, c, expiring.token, false)
	// Token discovery needs cluster-info signed with the token; the bootstrapsigner drops an expired token's
	// signature, and kubeadm waits for one in vain (in --dry-run it does not print why, only the real join does).
	var cm struct {
		Data map[string]string `json:"data"`
	}
	assert.NilError(t, c.getJSON(ctx, &cm, "configmap.v1.", "cluster-info", "-n", "kube-public"))
	if _, ok := cm.Data["jws-kubeconfig-"+expiring.id]; ok {
		t.Errorf("cluster-info is still signed with the expired token %s", expiring.id)
	}
	if _, ok := cm.Data["jws-kubeconfig-"+valid.id]; !ok {
		t.Errorf("cluster-info is not signed with the valid token %s: the check above proves nothing", valid.id)
	}
	run := join()
	if run.err == nil || strings.Contains(run.output, "This node has joined the cluster") {
		t.Fatalf("the agent's join joined with an expired token:\n%s", run.output)
	}
	if !strings.Contains(run.output, "FAILED: kubeadm join: gave up") {
		t.Errorf("join output lacks the reason:\n%s", run.output)
	}
}

// checkRotateNow runs up with cfg's new rotation value: only the controller's Deployment may change, updated in
// place, its pod template's rotation annotation now the new value.
func checkRotateNow(ctx context.Context, t *testing.T, s *pulumiStack, c cluster, rotation string) {
	t.Helper()
	uid := func() string {
		out, err := c.kubectl(ctx, "-n", "kube-system", "get", "deployment.v1.apps", addons.ControllerName, "-o",
			"jsonpath={.metadata.uid}")
		assert.NilError(t, err)
		return out
	}
	before := uid()
	rot, err := s.Up(ctx, optup.ProgressStreams(s.log), optup.ErrorProgressStreams(s.log))
	assert.NilError(t, err, "up with a new rotation value")
	ch := changes(*rot.Summary.ResourceChanges)
	t.Logf("rotate now: %v", ch)
	if ch["update"] != 1 || len(ch) != 1 {
		t.Errorf("a new rotation value: %v, want the controller's Deployment updated and nothing else", ch)
	}
	if after := uid(); after != before {
		t.Errorf("the controller's Deployment was replaced (uid %s -> %s), want an update", before, after)
	}
	out, err := c.kubectl(ctx, "-n", "kube-system", "get", "deployment.v1.apps", addons.ControllerName, "-o",
		`jsonpath={.spec.template.metadata.annotations.dynk8s\.io/bootstrap-token-rotation}`)
	assert.NilError(t, err)
	if out != rotation {
		t.Errorf("the controller's pod template has rotation %q, want %q", out, rotation)
	}
}

// rotator is what the cluster gives the controller's pod, set up to run the rotation loop on this machine.
type rotator struct {
	args []string
	env  map[string]string
	ssm  string
}

// liveRotator reads what the component deployed: the args of the controller's Deployment and its environment with
// the AWS keys from the Secrets it references.
func liveRotator(ctx context.Context, t *testing.T, c cluster, ssmURL string) *rotator {
	t.Helper()
	args, env := liveController(ctx, t, c)
	for _, k := range []string{"DYNK8S_SSM_ACCESS_KEY_ID", "DYNK8S_SSM_SECRET_ACCESS_KEY"} {
		if env[k] == "" {
			t.Fatalf("the controller's Deployment gives no %s", k)
		}
	}
	return &rotator{args: args, env: env, ssm: ssmURL}
}

// serviceAccountKubeconfig writes a kubeconfig into dir with a token (20 minutes) of the ServiceAccount sa of
// kube-system, so that a script runs with exactly its RBAC, and returns its path.
func serviceAccountKubeconfig(ctx context.Context, t *testing.T, c cluster, sa, dir string) string {
	t.Helper()
	token, err := c.kubectl(ctx, "-n", "kube-system", "create", "token", sa, "--duration", "20m")
	assert.NilError(t, err)
	ca, err := os.ReadFile(c.CAFile)
	assert.NilError(t, err)
	kubeconfig, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Config", "current-context": sa,
		"clusters": []any{map[string]any{"name": "e2e", "cluster": map[string]any{
			"server": c.Server, "certificate-authority-data": base64.StdEncoding.EncodeToString(ca)}}},
		"users":    []any{map[string]any{"name": sa, "user": map[string]any{"token": strings.TrimSpace(token)}}},
		"contexts": []any{map[string]any{"name": sa, "context": map[string]any{"cluster": "e2e", "user": sa}}},
	})
	assert.NilError(t, err)
	path := filepath.Join(dir, "kubeconfig")
	assert.NilError(t, os.WriteFile(path, kubeconfig, 0o600))
	return path
}

// issued is one token a rotator run made.
type issued struct {
	name, id, token string
	start, end      time.Time
}

// run runs the controller with the live args (its rotation loop only) and environment as a replica named id, waits
// until it has written a new token to SSM, and stops it; it reads back the token it issued (as the admin: the
// controller itself cannot read it). The log must hold neither the token's secret nor an AWS secret key, and
// SSM must hold the token encrypted with the configured key.
func (r *rotator) run(ctx context.Context, t *testing.T, c cluster, m *motoSSM, id string) issued {
	t.Helper()
	region := argValue(r.args, "region")
	param := argValue(r.args, "token-parameter")
	start := time.Now()
	p := startController(ctx, t, c, controllerSpec{args: r.args, identity: id, set: []string{"--loops=rotate"},
		ec2: r.ssm, ssm: r.ssm,
		ec2Key: awsKey{Key: r.env["AWS_ACCESS_KEY_ID"], Secret: r.env["AWS_SECRET_ACCESS_KEY"]},
		ssmKey: awsKey{Key: r.env["DYNK8S_SSM_ACCESS_KEY_ID"], Secret: r.env["DYNK8S_SSM_SECRET_ACCESS_KEY"]}})
	l := p.waitLine(t, 2*time.Minute, "wrote the token to SSM; the previous token expires on its own",
		map[string]string{"parameter": param})
	end := time.Now()
	p.stop(t)
	tokID := l.str("token")
	value := m.getParameter(t, region, param)
	gotID, secret, _ := strings.Cut(value, ".")
	if gotID != tokID || len(secret) != 16 {
		t.Fatalf("SSM holds %q after %s's run, want the token %s it logged", redact(value), id, tokID)
	}
	name := "bootstrap-token-" + tokID
	var sec struct {
		Data map[string]string `json:"data"`
	}
	assert.NilError(t, c.getJSON(ctx, &sec, "secret.v1.", name, "-n", "kube-system"))
	stored, err := base64.StdEncoding.DecodeString(sec.Data["token-secret"])
	assert.NilError(t, err)
	if string(stored) != secret {
		t.Errorf("SSM's token %s is not its Secret's", tokID)
	}
	log := p.log()
	for _, s := range []string{secret, r.env["AWS_SECRET_ACCESS_KEY"], r.env["DYNK8S_SSM_SECRET_ACCESS_KEY"]} {
		if strings.Contains(log, s) {
			t.Errorf("a secret is in the controller's log")
		}
	}
	if key := parameterKeyID(t, m, region, param); key != argValue(r.args, "token-kms-key") {
		t.Errorf("SSM encrypts %s with key %q, want the configured %q", param, key, argValue(r.args, "token-kms-key"))
	}
	return issued{name: name, id: tokID, token: value, start: start, end: end}
}

// parameterKeyID is the KMS key SSM says the parameter is encrypted with (DescribeParameters).
func parameterKeyID(t *testing.T, m *motoSSM, region, name string) string {
	t.Helper()
	status, b := m.ssm(t, region, "DescribeParameters", map[string]any{
		"ParameterFilters": []any{map[string]any{"Key": "Name", "Values": []string{name}}}})
	var out struct {
		Parameters []struct {
			KeyID string `json:"KeyId"`
		}
	}
	if status != http.StatusOK || json.Unmarshal(b, &out) != nil || len(out.Parameters) != 1 {
		t.Fatalf("SSM DescribeParameters %s: HTTP %d: %s", name, status, b)
	}
	return out.Parameters[0].KeyID
}

// checkIssued reads the token Secret back: what the authenticator and kubeadm's discovery need, and an expiration one
// TTL after the run.
func checkIssued(ctx context.Context, t *testing.T, c cluster, tok issued, ttl time.Duration) {
	t.Helper()
	var sec struct {
		Type string            `json:"type"`
		Data map[string]string `json:"data"`
	}
	assert.NilError(t, c.getJSON(ctx, &sec, "secret.v1.", tok.name, "-n", "kube-system"))
	data := map[string]string{}
	for k, v := range sec.Data {
		b, err := base64.StdEncoding.DecodeString(v)
		assert.NilError(t, err)
		data[k] = string(b)
	}
	if sec.Type != "bootstrap.kubernetes.io/token" || data["token-id"] != tok.id ||
		data["usage-bootstrap-authentication"] != "true" || data["usage-bootstrap-signing"] != "true" ||
		data["auth-extra-groups"] != addons.NodeBootstrapGroup {
		t.Errorf("%s: type %s, data %v", tok.name, sec.Type, redactedKeys(data))
	}
	exp, err := time.Parse(time.RFC3339, data["expiration"])
	assert.NilError(t, err, "%s: expiration %q", tok.name, data["expiration"])
	if exp.Before(tok.start.Add(ttl).Truncate(time.Second)) || exp.After(tok.end.Add(ttl)) {
		t.Errorf("%s expires %s, want %s after the run (%s..%s)", tok.name, exp, ttl, tok.start, tok.end)
	}
}

// checkWhoAmI asks the API server who a token is: a dynk8s node join token, or (valid false) nobody.
func checkWhoAmI(ctx context.Context, t *testing.T, c cluster, token string, valid bool) {
	t.Helper()
	out, err := c.kubectl(ctx, "auth", "whoami", "--token", token, "-o", "json")
	if !valid {
		if err == nil || !strings.Contains(err.Error(), "Unauthorized") {
			t.Errorf("an expired token: got %v %s, want Unauthorized", err, out)
		}
		return
	}
	if err != nil {
		t.Errorf("whoami with the issued token: %v", err)
		return
	}
	var who struct {
		Status struct {
			UserInfo struct {
				Username string   `json:"username"`
				Groups   []string `json:"groups"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &who))
	id, _, _ := strings.Cut(token, ".")
	u := who.Status.UserInfo
	if u.Username != "system:bootstrap:"+id || !slices.Contains(u.Groups, addons.NodeBootstrapGroup) {
		t.Errorf("the issued token authenticates as %s %v", u.Username, u.Groups)
	}
}

// waitGone waits for the token cleaner to delete an expired token's Secret.
func waitGone(ctx context.Context, t *testing.T, c cluster, name string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		_, err := c.kubectl(ctx, "-n", "kube-system", "get", "secret", name)
		if isNotFound(err) {
			return
		}
		assert.NilError(t, err)
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists %s after it expired: is the tokencleaner controller on?", name, limit)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// redact shows a token's public id only.
func redact(token string) string {
	id, _, ok := strings.Cut(token, ".")
	if !ok {
		return token
	}
	return id + ".<secret>"
}

func redactedKeys(data map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range data {
		if k == "token-secret" {
			v = "<secret>"
		}
		out[k] = v
	}
	return out
}

// rotatorToken is a bootstrap token Secret as the rotator makes it, with expiration, auth-extra-groups and the name's
// id as given.
func rotatorToken(name, id, expiration, group string) string {
	return fmt.Sprintf(`{"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
		"metadata": {"name": %q, "namespace": "kube-system"},
		"stringData": {"token-id": %q, "token-secret": "0123456789abcdef", "expiration": %q,
		"usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true", "auth-extra-groups": %q}}`,
		name, id, expiration, group)
}

// checkRotatorAdmission: what RBAC lets the rotator do (create any Secret in kube-system), the stack's admission
// policy narrows to what it needs. As the rotator's ServiceAccount, an Opaque Secret, a bootstrap token without an
// expiration and one of another group are denied by the real API server, with the policy's messages; the same token
// as the rotator makes it is admitted.
func checkRotatorAdmission(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	as := "--as=system:serviceaccount:kube-system:" + addons.ControllerName
	// The dev stack's TTL is the default, 2h.
	inTTL := time.Now().UTC().Add(2 * time.Hour).Format(time.RFC3339)
	expires := "a join token expires, as a UTC RFC 3339 time in whole seconds, within 2h10m0s of its creation"
	for name, tc := range map[string]struct{ manifest, want string }{
		"a token of another group": {rotatorToken("bootstrap-token-e2egr1", "e2egr1", inTTL,
			addons.NodeBootstrapGroup+",system:masters"), "a join token authenticates with exactly the group"},
		"a token of kubeadm's auto-approved group": {rotatorToken("bootstrap-token-e2egr2", "e2egr2", inTTL,
			"system:bootstrappers:kubeadm:default-node-token"), "a join token authenticates with exactly the group"},
		"a token expiring in year 9999": {rotatorToken("bootstrap-token-e2eex1", "e2eex1", "9999-12-31T23:59:59Z",
			addons.NodeBootstrapGroup), expires},
		"a token expiring a day on": {rotatorToken("bootstrap-token-e2eex2", "e2eex2",
			time.Now().UTC().Add(24*time.Hour).Format(time.RFC3339), addons.NodeBootstrapGroup), expires},
		"a token expiring past the TTL and its slack": {rotatorToken("bootstrap-token-e2eex3", "e2eex3",
			time.Now().UTC().Add(2*time.Hour+11*time.Minute).Format(time.RFC3339), addons.NodeBootstrapGroup), expires},
		"a token with a fractional expiration": {rotatorToken("bootstrap-token-e2eex4", "e2eex4",
			time.Now().UTC().Add(time.Hour).Format(time.RFC3339Nano), addons.NodeBootstrapGroup), expires},
		"a token with an expiration of another zone": {rotatorToken("bootstrap-token-e2eex5", "e2eex5",
			time.Now().In(time.FixedZone("x", 3600)).Format(time.RFC3339), addons.NodeBootstrapGroup), expires},
	} {
		file := filepath.Join(t.TempDir(), "secret.json")
		assert.NilError(t, os.WriteFile(file, []byte(tc.manifest), 0o600))
		// The policy is enforced once the API server has compiled it, a moment after it was created.
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			if _, err = c.kubectl(ctx, as, "create", "-f", file); err != nil || time.Now().After(deadline) {
				break
			}
			_, _ = c.kubectl(ctx, "-n", "kube-system", "delete", "-f", file, "--ignore-not-found")
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("the rotator created %s: %v", name, err)
		}
		_, _ = c.kubectl(ctx, "-n", "kube-system", "delete", "-f", file, "--ignore-not-found")
	}
	// The positive twins, once the denials above show the policy is in force: the token as the rotator makes it,
	// one at the end of its slack, and one already expired (which no rule needs to refuse).
	for name, expiration := range map[string]string{
		"e2eok1": inTTL,
		"e2eok2": time.Now().UTC().Add(2*time.Hour + 9*time.Minute).Format(time.RFC3339),
		"e2eok3": time.Now().UTC().Add(-time.Minute).Format(time.RFC3339),
	} {
		file := filepath.Join(t.TempDir(), "secret.json")
		assert.NilError(t, os.WriteFile(file, []byte(rotatorToken("bootstrap-token-"+name, name, expiration,
			addons.NodeBootstrapGroup)), 0o600))
		if _, err := c.kubectl(ctx, as, "create", "-f", file); err != nil {
			t.Errorf("the rotator may not create a token expiring %s: %v", expiration, err)
		}
		_, _ = c.kubectl(ctx, "-n", "kube-system", "delete", "-f", file, "--ignore-not-found")
	}
}

const e2eOnPremNode = "e2e-onprem-1"

// checkNodeAdmission: the stack's node admission policy, against the real API server with its Node authorizer and
// NodeRestriction, each kubelet impersonated with its own node identity. Denied: a kubelet registering an unlabelled
// Node whose name is not in kubernetes.onPremNodes, one labelled with a pool the stack does not have, a pool node
// removing its pool label and an on-prem node adding one, on nodes and through nodes/status alike, a pool node
// changing its label to otherPool through nodes/status, and any kubelet giving itself the on-prem label
// (NodeRestriction's own refusal). Admitted, each refusal's twin: the listed on-prem name, a Node of one of the
// stack's pools named after its instance (a pool Node named otherwise is denied), a kubelet changing a label of its
// own that is not the pool's, and a pool kubelet's own status update (its Ready condition, labels untouched).
func checkNodeAdmission(ctx context.Context, t *testing.T, c cluster, pool, otherPool string) {
	t.Helper()
	const poolNode, rogue, wrongPool, badName = "i-0e2e0000000000a01", "e2e-rogue", "i-0e2e0000000000a02", "ip-10-0-0-1"
	const unlabelledID = "i-0e2e0000000000a03"
	t.Cleanup(func() {
		for _, n := range []string{poolNode, rogue, wrongPool, badName, unlabelledID, e2eOnPremNode} {
			_, _ = c.kubectl(context.Background(), "delete", "node", n, "--ignore-not-found", "--wait=false")
		}
	})
	as := func(node string) []string {
		return []string{"--as=system:node:" + node, "--as-group=system:nodes", "--as-group=system:authenticated"}
	}
	register := func(node, poolLabel string) error {
		labels := map[string]string{}
		if poolLabel != "" {
			labels[kube.LabelPool] = poolLabel
		}
		doc, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": node, "labels": labels}})
		assert.NilError(t, err)
		file := filepath.Join(t.TempDir(), node+".json")
		assert.NilError(t, os.WriteFile(file, doc, 0o600))
		_, err = c.kubectl(ctx, append(as(node), "create", "-f", file)...)
		return err
	}
	denied := func(what string, err error, want string) {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s was not denied by the node policy: %v", what, err)
		}
	}
	// The policy is enforced once the API server has compiled it, a moment after it was created.
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if err = register(rogue, ""); err != nil || time.Now().After(deadline) {
			break
		}
		_, _ = c.kubectl(ctx, "delete", "node", rogue, "--wait=false")
	}
	denied("an unlabelled Node of an unlisted name", err, "is an on-prem node of kubernetes.onPremNodes")
	assert.Check(t, register(e2eOnPremNode, ""), "the listed on-prem node cannot register")
	denied("a Node of a pool the stack lacks", register(wrongPool, "no-such-pool"),
		"names one of this stack's pools")
	denied("a pool Node not named after an instance", register(badName, pool), "is named after its EC2 instance id")
	denied("an unlabelled Node named after an instance", register(unlabelledID, ""),
		"registers under an EC2 instance id carries "+kube.LabelPool)
	assert.NilError(t, register(poolNode, pool), "a node of pool %s cannot register", pool)
	_, err = c.kubectl(ctx, append(as(poolNode), "label", "node", poolNode, kube.LabelPool+"-")...)
	denied("a pool node removing its pool label", err, "may not add, change or remove its Node's "+kube.LabelPool)
	_, err = c.kubectl(ctx, append(as(e2eOnPremNode), "label", "node", e2eOnPremNode, kube.LabelPool+"="+pool)...)
	denied("an on-prem node adding a pool label", err, "may not add, change or remove its Node's "+kube.LabelPool)
	if _, err := c.kubectl(ctx, append(as(poolNode), "label", "node", poolNode, "e2e.dynk8s.io/own=yes")...); err != nil {
		t.Errorf("a pool node cannot change a label of its own that is not the pool's: %v", err)
	}
	// The same through nodes/status, which the kubelet itself writes its labels and conditions through, as a root
	// user of a pool node could send it with kubelet.conf: a PATCH alone. kubectl patch --subresource=status reads
	// the object first, and a node may update and patch nodes/status but not get it (bootstrappolicy NodeRules).
	statusPatch := func(node string, patch map[string]any) error {
		b, err := json.Marshal(patch)
		assert.NilError(t, err)
		rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		assert.NilError(t, err)
		rc.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node,
			Groups: []string{"system:nodes", "system:authenticated"}}
		cs, err := kubernetes.NewForConfig(rc)
		assert.NilError(t, err)
		_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}, "status")
		return err
	}
	labels := func(v any) map[string]any { return map[string]any{"metadata": map[string]any{"labels": v}} }
	denied("a pool node removing its pool label through nodes/status",
		statusPatch(poolNode, labels(map[string]any{kube.LabelPool: nil})),
		"may not add, change or remove its Node's "+kube.LabelPool)
	denied("a pool node changing its pool label through nodes/status",
		statusPatch(poolNode, labels(map[string]any{kube.LabelPool: otherPool})),
		"may not add, change or remove its Node's "+kube.LabelPool)
	denied("an on-prem node adding a pool label through nodes/status",
		statusPatch(e2eOnPremNode, labels(map[string]any{kube.LabelPool: pool})),
		"may not add, change or remove its Node's "+kube.LabelPool)
	// The positive on-prem label is NodeRestriction's: no kubelet may set it, on either resource.
	for _, node := range []string{poolNode, e2eOnPremNode} {
		_, err = c.kubectl(ctx, append(as(node), "label", "node", node, kube.LabelOnPrem+"=true")...)
		denied(node+" labelling itself on-prem", err, "is not allowed to modify labels: "+kube.LabelOnPrem)
		denied(node+" labelling itself on-prem through nodes/status",
			statusPatch(node, labels(map[string]any{kube.LabelOnPrem: "true"})),
			"is not allowed to modify labels: "+kube.LabelOnPrem)
	}
	// What the kubelet itself sends through nodes/status, its conditions with its labels as they are, passes.
	now := time.Now().UTC().Format(time.RFC3339)
	assert.Check(t, statusPatch(poolNode, map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
		"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
		"lastHeartbeatTime": now, "lastTransitionTime": now}}}}), "a pool node's own status update was refused")
	if out, err := c.kubectl(ctx, "get", "node", poolNode, "-o",
		`jsonpath={.status.conditions[?(@.type=="Ready")].status}`); err != nil || out != "True" {
		t.Errorf("the pool node's Ready condition is %q after its status update (%v)", out, err)
	}
	if out, err := c.kubectl(ctx, "get", "node", poolNode, "-o", "jsonpath={.metadata.labels.dynk8s\\.io/pool}"); err != nil ||
		out != pool {
		t.Errorf("the pool node's label is %q after the refused removal (%v)", out, err)
	}
}

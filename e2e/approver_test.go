//go:build e2e

package e2e

import (
	"context"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/internal/testkit/csrtest"
)

// A token of its own, of the stack's node group, so that no other test's join shares it.
const (
	approverTokenID     = "e2eap1"
	approverTokenSecret = "0123456789abcdef"
)

// TestNodeCSRApprover proves node identity end to end against the real API server, with the real kubeadm and
// kubelet, moto (IAM enforced) as EC2 and Auto Scaling, and dynk8s-controller's approval loop run as the stack's
// Deployment runs it (its rendered args, its ServiceAccount's RBAC, the cleanup IAM user's key):
//   - the join token's group, the stack's own, is bound to every role the real `kubeadm init` binds kubeadm's node
//     group to, except the auto-approval of node client certificates;
//   - the rendered user data joins for a live instance of a group: the agent marks its kubelet's key on its own
//     instance (CreateTags with the node role, under moto's IAM enforcement), the controller approves the
//     kubelet's CSR, and the Node, named after the instance, is Ready;
//   - a second client with the same join token and a key of its own, racing for that live instance's name, is
//     denied, whether its CSR comes before the real kubelet's (its key is not the one the instance marked) or after
//     it (the Node exists);
//   - CSRs made with the same token for an on-prem node's name, for an instance in no group and for a terminated
//     one are denied and never get a certificate, and so are requests that are not exactly one PEM block
//     (csrtest.Smuggled), which the API server accepts and would sign as system:node:cp-1; the positive twin, a
//     second live instance that marked the CSR's key, is approved and signed;
//   - with the controller stopped, a CSR stays pending without a certificate (the controller manager's approver
//     does not take it), and is approved once the controller is back: it fails closed.
func TestNodeCSRApprover(t *testing.T) {
	c := requireCluster(t)
	realKubeadm := requireTool(t, "kubeadm")
	moto := requireTool(t, "moto_server")
	for _, tool := range []string{"kubelet", "containerd", "unshare", "nsenter", "ip", "curl", "python3", "bash"} {
		requireTool(t, tool)
	}
	if os.Geteuid() != 0 {
		missing(t, "root (namespaces and mounts)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)

	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	token := approverTokenID + "." + approverTokenSecret
	kubeadmInitGroup(ctx, t, c, token, addons.NodeBootstrapGroup)
	kubeadmUploadConfig(ctx, t, c)
	controllerObjects(ctx, t, c)
	checkNodeBootstrapRBAC(ctx, t, c)
	checkPreflightOfTheCluster(ctx, t, c, cfg)

	// EC2 and Auto Scaling: the dev stack's groups, five live instances of the pool's group, instances of the
	// pool's launch template outside any group (one running, one terminated), and the node role, whose temporary
	// credentials the joining instance's IMDS hands out.
	s := loadStackAutoscaling(t)
	s.replay.Roles = s.instanceRoles(t)
	a := startAWS(ctx, t, s, []replayUser{{Name: s.cleanupUser, Policy: s.cleanupPolicy}})
	group := s.poolGroup(t, pool.Name)
	var live []string
	a.python(ctx, t, nil, &live, "launch", a.admin.Key, a.admin.Secret, group, "5")
	if len(live) != 5 {
		t.Fatalf("group %s has instances %v, want 5", group, live)
	}
	var fleet map[string]string
	template, _ := s.replay.LaunchTemplates[0]["name"].(string)
	a.python(ctx, t, nil, &fleet, "fleet", a.admin.Key, a.admin.Secret, template)

	spec := controllerSpec{args: renderedControllerArgs(t), identity: "e2e-approver",
		set: []string{"--loops=approve"}, ec2: a.url, ssm: a.url, ec2Key: a.users[s.cleanupUser]}
	ctl := startController(ctx, t, c, spec)
	ctl.waitLine(t, time.Minute, "judging kubelet client CSRs", nil)

	// A racer with the join token and a key of its own asks for the live instance's name before the real kubelet:
	// the instance has marked no key yet, so the CSR waits.
	raceBefore, _ := kubeletRequest(t, live[0])
	createCSR(ctx, t, c, token, "e2e-csr-race-before", raceBefore)

	// The real join, for the first live instance.
	ssm := startMoto(ctx, t, moto)
	param := infra.JoinTokenParameter(cfg.ClusterName)
	ssm.putSecureString(t, cfg.Region, param, token)
	zone := cfg.Region + fakeZoneSuffix
	role := fakeRoleInstance(live[0], zone, cfg.Region, fakeNodeIP, "")
	nodeRole := a.roles[s.nodeRole(t)]
	role.AccessKeyID, role.SecretAccessKey, role.SessionToken = nodeRole.Key, nodeRole.Secret, nodeRole.Token
	imds := fakeaws.NewIMDS(t, role)
	userData := renderNodeUserData(ctx, t, c, cfg, pool, param)
	n := bootNode(ctx, t, userData, realKubeadm, []string{c.Server, imds.URL, ssm.url, a.url})
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "delete", "node", live[0], "--ignore-not-found", "--wait=false")
	})
	start := time.Now()
	run := n.join(ctx, t, 150)
	if run.err != nil {
		t.Fatalf("the agent's join: %v\n%s\nkubelet log:\n%s\ncontroller:\n%s", run.err, run.output, n.kubeletLog(),
			tail(ctl.log(), 40))
	}
	waitNodeReady(ctx, t, c, live[0], 90*time.Second, n)
	t.Logf("node %s Ready %.1f s after the agent's join started", live[0], time.Since(start).Seconds())
	checkKubeletClientCert(t, n.hostPath(t, "/var/lib/kubelet/pki/kubelet-client-current.pem"), c.CAFile,
		"system:node:"+live[0])
	mark := a.instanceTags(ctx, t, live[0])[names.TagKubeletKey]
	if mark == "" {
		t.Errorf("the join did not mark %s with its kubelet key (%s)", live[0], names.TagKubeletKey)
	}
	approved := ctl.waitLine(t, 10*time.Second, "approve", map[string]string{"node": live[0]})
	t.Logf("the controller approved %s's CSR %s", live[0], approved.str("csr"))

	// CSRs with the same token, as a token holder would make them.
	denied := map[string]struct{ node, why string }{
		"e2e-csr-race-before": {live[0], "its public key is not the one " + live[0] + " marked"},
	}
	add := func(name, node, why string) {
		t.Helper()
		createNodeCSR(ctx, t, c, token, name, "system:node:"+node)
		denied[name] = struct{ node, why string }{node, why}
	}
	add("e2e-csr-onprem", "worker-1", "is not system:node:<instance id>")
	// The racer again, after the real kubelet: the Node exists.
	add("e2e-csr-race-after", live[0], "a Node named "+live[0]+" exists already")
	add("e2e-csr-no-group", fleet["running"], "is no pending or running instance of an Auto Scaling group")
	add("e2e-csr-terminated", fleet["terminated"], "is no pending or running instance of an Auto Scaling group")
	// Requests that are not exactly one PEM block, which the API server accepts and would sign by their first
	// block: two for cp-1 behind text a whole-text reader takes for a live instance's request (live[3]), one with a
	// block for live[4] and a second after it.
	smuggled := csrtest.Smuggled(t, live[3], live[4], "cp-1")
	for _, name := range []string{"text-before", "malformed-first-block", "two-blocks"} {
		createCSR(ctx, t, c, token, "e2e-csr-smuggled-"+name, smuggled[name])
		denied["e2e-csr-smuggled-"+name] = struct{ node, why string }{"cp-1",
			"the request is not exactly one CERTIFICATE REQUEST PEM block"}
	}
	request, key := kubeletRequest(t, live[1])
	a.markKey(ctx, t, live[1], key)
	createCSR(ctx, t, c, token, "e2e-csr-live", request)
	for name, d := range denied {
		got := waitCSRDecided(ctx, t, c, name, ctl)
		if got.decision != "Denied" || !strings.Contains(got.message, d.why) {
			t.Errorf("CSR %s for %s: %s %q, want Denied with %q", name, d.node, got.decision, got.message, d.why)
		}
	}
	if got := waitCSRDecided(ctx, t, c, "e2e-csr-live", ctl); got.decision != "Approved" {
		t.Errorf("CSR for live instance %s: %s %q, want Approved", live[1], got.decision, got.message)
	}
	if cert := waitCSRCertificate(ctx, c, "e2e-csr-live", 20*time.Second); cert == "" {
		t.Errorf("the approved CSR for %s was never signed", live[1])
	}
	for name := range denied {
		if cert := waitCSRCertificate(ctx, c, name, time.Second); cert != "" {
			t.Errorf("the denied CSR %s has a certificate", name)
		}
	}

	// Fail closed: no controller, no certificate; the controller back, the CSR approved.
	ctl.stop(t)
	request, key = kubeletRequest(t, live[2])
	a.markKey(ctx, t, live[2], key)
	createCSR(ctx, t, c, token, "e2e-csr-while-down", request)
	time.Sleep(5 * time.Second)
	if got := csrState(ctx, t, c, "e2e-csr-while-down"); got.decision != "" || got.certificate {
		t.Errorf("with the controller down, the CSR for %s is %s (certificate %t), want pending", live[2],
			got.decision, got.certificate)
	}
	ctl = startController(ctx, t, c, spec)
	if got := waitCSRDecided(ctx, t, c, "e2e-csr-while-down", ctl); got.decision != "Approved" {
		t.Errorf("once the controller is back, the CSR for %s is %s %q, want Approved", live[2], got.decision,
			got.message)
	}
}

// checkNodeBootstrapRBAC: the stack's node group holds every role the real kubeadm gave its own node group, except
// the auto-approval of node client certificates, and no other.
func checkNodeBootstrapRBAC(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	const kubeadmGroup = "system:bootstrappers:kubeadm:default-node-token"
	roles := func(group string) []string {
		var out []string
		for _, kind := range []string{"clusterrolebindings", "rolebindings"} {
			var list struct {
				Items []struct {
					Metadata struct{ Namespace string }
					RoleRef  struct{ Kind, Name string } `json:"roleRef"`
					Subjects []struct{ Kind, Name string }
				}
			}
			assert.NilError(t, c.getJSON(ctx, &list, kind, "--all-namespaces"))
			for _, b := range list.Items {
				for _, s := range b.Subjects {
					if s.Kind == "Group" && s.Name == group {
						out = append(out, b.RoleRef.Kind+" "+b.Metadata.Namespace+"/"+b.RoleRef.Name)
					}
				}
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	want := slices.DeleteFunc(roles(kubeadmGroup), func(r string) bool {
		return r == "ClusterRole /system:certificates.k8s.io:certificatesigningrequests:nodeclient"
	})
	if got := roles(addons.NodeBootstrapGroup); !slices.Equal(got, want) {
		t.Errorf("the stack's node group has roles\n%v\nwant kubeadm's but the auto-approval\n%v", got, want)
	}
}

// createNodeCSR creates, authenticated with the bootstrap token, a kubelet client CSR for cn as a kubelet makes it.
func createNodeCSR(ctx context.Context, t *testing.T, c cluster, token, name, cn string) {
	t.Helper()
	createCSR(ctx, t, c, token, name, csrtest.Block(csrtest.Signed(t, pkix.Name{CommonName: cn,
		Organization: []string{"system:nodes"}})))
}

// createCSR creates the kubelet client CSR name with the request text given (PEM), as the holder of token.
func createCSR(ctx context.Context, t *testing.T, c cluster, token, name, request string) {
	t.Helper()
	doc, err := json.Marshal(map[string]any{
		"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"request":    base64.StdEncoding.EncodeToString([]byte(request)),
			"signerName": addons.KubeletClientSigner,
			"usages":     []string{"digital signature", "client auth"},
		},
	})
	assert.NilError(t, err)
	file := filepath.Join(t.TempDir(), name+".json")
	assert.NilError(t, os.WriteFile(file, doc, 0o600))
	if out, err := c.kubectl(ctx, "--token", token, "create", "-f", file); err != nil {
		t.Fatalf("create CSR %s with the join token: %v\n%s", name, err, out)
	}
}

type csrResult struct {
	decision, message string
	certificate       bool
}

func csrState(ctx context.Context, t *testing.T, c cluster, name string) csrResult {
	t.Helper()
	var o struct {
		Status struct {
			Certificate string `json:"certificate"`
			Conditions  []struct{ Type, Message string }
		} `json:"status"`
	}
	assert.NilError(t, c.getJSON(ctx, &o, "csr", name))
	r := csrResult{certificate: o.Status.Certificate != ""}
	for _, cond := range o.Status.Conditions {
		if cond.Type == "Approved" || cond.Type == "Denied" {
			r.decision, r.message = cond.Type, cond.Message
		}
	}
	return r
}

// waitCSRDecided waits up to 30 s for a CSR's Approved or Denied condition.
func waitCSRDecided(ctx context.Context, t *testing.T, c cluster, name string, ctl *controllerProcess) csrResult {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := csrState(ctx, t, c, name)
		if r.decision != "" {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSR %s undecided after 30 s; controller:\n%s", name, tail(ctl.log(), 40))
		}
	}
}

// waitCSRCertificate waits up to timeout for a CSR's certificate and returns it ("" if none came).
func waitCSRCertificate(ctx context.Context, c cluster, name string, timeout time.Duration) string {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := c.kubectl(ctx, "get", "csr", name, "-o", "jsonpath={.status.certificate}")
		if err == nil && out != "" {
			return out
		}
	}
	return ""
}

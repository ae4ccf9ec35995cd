//go:build e2e

package e2e

import (
	"context"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/testkit/csrtest"
)

// A token of its own, of the stack's node group, so that no other test's join shares it.
const (
	approverTokenID     = "e2eap1"
	approverTokenSecret = "0123456789abcdef"
)

// TestNodeCSRApprover proves node identity end to end against the real API server, with the real kubeadm and
// kubelet, and moto (IAM enforced) as EC2 and Auto Scaling:
//   - the join token's group, the stack's own, is bound to every role the real `kubeadm init` binds kubeadm's node
//     group to, except the auto-approval of node client certificates;
//   - the rendered user data joins for a live instance of a group: the approver (the stack's script, its RBAC, the
//     cleanup's IAM policy) approves the kubelet's CSR, and the Node, named after the instance, is Ready;
//   - CSRs made with the same token for an on-prem node's name, for the live instance whose Node now exists, for an
//     instance in no group and for a terminated one are denied and never get a certificate, and so are requests
//     that are not exactly one PEM block (csrtest.Smuggled), which the API server accepts and would sign as
//     system:node:cp-1; the positive twin, a second live instance, is approved and signed;
//   - with the approver stopped, a CSR stays pending without a certificate (the controller manager's approver
//     does not take it), and is approved once the approver is back: it fails closed.
func TestNodeCSRApprover(t *testing.T) {
	c := requireCluster(t)
	realKubeadm := requireTool(t, "kubeadm")
	moto := requireTool(t, "moto_server")
	for _, tool := range []string{"kubelet", "containerd", "unshare", "nsenter", "ip", "curl", "python3", "aws", "jq",
		"bash"} {
		requireTool(t, tool)
	}
	if os.Geteuid() != 0 {
		missing(t, "root (namespaces and mounts)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)

	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	token := approverTokenID + "." + approverTokenSecret
	kubeadmInitGroup(ctx, t, c, token, addons.NodeBootstrapGroup)
	kubeadmUploadConfig(ctx, t, c)
	approverObjects(ctx, t, c)
	checkNodeBootstrapRBAC(ctx, t, c)

	// EC2 and Auto Scaling: the dev stack's groups, three live instances of the pool's group, and instances of the
	// pool's launch template outside any group (one running, one terminated).
	s := loadStackAutoscaling(t)
	a := startAWS(ctx, t, s, []replayUser{{Name: s.cleanupUser, Policy: s.cleanupPolicy}})
	group := ""
	for name, g := range s.groups {
		if g.labels["dynk8s.io/pool"] == pool.Name {
			group = name
		}
	}
	if group == "" {
		t.Fatalf("no group of pool %s in the dev stack", pool.Name)
	}
	var live []string
	a.python(ctx, t, nil, &live, "launch", a.admin.Key, a.admin.Secret, group, "5")
	if len(live) != 5 {
		t.Fatalf("group %s has instances %v, want 5", group, live)
	}
	var fleet map[string]string
	template, _ := s.replay.LaunchTemplates[0]["name"].(string)
	a.python(ctx, t, nil, &fleet, "fleet", a.admin.Key, a.admin.Secret, template)

	ap := startApprover(ctx, t, c, a, s.cleanupUser)

	// The real join, for the first live instance.
	ssm := startMoto(ctx, t, moto)
	param := infra.JoinTokenParameter(cfg.ClusterName)
	ssm.putSecureString(t, cfg.Region, param, token)
	zone := cfg.Region + fakeZoneSuffix
	imds := fakeaws.NewIMDS(t, fakeRoleInstance(live[0], zone, cfg.Region, fakeNodeIP, ""))
	userData := renderNodeUserData(ctx, t, c, cfg, pool, param)
	n := bootNode(ctx, t, userData, realKubeadm, []string{c.Server, imds.URL, ssm.url})
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "delete", "node", live[0], "--ignore-not-found", "--wait=false")
	})
	start := time.Now()
	run := n.join(ctx, t, 90)
	if run.err != nil {
		t.Fatalf("the agent's join: %v\n%s\nkubelet log:\n%s\napprover:\n%s", run.err, run.output, n.kubeletLog(), ap.log())
	}
	waitNodeReady(ctx, t, c, live[0], 60*time.Second, n)
	t.Logf("node %s Ready %.1f s after the agent's join started", live[0], time.Since(start).Seconds())
	checkKubeletClientCert(t, n.hostPath(t, "/var/lib/kubelet/pki/kubelet-client-current.pem"), c.CAFile,
		"system:node:"+live[0])
	if !strings.Contains(ap.log(), "approve ") || !strings.Contains(ap.log(), live[0]) {
		t.Errorf("the approver did not approve %s:\n%s", live[0], ap.log())
	}

	// CSRs with the same token, as a token holder would make them.
	csr := func(name, node string) {
		t.Helper()
		createNodeCSR(ctx, t, c, token, name, "system:node:"+node)
	}
	denied := map[string]struct{ node, why string }{
		"e2e-csr-onprem": {"worker-1", "is not system:node:<instance id>"},
		// The approver finds its own approval of the joined node's CSR first; a Node of the name with no approval
		// of this approver's behind it is TestApproverDecisions' node-exists case.
		"e2e-csr-has-node":   {live[0], "a certificate for " + live[0] + " was approved before"},
		"e2e-csr-no-group":   {fleet["running"], "is no pending or running instance of an Auto Scaling group"},
		"e2e-csr-terminated": {fleet["terminated"], "is no pending or running instance of an Auto Scaling group"},
	}
	for name, d := range denied {
		csr(name, d.node)
	}
	// Requests that are not exactly one PEM block, which the API server accepts and would sign by their first
	// block: two for cp-1 behind text a whole-text reader takes for a live instance's request (live[3]), one with a
	// block for live[4] and a second after it.
	smuggled := csrtest.Smuggled(t, live[3], live[4], "cp-1")
	for _, name := range []string{"text-before", "malformed-first-block", "two-blocks"} {
		createCSR(ctx, t, c, token, "e2e-csr-smuggled-"+name, smuggled[name])
		denied["e2e-csr-smuggled-"+name] = struct{ node, why string }{"cp-1",
			"the request is not exactly one CERTIFICATE REQUEST PEM block"}
	}
	csr("e2e-csr-live", live[1])
	for name, d := range denied {
		got := waitCSRDecided(ctx, t, c, name, ap)
		if got.decision != "Denied" || !strings.Contains(got.message, d.why) {
			t.Errorf("CSR %s for %s: %s %q, want Denied with %q", name, d.node, got.decision, got.message, d.why)
		}
	}
	if got := waitCSRDecided(ctx, t, c, "e2e-csr-live", ap); got.decision != "Approved" {
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

	// Fail closed: no approver, no certificate; the approver back, the CSR approved.
	ap.stop(t)
	csr("e2e-csr-while-down", live[2])
	time.Sleep(5 * time.Second)
	if got := csrState(ctx, t, c, "e2e-csr-while-down"); got.decision != "" || got.certificate {
		t.Errorf("with the approver down, the CSR for %s is %s (certificate %t), want pending", live[2],
			got.decision, got.certificate)
	}
	ap = startApprover(ctx, t, c, a, s.cleanupUser)
	if got := waitCSRDecided(ctx, t, c, "e2e-csr-while-down", ap); got.decision != "Approved" {
		t.Errorf("once the approver is back, the CSR for %s is %s %q, want Approved", live[2], got.decision,
			got.message)
	}
}

// approverObjects applies the dev stack's rendered approver and node bootstrap objects, but not its Deployment
// (the test runs its script), and removes them and every CSR when the test ends.
func approverObjects(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	t.Cleanup(func() { _, _ = c.kubectl(context.Background(), "delete", "csr", "--all") })
	applyRendered(ctx, t, c, func(name string) bool {
		return strings.Contains(name, addons.ApproverName) && !strings.HasPrefix(name, "deployment-") ||
			strings.Contains(name, "dynk8s-node-bootstrap-")
	}, 8)
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

// approverProcess is approve-csr.sh running on the host as the stack's Deployment runs it.
type approverProcess struct {
	cmd     *exec.Cmd
	logFile string
}

// log is what the script printed so far.
func (p *approverProcess) log() string {
	b, _ := os.ReadFile(p.logFile)
	return string(b)
}

// startApprover runs the script from its rendered ConfigMap with the Deployment's environment: the approver's
// ServiceAccount (its RBAC only), the cleanup IAM user's key against moto.
func startApprover(ctx context.Context, t *testing.T, c cluster, a *awsEnv, cleanupUser string) *approverProcess {
	t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	assert.NilError(t, c.getJSON(ctx, &cm, "configmap.v1.", addons.ApproverName, "-n", "kube-system"))
	env := renderedEnv(t, filepath.Join("..", "testdata", "stacks", "dev", "manifests",
		"deployment-kube-system-"+addons.ApproverName+".yaml"))
	dir := t.TempDir()
	script := filepath.Join(dir, "approve-csr.sh")
	assert.NilError(t, os.WriteFile(script, []byte(cm.Data["approve-csr.sh"]), 0o755))
	key := a.users[cleanupUser]
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+serviceAccountKubeconfig(ctx, t, c, addons.ApproverName, dir),
		"HOME="+dir, "TMPDIR="+dir, "BOOTSTRAP_GROUP="+env["BOOTSTRAP_GROUP"], "CLUSTER_NAME="+env["CLUSTER_NAME"],
		"POOLS="+env["POOLS"], "AWS_ACCESS_KEY_ID="+key.Key, "AWS_SECRET_ACCESS_KEY="+key.Secret,
		"AWS_DEFAULT_REGION="+env["AWS_DEFAULT_REGION"], "EC2_ENDPOINT_URL="+a.url)
	// Its own process group, so that stopping it stops the watch and jq with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A file, not a pipe: Wait then waits for the script only, not for whatever holds a copy of its output.
	p := &approverProcess{cmd: cmd, logFile: filepath.Join(dir, "approver.log")}
	out, err := os.Create(p.logFile)
	assert.NilError(t, err)
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	assert.NilError(t, cmd.Start())
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("approver log:\n%s", p.log())
		}
	})
	return p
}

// stop ends the script as the kubelet ends its container: SIGTERM (to its process group), and SIGKILL after a
// grace period of 10 s.
func (p *approverProcess) stop(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		ps, _ := exec.Command("ps", "-o", "pid,pgid,stat,cmd", "-g", fmt.Sprint(p.cmd.Process.Pid)).CombinedOutput()
		t.Errorf("the approver did not stop on SIGTERM within 10 s:\n%s\n%s", ps, p.log())
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// renderedEnv is the plain environment of the first container of a rendered workload manifest.
func renderedEnv(t *testing.T, file string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(file)
	assert.NilError(t, err)
	var w struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Env []struct{ Name, Value string }
					}
				}
			}
		}
	}
	if err := yaml.Unmarshal(raw, &w); err != nil || len(w.Spec.Template.Spec.Containers) == 0 {
		t.Fatalf("%s: %v", file, err)
	}
	env := map[string]string{}
	for _, e := range w.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	return env
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

// waitCSRDecided waits up to 20 s for a CSR's Approved or Denied condition.
func waitCSRDecided(ctx context.Context, t *testing.T, c cluster, name string, ap *approverProcess) csrResult {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := csrState(ctx, t, c, name)
		if r.decision != "" {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSR %s undecided after 20 s; approver:\n%s", name, ap.log())
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

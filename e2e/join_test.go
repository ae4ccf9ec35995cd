//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The instance the fake IMDS describes.
const (
	joinTokenID      = "e2ejn1"
	joinTokenSecret  = "abcdef0123456789"
	fakeInstanceID   = "i-0123456789abcdef0"
	fakeZoneSuffix   = "a"
	fakeNodeIP       = "10.100.1.23"
	fakeInstanceType = "c7i.2xlarge"
	fakeRole         = "dynk8s-homelab-node"
)

// TestJoinDiscovery runs the node agent (built from this tree), as the dev stack renders its configuration, against the real API server:
// IMDSv2 is a loopback fake, SSM is moto_server holding the token as a SecureString, and kubeadm is the real one in
// --dry-run, so its token discovery fetches kube-public/cluster-info (signed by the real bootstrapsigner) and pins
// the CA for real. A wrong CA hash and a wrong token secret must both stop the join.
func TestJoinDiscovery(t *testing.T) {
	c := requireCluster(t)
	realKubeadm := requireTool(t, "kubeadm")
	moto := requireTool(t, "moto_server")
	requireTool(t, "curl")
	requireTool(t, "python3")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)

	cfg := devConfig(t)
	token := joinTokenID + "." + joinTokenSecret
	kubeadmInit(ctx, t, c, token)

	ssm := startMoto(ctx, t, moto)
	param := infra.JoinTokenParameter(cfg.ClusterName)
	ssm.putSecureString(t, cfg.Region, param, token)
	imds := fakeaws.NewIMDS(t, fakeRoleInstance(fakeInstanceID, cfg.Region+fakeZoneSuffix, cfg.Region, fakeNodeIP, ""))

	// The pin the stack computes when kubernetes.caCertHash is unset: from kube-public/cluster-info, as written by the
	// real kubeadm. kubeadm's own discovery below accepting it is the proof that the two agree.
	caHash := clusterInfoCAHash(ctx, t, c)
	if want := fileCAHash(t, c.CAFile); caHash != want {
		t.Fatalf("hash from cluster-info %s, from the CA file %s", caHash, want)
	}
	// The dev stack's first pool, as the stack renders it, joining the local API server instead of the on-prem one.
	api := apiServerEndpoint(t, c)
	cfg.Kubernetes.APIServerEndpoint = api
	input := func(hash string) cloudinit.NodeInput {
		return infra.NodeInput(cfg, cfg.NodePools[0], []string{hash}, param)
	}
	node := nodeEnv{realKubeadm: realKubeadm, imds: imds.URL, ssm: ssm.url}

	t.Run("joins", func(t *testing.T) {
		run := node.join(ctx, t, input(caHash), 90)
		if run.err != nil {
			t.Fatalf("the agent's join: %v\n%s", run.err, run.output)
		}
		for _, want := range []string{
			`Resource name "cluster-info", namespace "kube-public"`,
			"This node has joined the cluster",
			"joined the cluster as " + fakeInstanceID,
		} {
			if !strings.Contains(run.output, want) {
				t.Errorf("join output lacks %q:\n%s", want, run.output)
			}
		}
		checkJoinConfiguration(t, run.joinConfig, token, cfg.Kubernetes.APIServerEndpoint.String(), caHash, cfg.Region)
		if strings.Contains(run.calls, "kubeadm reset") {
			t.Errorf("a successful join ran kubeadm reset:\n%s", run.calls)
		}
	})

	t.Run("wrong CA hash", func(t *testing.T) {
		wrong := "sha256:" + strings.Repeat("0", 64)
		run := node.join(ctx, t, input(wrong), 8)
		if run.err == nil {
			t.Fatalf("the agent's join succeeded with a wrong CA hash:\n%s", run.output)
		}
		for _, want := range []string{
			"cluster CA found in cluster-info ConfigMap is invalid: none of the public keys",
			"FAILED: kubeadm join: gave up",
		} {
			if !strings.Contains(run.output, want) {
				t.Errorf("output lacks %q:\n%s", want, run.output)
			}
		}
		// A failed join must be reset before the next attempt, or its leftovers fail the next preflight.
		if !strings.Contains(run.calls, "kubeadm reset --force") {
			t.Errorf("no kubeadm reset after the failed join:\n%s", run.calls)
		}
	})

	t.Run("wrong token secret", func(t *testing.T) {
		ssm.putSecureString(t, cfg.Region, param, joinTokenID+".ffffffffffffffff")
		defer ssm.putSecureString(t, cfg.Region, param, token)
		run := node.join(ctx, t, input(caHash), 8)
		if run.err == nil {
			t.Fatalf("the agent's join succeeded with a wrong token secret:\n%s", run.output)
		}
		for _, want := range []string{"failed to verify JWS signature", "FAILED: kubeadm join: gave up"} {
			if !strings.Contains(run.output, want) {
				t.Errorf("output lacks %q:\n%s", want, run.output)
			}
		}
	})
}

// fakeRoleInstance is an instance as the fake IMDS serves it, in a target lifecycle state ("" for none), with the
// node role's credentials shaped like real ones (moto accepts any).
func fakeRoleInstance(id, zone, region, ip, state string) fakeaws.IMDSInstance {
	return fakeaws.IMDSInstance{
		ID: id, Zone: zone, Region: region, PrivateIP: ip,
		Type: fakeInstanceType, Role: fakeRole, AccessKeyID: "ASIAE2EFAKEROLEKEY01",
		SecretAccessKey: "e2e/fake/role/secret/key/000000000000", SessionToken: "e2e-fake-session-token",
		LifecycleState: state,
	}
}

// apiServerEndpoint is the throwaway control plane's API server, as kubernetes.apiServerEndpoint names it.
func apiServerEndpoint(t *testing.T, c cluster) endpoint.HostPort {
	t.Helper()
	ep, err := endpoint.Parse(strings.TrimPrefix(c.Server, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// renderNodeUserData renders a pool's user data as the stack does, for joining the throwaway control plane: its
// endpoint (set in cfg) and the CA pin from its cluster-info.
func renderNodeUserData(ctx context.Context, t *testing.T, c cluster, cfg *config.Config, pool config.NodePool,
	param string) []byte {
	t.Helper()
	cfg.Kubernetes.APIServerEndpoint = apiServerEndpoint(t, c)
	userData, err := cloudinit.Node(infra.NodeInput(cfg, pool, []string{clusterInfoCAHash(ctx, t, c)}, param))
	if err != nil {
		t.Fatalf("render user data: %v", err)
	}
	return userData
}

// kubeadmInit does what `kubeadm init` does for joining nodes, with the real kubeadm: the bootstrap token, the
// RBAC for bootstrap tokens and anonymous cluster-info reads, and kube-public/cluster-info from the admin
// kubeconfig (server and CA, no credentials). It then waits for the bootstrapsigner to sign cluster-info with the
// token, which discovery needs.
func kubeadmInit(ctx context.Context, t *testing.T, c cluster, token string) {
	t.Helper()
	kubeadmInitGroup(ctx, t, c, token, "system:bootstrappers:kubeadm:default-node-token")
}

// kubeadmInitGroup is kubeadmInit with a token that authenticates with group rather than kubeadm's node group (the
// RBAC kubeadm creates is for its own group all the same).
func kubeadmInitGroup(ctx context.Context, t *testing.T, c cluster, token, group string) {
	t.Helper()
	id, _, _ := strings.Cut(token, ".")
	type bootstrapToken struct {
		Token  string   `json:"token"`
		TTL    string   `json:"ttl"`
		Usages []string `json:"usages"`
		Groups []string `json:"groups"`
	}
	type initConfiguration struct {
		APIVersion      string           `json:"apiVersion"`
		Kind            string           `json:"kind"`
		BootstrapTokens []bootstrapToken `json:"bootstrapTokens"`
	}
	doc, err := yaml.Marshal(initConfiguration{
		APIVersion: "kubeadm.k8s.io/v1beta4",
		Kind:       "InitConfiguration",
		BootstrapTokens: []bootstrapToken{{
			Token:  token,
			TTL:    "1h",
			Usages: []string{"signing", "authentication"},
			Groups: []string{group},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "init.yaml")
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, "kubeadm", "init", "phase", "bootstrap-token",
		"--kubeconfig", c.Kubeconfig, "--config", path, "--skip-token-print").CombinedOutput()
	if err != nil {
		t.Fatalf("kubeadm init phase bootstrap-token: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// Only the token: cluster-info and the RBAC are what any kubeadm cluster has.
		_, _ = c.kubectl(context.Background(), "-n", "kube-system", "delete", "secret", "bootstrap-token-"+id)
	})

	deadline := time.Now().Add(30 * time.Second)
	for {
		var cm struct {
			Data map[string]string `json:"data"`
		}
		err := c.getJSON(ctx, &cm, "configmap.v1.", "cluster-info", "-n", "kube-public")
		if err == nil && cm.Data["jws-kubeconfig-"+id] != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster-info not signed for token %s after 30 s (is the bootstrapsigner controller on?): %v",
				id, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// clusterInfoCAHash is infra.CACertHashFromKubeconfig over the cluster's real kube-public/cluster-info.
func clusterInfoCAHash(ctx context.Context, t *testing.T, c cluster) string {
	t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := c.getJSON(ctx, &cm, "configmap.v1.", "cluster-info", "-n", "kube-public"); err != nil {
		t.Fatal(err)
	}
	h, err := infra.CACertHashFromKubeconfig(cm.Data["kubeconfig"])
	if err != nil {
		t.Fatalf("cluster-info: %v", err)
	}
	return h
}

// fileCAHash is kubeadm's CA pin computed independently: sha256 of the CA certificate's DER SubjectPublicKeyInfo.
func fileCAHash(t *testing.T, caFile string) string {
	t.Helper()
	raw, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		t.Fatalf("%s: no PEM block", caFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", caFile, err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// keepEtcKubernetesClean removes what kubeadm's dry run leaves on this machine: it always makes its temp dir under
// /etc/kubernetes/tmp, whatever the flags.
func keepEtcKubernetesClean(t *testing.T) {
	t.Helper()
	const dir = "/etc/kubernetes"
	existed := map[string]bool{}
	for _, d := range []string{dir, dir + "/tmp"} {
		if _, err := os.Stat(d); err == nil {
			existed[d] = true
		}
	}
	before, _ := filepath.Glob(dir + "/tmp/kubeadm-join-dryrun*")
	t.Cleanup(func() {
		after, _ := filepath.Glob(dir + "/tmp/kubeadm-join-dryrun*")
		for _, d := range after {
			if !slices.Contains(before, d) {
				if err := os.RemoveAll(d); err != nil {
					t.Logf("clean up %s: %v", d, err)
				}
			}
		}
		for _, d := range []string{dir + "/tmp", dir} {
			if !existed[d] {
				_ = os.Remove(d) // only if empty: never anything kubeadm did not make for this test
			}
		}
	})
}

// nodeEnv runs the node agent's join as a node would, with stand-ins for what only an EC2 instance has.
type nodeEnv struct {
	realKubeadm string
	imds, ssm   string
}

type joinRun struct {
	err        error
	output     string
	joinConfig []byte
	calls      string
}

// join renders the pool's user data for in, writes its files under a fresh root and runs the agent's join there with
// a deadline of deadlineSeconds.
func (n nodeEnv) join(ctx context.Context, t *testing.T, in cloudinit.NodeInput, deadlineSeconds int) joinRun {
	t.Helper()
	userData, err := cloudinit.Node(in)
	if err != nil {
		t.Fatalf("render user data: %v", err)
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	writeUserDataFiles(t, userData, root)

	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	stubs, err := filepath.Abs(filepath.Join("testdata", "stubs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dnf", "rpm", "systemctl", "logger", "modprobe", "sysctl", "crictl"} {
		if err := os.Symlink(filepath.Join(stubs, "record"), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(stubs, "kubeadm"), filepath.Join(bin, "kubeadm")); err != nil {
		t.Fatal(err)
	}

	// kubeadm runs with --dry-run here and ignores its preflight; the agent's own check of IP forwarding reads this
	// instead of the test machine's /proc, whose setting is not the test's to change.
	proc := filepath.Join(dir, "proc")
	if err := os.MkdirAll(filepath.Join(proc, "sys/net/ipv4"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "sys/net/ipv4/ip_forward"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	callLog := filepath.Join(dir, "calls.log")
	joinCopy := filepath.Join(dir, "join-config.yaml")
	cmd := exec.CommandContext(ctx, nodetest.BuiltAgent(t), "join")
	cmd.Env = append(os.Environ(),
		"PATH="+bin+":"+os.Getenv("PATH"),
		"DYNK8S_ROOT="+root,
		"DYNK8S_IMDS_ENDPOINT="+n.imds,
		"DYNK8S_SSM_ENDPOINT="+n.ssm,
		// moto answers every service on one port; a failed boot hands the instance back through it, never AWS.
		"DYNK8S_AUTOSCALING_ENDPOINT="+n.ssm,
		"DYNK8S_PROC="+proc,
		"DYNK8S_DEADLINE_SECONDS="+strconv.Itoa(deadlineSeconds),
		"DYNK8S_BACKOFF_MAX_MS=1000",
		"STUB_LOG="+callLog,
		"REAL_KUBEADM="+n.realKubeadm,
		"JOIN_CONFIG_COPY="+joinCopy,
	)
	out, err := cmd.CombinedOutput()
	run := joinRun{err: err, output: string(out)}
	run.joinConfig, _ = os.ReadFile(joinCopy)
	calls, _ := os.ReadFile(callLog)
	run.calls = string(calls)
	return run
}

// writeUserDataFiles writes the cloud-config's write_files under root, with their modes, as cloud-init would on the
// node.
func writeUserDataFiles(t *testing.T, userData []byte, root string) {
	t.Helper()
	if err := cloudinit.WriteFiles(userData, root); err != nil {
		t.Fatalf("user data: %v", err)
	}
}

// checkJoinConfiguration reads back the JoinConfiguration the agent handed to kubeadm.
func checkJoinConfiguration(t *testing.T, doc []byte, token, endpoint, caHash, region string) {
	t.Helper()
	var jc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Discovery  struct {
			BootstrapToken struct {
				APIServerEndpoint string   `json:"apiServerEndpoint"`
				Token             string   `json:"token"`
				CACertHashes      []string `json:"caCertHashes"`
			} `json:"bootstrapToken"`
		} `json:"discovery"`
		NodeRegistration struct {
			CRISocket        string `json:"criSocket"`
			KubeletExtraArgs []struct {
				Name  string `json:"name"`
				Value string `json:"value"`
			} `json:"kubeletExtraArgs"`
		} `json:"nodeRegistration"`
	}
	if len(doc) == 0 {
		t.Fatal("kubeadm was never given a JoinConfiguration")
	}
	if err := yaml.Unmarshal(doc, &jc); err != nil {
		t.Fatalf("JoinConfiguration: %v\n%s", err, doc)
	}
	d := jc.Discovery.BootstrapToken
	if jc.APIVersion != "kubeadm.k8s.io/v1beta4" || jc.Kind != "JoinConfiguration" {
		t.Errorf("JoinConfiguration is %s %s", jc.APIVersion, jc.Kind)
	}
	if d.Token != token || d.APIServerEndpoint != endpoint || !slices.Equal(d.CACertHashes, []string{caHash}) {
		t.Errorf("discovery %+v, want token from SSM, endpoint %s, hashes [%s]", d, endpoint, caHash)
	}
	args := map[string]string{}
	for _, a := range jc.NodeRegistration.KubeletExtraArgs {
		args[a.Name] = a.Value
	}
	zone := region + fakeZoneSuffix
	if want := "aws:///" + zone + "/" + fakeInstanceID; args["provider-id"] != want {
		t.Errorf("provider-id %q, want %q", args["provider-id"], want)
	}
	if args["node-ip"] != fakeNodeIP {
		t.Errorf("node-ip %q, want %q", args["node-ip"], fakeNodeIP)
	}
	for _, want := range []string{"topology.kubernetes.io/zone=" + zone, "topology.kubernetes.io/region=" + region,
		"node.kubernetes.io/instance-type=" + fakeInstanceType} {
		if !slices.Contains(strings.Split(args["node-labels"], ","), want) {
			t.Errorf("node-labels %q lack %q", args["node-labels"], want)
		}
	}
}

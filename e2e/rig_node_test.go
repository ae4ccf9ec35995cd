//go:build e2e

package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The node rig: a pool's user data rendered as the stack does for the throwaway control plane, the control plane set
// up as `kubeadm init` leaves it for joining nodes, the fake instance IMDS describes, the built agent's join under a
// temp root (nodeEnv), and a node with the real kubelet in namespaces of its own (bootNode).

// The instance the fake IMDS describes.
const (
	fakeInstanceID   = "i-0123456789abcdef0"
	fakeZoneSuffix   = "a"
	fakeNodeIP       = "10.100.1.23"
	fakeInstanceType = "c7i.2xlarge"
	fakeRole         = "dynk8s-homelab-node"
)

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
	assert.NilError(t, err)
	return ep
}

// renderNodeUserData renders a pool's user data as the stack does, for joining the throwaway control plane: its
// endpoint (set in cfg) and the CA pin from its cluster-info.
func renderNodeUserData(ctx context.Context, t *testing.T, c cluster, cfg *config.Config, pool config.NodePool,
	param string) []byte {
	t.Helper()
	cfg.Kubernetes.APIServerEndpoint = apiServerEndpoint(t, c)
	userData, err := cloudinit.Node(infra.NodeConfig(cfg, pool, []string{clusterInfoCAHash(ctx, t, c)}, param))
	assert.NilError(t, err, "render user data")
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
	assert.NilError(t, err)
	path := filepath.Join(t.TempDir(), "init.yaml")
	assert.NilError(t, os.WriteFile(path, doc, 0o600))
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
	assert.NilError(t, c.getJSON(ctx, &cm, "configmap.v1.", "cluster-info", "-n", "kube-public"))
	h, err := infra.CACertHashFromKubeconfig(cm.Data["kubeconfig"])
	assert.NilError(t, err, "cluster-info")
	return h
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
	// imds, ssm and ec2 are the endpoints the agent reaches (ec2: the join's kubelet key mark).
	imds, ssm, ec2 string
}

type joinRun struct {
	err        error
	output     string
	joinConfig []byte
	calls      string
}

// poolNode is a pool's node.json and user data beside it as the stack builds them (infra.NodeConfig).
type poolNode struct {
	node   nodeconfig.Node
	render cloudinit.NodeRender
}

// stackNode is pool's as the stack builds it, pinning the cluster CA by caHashes and reading the join token from param.
func stackNode(cfg *config.Config, pool config.NodePool, caHashes []string, param string) poolNode {
	node, render := infra.NodeConfig(cfg, pool, caHashes, param)
	return poolNode{node, render}
}

// userData is the pool's user data as the stack renders it.
func (p poolNode) userData(t *testing.T) []byte {
	t.Helper()
	userData, err := cloudinit.Node(p.node, p.render)
	assert.NilError(t, err, "render user data")
	return userData
}

// join renders the pool's user data for in, writes its files under a fresh root and runs the agent's join there with
// a deadline of deadlineSeconds.
func (n nodeEnv) join(ctx context.Context, t *testing.T, in poolNode, deadlineSeconds int) joinRun {
	t.Helper()
	userData := in.userData(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	writeUserDataFiles(t, userData, root)

	bin := filepath.Join(dir, "bin")
	assert.NilError(t, os.MkdirAll(bin, 0o755))
	stubs, err := filepath.Abs(filepath.Join("testdata", "stubs"))
	assert.NilError(t, err)
	for _, name := range []string{"dnf", "rpm", "systemctl", "logger", "modprobe", "sysctl", "crictl"} {
		assert.NilError(t, os.Symlink(filepath.Join(stubs, "record"), filepath.Join(bin, name)))
	}
	assert.NilError(t, os.Symlink(filepath.Join(stubs, "kubeadm"), filepath.Join(bin, "kubeadm")))

	// kubeadm runs with --dry-run here and ignores its preflight; the agent's own check of IP forwarding reads this
	// instead of the test machine's /proc, whose setting is not the test's to change.
	proc := filepath.Join(dir, "proc")
	assert.NilError(t, os.MkdirAll(filepath.Join(proc, "sys/net/ipv4"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(proc, "sys/net/ipv4/ip_forward"), []byte("1\n"), 0o644))

	callLog := filepath.Join(dir, "calls.log")
	joinCopy := filepath.Join(dir, "join-config.yaml")
	// The pool's build cache needs EBS and a block device, which this root has not: the burst's boxes run the cache
	// phase (rig_volumes_test.go); here it is left out as an operator would (--skip).
	cmd := exec.CommandContext(ctx, nodetest.BuiltAgent(t), "join", "--skip=cache")
	cmd.Env = append(os.Environ(),
		"PATH="+bin+":"+os.Getenv("PATH"),
		"DYNK8S_ROOT="+root,
		"DYNK8S_IMDS_ENDPOINT="+n.imds,
		"DYNK8S_SSM_ENDPOINT="+n.ssm,
		"DYNK8S_EC2_ENDPOINT="+n.ec2,
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
	assert.NilError(t, cloudinit.WriteFiles(userData, root), "user data")
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

// agentDir is a build directory (infra.AgentDir's layout) whose every architecture's agent is nodetest.BuiltAgent, this
// machine's build: a plan run with it pins the binary a box binds in place, whatever the stack's architectures.
func agentDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		assert.NilError(t, os.Symlink(nodetest.BuiltAgent(t), filepath.Join(dir, "dynk8s-node-linux-"+arch)))
	}
	return dir
}

// hasBootstrap says whether userData installs the agent itself (dynk8s-agent.service).
func hasBootstrap(t *testing.T, userData []byte) bool {
	t.Helper()
	files, err := cloudinit.Files(userData)
	assert.NilError(t, err, "user data")
	return slices.ContainsFunc(files, func(f cloudinit.File) bool {
		return f.Path == "/etc/systemd/system/dynk8s-agent.service"
	})
}

// kubeadmUploadConfig does the two `kubeadm init` phases a joining worker reads from: kube-system/kubeadm-config
// (the ClusterConfiguration) and kube-system/kubelet-config (the cluster-wide KubeletConfiguration), with their
// RBAC. The kubelet settings are what this machine needs: cgroupfs (no systemd), cgroup v1 allowed (kubelet 1.34
// still runs on it), swap tolerated; and a resolvConf the node's own patch overrides.
func kubeadmUploadConfig(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	u, err := url.Parse(c.Server)
	assert.NilError(t, err)
	docs := []map[string]any{
		{
			"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
			// Without a socket kubeadm looks for a runtime on this machine, and there is none outside the node.
			"nodeRegistration": map[string]any{"criSocket": "unix:///var/run/crio/crio.sock"},
		},
		{
			"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
			"kubernetesVersion": "v1.34.4", "controlPlaneEndpoint": u.Host,
			"networking": map[string]any{"podSubnet": "10.244.0.0/16", "serviceSubnet": "10.96.0.0/12"},
		},
		{
			"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
			"cgroupDriver": "cgroupfs", "failSwapOn": false, "failCgroupV1": false,
			// What a cluster initialised on a host without systemd-resolved may pin; the node's kubeadm patch must
			// win over it.
			"resolvConf": "/etc/resolv.conf",
		},
	}
	var b strings.Builder
	for _, d := range docs {
		y, err := yaml.Marshal(d)
		assert.NilError(t, err)
		b.WriteString("---\n")
		b.Write(y)
	}
	path := filepath.Join(t.TempDir(), "init.yaml")
	assert.NilError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	for _, phase := range []string{"kubeadm", "kubelet"} {
		out, err := exec.CommandContext(ctx, "kubeadm", "init", "phase", "upload-config", phase,
			"--kubeconfig", c.Kubeconfig, "--config", path).CombinedOutput()
		if err != nil {
			t.Fatalf("kubeadm init phase upload-config %s: %v\n%s", phase, err, out)
		}
	}
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "kube-system", "delete", "configmap", "kubeadm-config",
			"kubelet-config", "--ignore-not-found")
	})
}

// node is the booted instance: a node.sh process in namespaces of its own, and loopback forwarders inside its
// network namespace to the test's servers.
type node struct {
	pid      int
	dir      string // node.sh's NODE_DIR: logs, containerd's state, /var/lib/kubelet
	root     string // the agent's DYNK8S_ROOT: the user data's files; its etc/kubernetes is the node's
	bin      string
	hostname string
	env      []string
}

// bootNode writes the user data's files, starts node.sh (see its header) in new network, mount and UTS namespaces,
// and forwards each server's loopback port from inside the node's network namespace to the test's. The servers are
// the API server, IMDS, moto for SSM (and Auto Scaling), and optionally a fourth for EC2 (the join's kubelet key
// mark, CreateTags on its own instance; without it, the SSM moto).
func bootNode(ctx context.Context, t *testing.T, userData []byte, realKubeadm string, servers []string) *node {
	t.Helper()
	// Removed after the cleanups below (they run last-in first-out), so after the node has stopped.
	dir := t.TempDir()
	n := &node{dir: dir, root: filepath.Join(dir, "root"), bin: filepath.Join(dir, "bin"),
		hostname: "ip-" + strings.ReplaceAll(fakeNodeIP, ".", "-") + ".e2e.internal"}
	writeUserDataFiles(t, userData, n.root)
	// The agent writes the kubelet's bootstrap key under its DYNK8S_ROOT (/var/lib/kubelet/pki/kubelet-client.key.tmp),
	// where the kubelet in the node's namespaces, which kubeadm starts, must read it: the node's /var/lib/kubelet
	// (node.sh mounts var-lib-kubelet there) is the agent's too.
	varLibKubelet := filepath.Join(dir, "var-lib-kubelet")
	if _, err := os.Stat(filepath.Join(n.root, "var/lib/kubelet")); err == nil {
		assert.NilError(t, os.Rename(filepath.Join(n.root, "var/lib/kubelet"), varLibKubelet))
	}
	assert.NilError(t, os.MkdirAll(filepath.Join(n.root, "var/lib"), 0o755))
	assert.NilError(t, os.Symlink(varLibKubelet, filepath.Join(n.root, "var/lib/kubelet")))
	for _, d := range []string{n.bin, filepath.Join(n.root, "etc/kubernetes"), varLibKubelet,
		filepath.Join(dir, "run-crio"), filepath.Join(dir, "cni")} {
		assert.NilError(t, os.MkdirAll(d, 0o755))
	}
	stubs, err := filepath.Abs(filepath.Join("testdata", "stubs"))
	assert.NilError(t, err)
	for name, stub := range map[string]string{"dnf": "record", "rpm": "record", "systemctl": "record",
		"logger": "record", "modprobe": "record", "sysctl": "record", "crictl": "record", "kubeadm": "kubeadm-real"} {
		assert.NilError(t, os.Symlink(filepath.Join(stubs, stub), filepath.Join(n.bin, name)))
	}
	writeContainerdConfig(t, dir)
	for _, p := range []string{"/etc/kubernetes", "/var/lib/kubelet", "/run/crio"} {
		mountPoint(t, p)
	}
	cleanKubepodsCgroups(t)

	nodeSh, err := filepath.Abs(filepath.Join("testdata", "node.sh"))
	assert.NilError(t, err)
	cmd := exec.Command("unshare", "--net", "--mount", "--uts", "--propagation", "private", "--", "bash", nodeSh)
	cmd.Env = append(os.Environ(), "NODE_DIR="+dir, "NODE_ETC_KUBERNETES="+filepath.Join(n.root, "etc/kubernetes"),
		"NODE_IP="+fakeNodeIP, "NODE_HOSTNAME="+n.hostname, "KUBELET_WAIT_SECONDS=150")
	logs := &nodetest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	assert.NilError(t, cmd.Start(), "start node.sh")
	n.pid = cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("node.sh still running 30 s after SIGTERM; killing it")
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("node.sh output:\n%s\ncontainerd log (tail):\n%s\nkubelet log (tail):\n%s", logs.String(),
				tailFile(filepath.Join(dir, "containerd.log"), 30), n.kubeletLog())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
			break
		}
		select {
		case <-done:
			t.Fatalf("node.sh exited during start-up:\n%s", logs.String())
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("node.sh not ready after 20 s:\n%s", logs.String())
		}
	}
	for _, s := range servers {
		u, err := url.Parse(s)
		assert.NilError(t, err)
		forwardIntoNetns(t, n.pid, u.Host)
	}

	n.env = append(os.Environ(),
		"PATH="+n.bin+":"+os.Getenv("PATH"),
		"DYNK8S_ROOT="+n.root,
		"DYNK8S_IMDS_ENDPOINT="+servers[1],
		"DYNK8S_SSM_ENDPOINT="+servers[2],
		// moto answers every service on one port; a failed boot hands the instance back through it, never AWS.
		"DYNK8S_AUTOSCALING_ENDPOINT="+servers[2],
		"DYNK8S_EC2_ENDPOINT="+servers[min(3, len(servers)-1)],
		"DYNK8S_BACKOFF_MAX_MS=1000",
		"STUB_LOG="+filepath.Join(dir, "calls.log"),
		"REAL_KUBEADM="+realKubeadm,
	)
	return n
}

// join runs the node agent's join inside the node's namespaces, as the join unit would, with a deadline.
func (n *node) join(ctx context.Context, t *testing.T, deadlineSeconds int) joinRun {
	t.Helper()
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(n.pid), "-n", "-m", "-u", "--",
		nodetest.BuiltAgent(t), "join")
	cmd.Env = append(slices.Clone(n.env), "DYNK8S_DEADLINE_SECONDS="+strconv.Itoa(deadlineSeconds))
	out, err := cmd.CombinedOutput()
	return joinRun{err: err, output: string(out)}
}

// hostPath is where a file under the node's /var/lib/kubelet is on the host, following one symlink as the node
// would (the kubelet's current client certificate is an absolute symlink to a dated file).
func (n *node) hostPath(t *testing.T, nodePath string) string {
	t.Helper()
	const mount = "/var/lib/kubelet/"
	onHost := func(p string) string {
		rel, ok := strings.CutPrefix(p, mount)
		if !ok {
			t.Fatalf("%s is not under the node's %s", p, mount)
		}
		return filepath.Join(n.dir, "var-lib-kubelet", rel)
	}
	p := onHost(nodePath)
	if target, err := os.Readlink(p); err == nil {
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(nodePath), target)
		}
		return onHost(target)
	}
	return p
}

func (n *node) calls(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.dir, "calls.log"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

func (n *node) kubeletLog() string {
	return tailFile(filepath.Join(n.dir, "kubelet.log"), 40)
}

// tailFile is the last lines of a file, or why it cannot be read.
func tailFile(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), lines)
}

// writeContainerdConfig configures containerd as the node's runtime: its socket where CRI-O's is (the path the
// rendered JoinConfiguration names), every directory under dir, cgroupfs, Debian's CNI plugins with a bridge
// network (the kubelet reports NetworkReady only once a CNI config is loaded; no pod is run, so no bridge is made).
// restrict_oom_score_adj: without CAP_SYS_RESOURCE (as in some VMs) runc cannot lower a sandbox's oom_score_adj.
func writeContainerdConfig(t *testing.T, dir string) {
	t.Helper()
	conf := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = "/run/crio/crio.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = %[3]q
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[4]q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
`, filepath.Join(dir, "containerd/root"), filepath.Join(dir, "containerd/state"), filepath.Join(dir, "containerd/opt"),
		filepath.Join(dir, "cni"))
	cni := `{"cniVersion": "0.4.0", "name": "e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
  {"type": "loopback"}]}
`
	for path, content := range map[string]string{
		filepath.Join(dir, "containerd.toml"):           conf,
		filepath.Join(dir, "cni", "10-bridge.conflist"): cni,
	} {
		assert.NilError(t, os.WriteFile(path, []byte(content), 0o644))
	}
}

// mountPoint makes an empty directory for node.sh to mount on, and removes it again if this test made it.
func mountPoint(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		return
	}
	var made []string
	for p := path; p != "/"; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		made = append(made, p)
	}
	assert.NilError(t, os.MkdirAll(path, 0o755))
	t.Cleanup(func() {
		for _, p := range made {
			_ = os.Remove(p) // only if still empty
		}
	})
}

// cleanKubepodsCgroups removes, after the test, the kubepods cgroups the kubelet (cgroupfs driver) made on the host
// if they were not there before: they outlive the kubelet, and a second run would inherit them.
func cleanKubepodsCgroups(t *testing.T) {
	t.Helper()
	before, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	t.Cleanup(func() {
		after, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
		for _, root := range after {
			if !slices.Contains(before, root) {
				removeCgroupTree(t, root)
			}
		}
	})
}

func waitNodeReady(ctx context.Context, t *testing.T, c cluster, name string, timeout time.Duration, n *node) kubeNode {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var kn kubeNode
		err := c.getJSON(ctx, &kn, "node", name)
		if err == nil && kn.ready() {
			return kn
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not Ready after %s: %v %+v\nkubelet log:\n%s", name, timeout, err, kn.Status.Conditions,
				n.kubeletLog())
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// checkKubeletClientCert proves the TLS bootstrap: the kubelet's client certificate names the node and is signed
// by the cluster CA (the controller manager's signer, after the auto-approval kubeadm's RBAC allows).
func checkKubeletClientCert(t *testing.T, certFile, caFile, wantCN string) {
	t.Helper()
	cert := readCert(t, certFile)
	ca := readCert(t, caFile)
	if cert.Subject.CommonName != wantCN || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("kubelet client certificate subject %s, want CN=%s O=system:nodes", cert.Subject, wantCN)
	}
	assert.Check(t, cert.CheckSignatureFrom(ca), "kubelet client certificate not signed by the cluster CA")
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	raw, err := os.ReadFile(path)
	assert.NilError(t, err)
	for {
		var block *pem.Block
		block, raw = pem.Decode(raw)
		if block == nil {
			t.Fatalf("%s: no certificate", path)
		}
		if block.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(block.Bytes)
			assert.NilError(t, err, path)
			return cert
		}
	}
}

// checkJoinedNode asserts what the node registered with: the provider ID and node IP from IMDS, the pool's labels
// and taints.
func checkJoinedNode(t *testing.T, node kubeNode, cfg *config.Config, pool config.NodePool, zone string) {
	t.Helper()
	if want := "aws:///" + zone + "/" + fakeInstanceID; node.Spec.ProviderID != want {
		t.Errorf("providerID %q, want %q", node.Spec.ProviderID, want)
	}
	var internal []string
	for _, a := range node.Status.Addresses {
		if a.Type == "InternalIP" {
			internal = append(internal, a.Address)
		}
	}
	if !slices.Equal(internal, []string{fakeNodeIP}) {
		t.Errorf("InternalIP %v, want [%s]", internal, fakeNodeIP)
	}
	// The pool's labels as the config states them, plus the per-instance ones from IMDS.
	want := pool.NodeLabels()
	want[kube.LabelRegion] = cfg.Region
	want["topology.kubernetes.io/zone"] = zone
	want[kube.LabelInstanceType] = fakeInstanceType
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got, ok := node.Metadata.Labels[k]; !ok || got != want[k] {
			t.Errorf("label %s=%q, want %q (labels %v)", k, got, want[k], node.Metadata.Labels)
		}
	}
	// Every pool taint and, with fuse on, the fuse startup taint (a kubelet may register with it under
	// NodeRestriction; no plugin runs here to lift it), and nothing else but the node lifecycle controller's
	// own (node.kubernetes.io/...).
	wantTaints := slices.Clone(pool.Taints)
	if cfg.Fuse.Enabled {
		wantTaints = append(wantTaints, kube.FuseStartupTaint)
	}
	var extra []string
	for _, tt := range node.Spec.Taints {
		if !slices.Contains(wantTaints, tt) && !strings.HasPrefix(tt.Key, "node.kubernetes.io/") {
			extra = append(extra, tt.String())
		}
	}
	for _, tt := range wantTaints {
		if !slices.Contains(node.Spec.Taints, tt) {
			t.Errorf("taint %s missing (taints %v)", tt, node.Spec.Taints)
		}
	}
	if len(extra) > 0 {
		t.Errorf("taints the pool does not declare: %v", extra)
	}
}

// fakeRoleEC2 is an EC2 for the join's kubelet key mark (CreateTags on its own instance), taking requests signed with
// the role's credentials, that knows the instance.
func fakeRoleEC2(t *testing.T, region string, role fakeaws.IMDSInstance) *fakeaws.EC2 {
	t.Helper()
	return fakeaws.NewEC2(t, fakeaws.SigV4{Region: region, Credentials: aws.Credentials{
		AccessKeyID: role.AccessKeyID, SecretAccessKey: role.SecretAccessKey, SessionToken: role.SessionToken}},
		fakeaws.EC2Instance{ID: role.ID, State: "running"})
}

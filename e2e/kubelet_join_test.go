//go:build e2e

package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// A token of its own, so that this test and TestJoinDiscovery never share or delete each other's.
const (
	kubeletTokenID     = "e2ekl1"
	kubeletTokenSecret = "0123456789abcdef"
)

// TestKubeletJoin boots the stack's rendered user data on a real node: the real node agent (dnf, rpm and systemctl are
// recording stand-ins, since kubeadm, the kubelet and the runtime are already here), the real `kubeadm join` (no
// preflight check ignored) and the real kubelet on Debian's containerd, in network, mount and UTS namespaces of
// their own, against the throwaway control plane set up as kubeadm sets up a cluster (hack/start-kube.sh, and the
// `kubeadm init` phases a worker needs). IMDSv2 is the loopback fake, SSM is moto. The node must register with the pool's labels and taints, the
// provider ID and node IP from IMDS, get a client certificate signed by the cluster CA and become Ready; a second
// boot must do nothing; the same boot with a wrong token must not join.
//
// Not covered: CRI-O (not in Debian; containerd stands in behind the same CRI socket path), the join unit's
// ExecStartPre steps (modprobe, sysctl, swapoff) and systemd itself (the agent's own modprobe, sysctl and image
// pre-pull are recorded stand-ins too: they would change this machine), pods on the node (no registry here), and
// whether AWS accepts the hand-back of a failed instance (moto stands in; the script tests check the calls).
func TestKubeletJoin(t *testing.T) {
	c := requireCluster(t)
	realKubeadm := requireTool(t, "kubeadm")
	moto := requireTool(t, "moto_server")
	for _, tool := range []string{"kubelet", "containerd", "unshare", "nsenter", "ip", "curl", "python3"} {
		requireTool(t, tool)
	}
	if os.Geteuid() != 0 {
		missing(t, "root (namespaces and mounts)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)

	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	token := kubeletTokenID + "." + kubeletTokenSecret
	kubeadmInit(ctx, t, c, token)
	kubeadmUploadConfig(ctx, t, c)

	ssm := startMoto(ctx, t, moto)
	param := infra.JoinTokenParameter(cfg.ClusterName)
	zone := cfg.Region + fakeZoneSuffix
	imds := fakeaws.NewIMDS(t, fakeRoleInstance(fakeInstanceID, zone, cfg.Region, fakeNodeIP, ""))
	userData := renderNodeUserData(ctx, t, c, cfg, pool, param)

	n := bootNode(ctx, t, userData, realKubeadm, []string{c.Server, imds.URL, ssm.url})
	// The JoinConfiguration names the Node after its instance, whatever the hostname.
	nodeName := fakeInstanceID
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "delete", "node", nodeName, "--ignore-not-found", "--wait=false")
	})

	t.Run("wrong token is refused", func(t *testing.T) {
		// Negative control: the same boot, with an SSM parameter holding the token ID and a wrong secret.
		ssm.putSecureString(t, cfg.Region, param, kubeletTokenID+".ffffffffffffffff")
		run := n.join(ctx, t, 8)
		ssm.putSecureString(t, cfg.Region, param, token)
		if run.err == nil {
			t.Fatalf("the agent's join succeeded with a wrong token:\n%s", run.output)
		}
		checkRefusedJoin(t, run.output)
		// The agent's cleanup after each failed attempt (recorded only: see testdata/stubs/kubeadm-real).
		if !strings.Contains(n.calls(t), "kubeadm reset --force") {
			t.Errorf("no kubeadm reset after the refused join:\n%s", n.calls(t))
		}
		if _, err := os.Stat(filepath.Join(n.root, "etc/kubernetes/kubelet.conf")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("kubelet.conf after a refused join: %v", err)
		}
		if out, err := c.kubectl(ctx, "get", "node", nodeName, "--ignore-not-found", "-o", "name"); err != nil ||
			out != "" {
			t.Errorf("a node registered with a wrong token: %q %v", out, err)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("joins and becomes Ready", func(t *testing.T) {
		start := time.Now()
		run := n.join(ctx, t, 90)
		if run.err != nil {
			t.Fatalf("the agent's join: %v\n%s\nkubelet log:\n%s", run.err, run.output, n.kubeletLog())
		}
		for _, want := range []string{"This node has joined the cluster", "joined the cluster as " + fakeInstanceID} {
			if !strings.Contains(run.output, want) {
				t.Errorf("join output lacks %q:\n%s", want, run.output)
			}
		}
		for _, l := range strings.Split(run.output, "\n") {
			if strings.Contains(l, "WARNING") {
				t.Logf("kubeadm: %s", strings.TrimSpace(l))
			}
		}
		node := waitNodeReady(ctx, t, c, nodeName, 60*time.Second, n)
		t.Logf("node %s Ready %.1f s after the agent's join started", nodeName, time.Since(start).Seconds())

		checkJoinedNode(t, node, cfg, pool, zone)
		checkKubeletClientCert(t, n.hostPath(t, "/var/lib/kubelet/pki/kubelet-client-current.pem"), c.CAFile,
			"system:node:"+nodeName)
		checkKubeletPatched(t, n)
	})
	if t.Failed() {
		return
	}

	t.Run("second boot does nothing", func(t *testing.T) {
		var before kubeNode
		if err := c.getJSON(ctx, &before, "node", nodeName); err != nil {
			t.Fatal(err)
		}
		calls := n.calls(t)
		// The join unit never starts once kubelet.conf exists; the agent's join itself checks the same file.
		unit := readUserDataFile(t, userData, "/etc/systemd/system/dynk8s-join.service")
		if !strings.Contains(unit, "\nConditionPathExists=!/etc/kubernetes/kubelet.conf\n") {
			t.Errorf("the join unit has no condition on kubelet.conf:\n%s", unit)
		}
		if _, err := os.Stat(filepath.Join(n.root, "etc/kubernetes/kubelet.conf")); err != nil {
			t.Errorf("after the join: %v", err)
		}
		run := n.join(ctx, t, 30)
		if run.err != nil {
			t.Fatalf("second join: %v\n%s", run.err, run.output)
		}
		if !strings.Contains(run.output, "already joined") {
			t.Errorf("second run output lacks %q:\n%s", "already joined", run.output)
		}
		// Only its log line: no package manager, no systemctl, no kubeadm.
		for _, call := range strings.Split(strings.TrimSpace(strings.TrimPrefix(n.calls(t), calls)), "\n") {
			if call != "" && !strings.HasPrefix(call, "logger ") {
				t.Errorf("second run called %s", call)
			}
		}
		var after kubeNode
		if err := c.getJSON(ctx, &after, "node", nodeName); err != nil {
			t.Fatal(err)
		}
		if after.Metadata.UID != before.Metadata.UID || !after.ready() {
			t.Errorf("node after the second run: uid %s (was %s), ready %v", after.Metadata.UID, before.Metadata.UID,
				after.ready())
		}
	})
}

// checkRefusedJoin: a join refused for its token gives up with kubeadm's reason and a failed timeline, and is not
// handed back to its group (a fault every instance meets would become a replace loop): the autoscaler retires the
// instance once its provision time is up.
func checkRefusedJoin(t *testing.T, output string) {
	t.Helper()
	for _, want := range []string{"failed to verify JWS signature", "FAILED: kubeadm join: gave up",
		"timeline: result=failed"} {
		if !strings.Contains(output, want) {
			t.Errorf("output lacks %q:\n%s", want, output)
		}
	}
	if strings.Contains(output, "Unhealthy") {
		t.Errorf("the failed join handed the instance back:\n%s", output)
	}
}

// checkKubeletPatched asserts the node's own kubelet settings, which kubeadm patched in over the cluster's
// kubelet-config (whose resolvConf kubeadmUploadConfig pins elsewhere).
func checkKubeletPatched(t *testing.T, n *node) {
	t.Helper()
	b, err := os.ReadFile(n.hostPath(t, "/var/lib/kubelet/config.yaml"))
	if err != nil {
		t.Error(err)
	} else if !strings.Contains(string(b), "\nresolvConf: /run/systemd/resolve/resolv.conf\n") {
		t.Errorf("the kubelet's config.yaml lacks the node's resolvConf patch:\n%s", b)
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

// firstTaintedPool is the stack's first pool with taints and labels of its own, so that both are proven.
func firstTaintedPool(t *testing.T, cfg *config.Config) config.NodePool {
	t.Helper()
	for _, p := range cfg.NodePools {
		if len(p.Taints) > 0 && len(p.Labels) > 0 {
			return p
		}
	}
	t.Fatal("the dev stack has no pool with both labels and taints")
	return config.NodePool{}
}

// kubeadmUploadConfig does the two `kubeadm init` phases a joining worker reads from: kube-system/kubeadm-config
// (the ClusterConfiguration) and kube-system/kubelet-config (the cluster-wide KubeletConfiguration), with their
// RBAC. The kubelet settings are what this machine needs: cgroupfs (no systemd), cgroup v1 allowed (kubelet 1.34
// still runs on it), swap tolerated; and a resolvConf the node's own patch overrides.
func kubeadmUploadConfig(ctx context.Context, t *testing.T, c cluster) {
	t.Helper()
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
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
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	path := filepath.Join(t.TempDir(), "init.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
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
// and forwards each server's loopback port from inside the node's network namespace to the test's.
func bootNode(ctx context.Context, t *testing.T, userData []byte, realKubeadm string, servers []string) *node {
	t.Helper()
	// Removed after the cleanups below (they run last-in first-out), so after the node has stopped.
	dir := t.TempDir()
	n := &node{dir: dir, root: filepath.Join(dir, "root"), bin: filepath.Join(dir, "bin"),
		hostname: "ip-" + strings.ReplaceAll(fakeNodeIP, ".", "-") + ".e2e.internal"}
	writeUserDataFiles(t, userData, n.root)
	for _, d := range []string{n.bin, filepath.Join(n.root, "etc/kubernetes"), filepath.Join(dir, "var-lib-kubelet"),
		filepath.Join(dir, "run-crio"), filepath.Join(dir, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stubs, err := filepath.Abs(filepath.Join("testdata", "stubs"))
	if err != nil {
		t.Fatal(err)
	}
	for name, stub := range map[string]string{"dnf": "record", "rpm": "record", "systemctl": "record",
		"logger": "record", "modprobe": "record", "sysctl": "record", "crictl": "record", "kubeadm": "kubeadm-real"} {
		if err := os.Symlink(filepath.Join(stubs, stub), filepath.Join(n.bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	writeContainerdConfig(t, dir)
	for _, p := range []string{"/etc/kubernetes", "/var/lib/kubelet", "/run/crio"} {
		mountPoint(t, p)
	}
	cleanKubepodsCgroups(t)

	nodeSh, err := filepath.Abs(filepath.Join("testdata", "node.sh"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--net", "--mount", "--uts", "--propagation", "private", "--", "bash", nodeSh)
	cmd.Env = append(os.Environ(), "NODE_DIR="+dir, "NODE_ETC_KUBERNETES="+filepath.Join(n.root, "etc/kubernetes"),
		"NODE_IP="+fakeNodeIP, "NODE_HOSTNAME="+n.hostname, "KUBELET_WAIT_SECONDS=150")
	logs := &nodetest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node.sh: %v", err)
	}
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
		if err != nil {
			t.Fatal(err)
		}
		forwardIntoNetns(t, n.pid, u.Host)
	}

	n.env = append(os.Environ(),
		"PATH="+n.bin+":"+os.Getenv("PATH"),
		"DYNK8S_ROOT="+n.root,
		"DYNK8S_IMDS_ENDPOINT="+servers[1],
		"DYNK8S_SSM_ENDPOINT="+servers[2],
		// moto answers every service on one port; a failed boot hands the instance back through it, never AWS.
		"DYNK8S_AUTOSCALING_ENDPOINT="+servers[2],
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
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
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
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
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

// forwardIntoNetns listens on addr (a loopback host:port of a server of this test) inside the network namespace of
// pid, and forwards each connection to the same addr in the test's own namespace. Closed with the test.
func forwardIntoNetns(t *testing.T, pid int, addr string) {
	t.Helper()
	forwardIntoNetnsFile(t, fmt.Sprintf("/proc/%d/ns/net", pid), addr, addr)
}

// forwardIntoNetnsFile listens on listen inside the network namespace nsFile names (/proc/PID/ns/net, or
// /run/netns/NAME), and forwards each connection to target (a loopback host:port of a server of this test) in the
// test's own namespace. Closed with the test.
func forwardIntoNetnsFile(t *testing.T, nsFile, listen, target string) {
	t.Helper()
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Only this goroutine's thread enters the node's namespace, and it returns to the test's namespace before
		// the thread is unlocked. Should the return fail, the thread stays locked and ends with the goroutine.
		runtime.LockOSThread()
		own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer own.Close()
		f, err := os.Open(nsFile)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns: %w", err)}
			return
		}
		l, err := net.Listen("tcp", listen)
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{l, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen on %s in the network namespace %s: %v", listen, nsFile, r.err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := r.l.Accept()
			if err != nil {
				return
			}
			out, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				_ = in.Close()
				continue
			}
			track(in)
			track(out)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); _ = in.(*net.TCPConn).CloseWrite() }()
		}
	}()
	t.Cleanup(func() {
		_ = r.l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// kubeNode is the part of a v1 Node this test reads.
type kubeNode struct {
	Metadata struct {
		Name              string            `json:"name"`
		UID               string            `json:"uid"`
		CreationTimestamp time.Time         `json:"creationTimestamp"`
		Labels            map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		ProviderID string       `json:"providerID"`
		Taints     []kube.Taint `json:"taints"`
	} `json:"spec"`
	Status struct {
		Allocatable map[string]string `json:"allocatable"`
		Addresses   []struct {
			Type    string `json:"type"`
			Address string `json:"address"`
		} `json:"addresses"`
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// hasTaint: the Node carries a taint with key.
func (n kubeNode) hasTaint(key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t kube.Taint) bool { return t.Key == key })
}

func (n kubeNode) ready() bool {
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
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
	if err := cert.CheckSignatureFrom(ca); err != nil {
		t.Errorf("kubelet client certificate not signed by the cluster CA: %v", err)
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for {
		var block *pem.Block
		block, raw = pem.Decode(raw)
		if block == nil {
			t.Fatalf("%s: no certificate", path)
		}
		if block.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return cert
		}
	}
}

// readUserDataFile returns one write_files entry of the rendered cloud-config.
func readUserDataFile(t *testing.T, userData []byte, path string) string {
	t.Helper()
	root := t.TempDir()
	writeUserDataFiles(t, userData, root)
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

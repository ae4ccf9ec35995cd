//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/names"
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
	role := fakeRoleInstance(fakeInstanceID, zone, cfg.Region, fakeNodeIP, "")
	imds := fakeaws.NewIMDS(t, role)
	// EC2 for the join's kubelet key mark (CreateTags on its own instance, signed with the role's credentials),
	// which must know the instance.
	ec2 := fakeRoleEC2(t, cfg.Region, role)
	userData := renderNodeUserData(ctx, t, c, cfg, pool, param)

	n := bootNode(ctx, t, userData, realKubeadm, []string{c.Server, imds.URL, ssm.url, ec2.URL})
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
		if ec2.Tags(fakeInstanceID)[names.TagKubeletKey] == "" {
			t.Errorf("the join did not mark %s with its kubelet key; EC2 calls: %v", fakeInstanceID, ec2.TagCalls())
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
		assert.NilError(t, c.getJSON(ctx, &before, "node", nodeName))
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
		assert.NilError(t, c.getJSON(ctx, &after, "node", nodeName))
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

// readUserDataFile returns one write_files entry of the rendered cloud-config.
func readUserDataFile(t *testing.T, userData []byte, path string) string {
	t.Helper()
	root := t.TempDir()
	writeUserDataFiles(t, userData, root)
	b, err := os.ReadFile(filepath.Join(root, path))
	assert.NilError(t, err)
	return string(b)
}

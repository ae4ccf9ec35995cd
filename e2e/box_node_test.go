//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// waitKubeletBack waits until the kubelet of this boot answers its health check and has renewed the Node's lease
// after since.
func (n *boxNode) waitKubeletBack(ctx context.Context, t *testing.T, node kubeNode, since time.Time) {
	t.Helper()
	err := n.wait(ctx, time.Minute, "kubelet healthy, lease renewed", func(ctx context.Context) bool {
		if out, err := n.exec(ctx, "curl", "-fsS", "-m", "2", "http://127.0.0.1:10248/healthz"); err != nil || out != "ok" {
			return false
		}
		out, err := n.c.kubectl(ctx, "-n", "kube-node-lease", "get", "lease", node.Metadata.Name, "-o",
			"jsonpath={.spec.renewTime}")
		if err != nil {
			return false
		}
		renewed, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(out))
		return err == nil && renewed.After(since)
	})
	assert.NilError(t, err)
}

// checkRegisteredSince: the Node is this join's, not one an earlier test left behind (API times have seconds).
func checkRegisteredSince(t *testing.T, node kubeNode, since time.Time) {
	t.Helper()
	if node.Metadata.CreationTimestamp.Before(since.Truncate(time.Second)) {
		t.Errorf("the Node was created at %s, before this join began (%s)", node.Metadata.CreationTimestamp, since)
	}
}

// timeline is /run/dynk8s/timeline.json of this boot.
func (n *boxNode) timeline(ctx context.Context, t *testing.T) (result, mode string) {
	t.Helper()
	out, err := n.exec(ctx, "cat", "/run/dynk8s/timeline.json")
	if err != nil {
		t.Fatalf("timeline.json: %v: %s", err, out)
	}
	var tl struct {
		Result, Mode string
		TotalSeconds float64
		Phases       []struct {
			Name    string
			Seconds float64
		}
	}
	if err := json.Unmarshal([]byte(out), &tl); err != nil {
		t.Fatalf("timeline.json does not parse: %v: %s", err, out)
	}
	// For the record: where a boot's time goes, as the runbook reads it.
	t.Logf("timeline: result=%s mode=%s total=%.1fs phases=%+v", tl.Result, tl.Mode, tl.TotalSeconds, tl.Phases)
	if len(tl.Phases) == 0 {
		t.Errorf("timeline.json has no phases: %s", out)
	}
	return tl.Result, tl.Mode
}

// TestBoxNodeColdThenReboot boots a pool of the dev stack from its rendered user data in a box: a cold boot (no
// warm pool) joins and becomes Ready with the pool's labels and taints, with cloud-init and systemd clean and the
// metadata locked, its packages installed through real dnf and rpm from the signed local repositories at the pinned
// NEVRAs, where a later `dnf upgrade` leaves them; then a stop and start of the same instance joins nothing again, and the kubelet comes back
// Ready behind the lockdown.
func TestBoxNodeColdThenReboot(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)
	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	n := newBoxNode(ctx, t, c, cfg, pool, "box-cold", "", "")

	var uid string
	t.Run("cold", func(t *testing.T) {
		start := time.Now()
		n.boot(t)
		node := n.waitReady(ctx, t, 4*time.Minute)
		t.Logf("cold boot: Node Ready %.1f s after the box started", time.Since(start).Seconds())
		uid = node.Metadata.UID
		n.checkSettled(ctx, t)
		n.checkCloudInit(t)
		checkJoinedNode(t, node, n.cfg, n.pool, n.zone)
		if result, mode := n.timeline(ctx, t); result != "joined" || mode != "join" {
			t.Errorf("timeline: result %q mode %q, want joined, join", result, mode)
		}
		n.checkMetadataLocked(ctx, t)
		n.checkLockBeforeKubelet(ctx, t)
		n.checkPinnedPackages(ctx, t)
		// An operator's (or dnf-automatic's) `dnf upgrade` on the joined node, with Fedora's updates repository
		// holding newer cri-o and cri-tools than the pinned upstream ones: the upgrade runs (container-selinux moves
		// to updates' build) and the pins stay where the join put them (the agent's versionlock).
		out, err := n.exec(ctx, "dnf", "upgrade", "-y")
		assert.NilError(t, err, "dnf upgrade: %s", out)
		upgraded := n.checkPinnedPackages(ctx, t)
		assert.Check(t, hasPackage(upgraded, "container-selinux-2:2.245.0-1.fc43"), "the upgrade upgraded nothing: %v",
			upgraded)
	})
	if t.Failed() {
		return
	}
	t.Run("reboot", func(t *testing.T) {
		assert.NilError(t, n.poweroff(time.Minute))
		start := time.Now()
		n.boot(t)
		assert.NilError(t, n.waitBooted(ctx, 2*time.Minute))
		node := n.waitReady(ctx, t, 2*time.Minute)
		// The Node stays Ready for a while without a kubelet: the kubelet of this boot must be the one renewing.
		n.waitKubeletBack(ctx, t, node, start)
		t.Logf("reboot: kubelet back (healthy, lease renewed) %.1f s after the box started", time.Since(start).Seconds())
		if node.Metadata.UID != uid {
			t.Errorf("the Node was registered again: uid %s, was %s", node.Metadata.UID, uid)
		}
		if got := n.unitProp(ctx, t, "dynk8s-join.service", "ConditionResult"); got != "no" {
			t.Errorf("the join unit's condition on this boot: %q, want no (skipped: already joined)", got)
		}
		n.checkSettled(ctx, t)
		n.checkCloudInit(t)
		n.checkMetadataLocked(ctx, t)
		n.checkLockBeforeKubelet(ctx, t)
	})
	if t.Failed() {
		return
	}
	// The lockdown fails closed: when nft cannot load the ruleset (here an nft that refuses everything, as on a
	// kernel without nf_tables), the next boot starts no kubelet at all.
	t.Run("reboot with a broken lockdown", func(t *testing.T) {
		assert.NilError(t, n.poweroff(time.Minute))
		nft := "#!/bin/sh\necho 'nft: Error: Could not process rule: Operation not supported (box stand-in)' >&2\nexit 1\n"
		assert.NilError(t, os.WriteFile(filepath.Join(n.root, "/usr/sbin/nft"), []byte(nft), 0o755))
		n.boot(t)
		assert.NilError(t, n.waitBooted(ctx, 2*time.Minute))
		if !n.unitFailed(ctx, "dynk8s-imds-lock.service") {
			t.Errorf("dynk8s-imds-lock.service did not fail when nft could not load the ruleset")
		}
		if got := n.unitProp(ctx, t, "kubelet.service", "ExecMainStartTimestampMonotonic"); got != "0" {
			t.Errorf("the kubelet started without the lockdown (at %s µs)", got)
		}
		if _, err := n.exec(ctx, "curl", "-fsS", "-m", "2", "http://127.0.0.1:10248/healthz"); err == nil {
			t.Errorf("a kubelet answers on a node without the lockdown")
		}
	})
	t.Logf("box boots (nspawn start to exit): %v", n.boots)
}

// checkPinnedPackages: rpm's database in the running box holds the pinned packages at the upstream repositories'
// NEVRAs (build-repos.sh: pkgs.k8s.io's release 150500.1.1; CRI-O's stream at its newest patch there, 4), none of
// Fedora's newer builds of the same names, and Fedora's container-selinux, which the image lacked. It returns what
// rpm holds.
func (n *boxNode) checkPinnedPackages(ctx context.Context, t *testing.T) []string {
	t.Helper()
	installed := n.installedPackages(ctx, t)
	v := n.cfg.Kubernetes.Version
	for _, p := range []string{
		fmt.Sprintf("kubelet-%s-150500.1.1.", v), fmt.Sprintf("kubeadm-%s-150500.1.1.", v),
		fmt.Sprintf("cri-o-%d.%d.4-150500.1.1.", v.Major, v.Minor), fmt.Sprintf("cri-tools-%d.%d.0-150500.1.1.", v.Major, v.Minor),
		"kubernetes-cni-1.7.1-150500.1.1.", "container-selinux-2:",
	} {
		assert.Check(t, hasPackage(installed, p), "rpm -qa lacks %s*: %v", p, installed)
	}
	for _, p := range installed {
		if (strings.HasPrefix(p, "cri-o-") || strings.HasPrefix(p, "cri-tools-")) && strings.Contains(p, ".fc") {
			t.Errorf("Fedora's build replaced the pinned one: %s", p)
		}
	}
	return installed
}

// warmPool is the dev stack's tainted pool with a warm pool waiting in state, and Auto Scaling (fakeaws': moto 5.2
// has no CompleteLifecycleAction) holding the instance's first launch in the launch hook.
func warmPool(t *testing.T, state string) (*config.Config, config.NodePool, *fakeaws.AutoScaling) {
	t.Helper()
	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	pool.WarmPool = &config.WarmPool{Size: 1, State: state}
	if infra.LaunchHook(pool) == "" {
		t.Fatal("a pool with a warm pool has no launch hook")
	}
	role := fakeRoleInstance(fakeInstanceID, cfg.Region+fakeZoneSuffix, cfg.Region, fakeNodeIP, "")
	asg := fakeaws.NewAutoScaling(t, role.SigV4(), fakeaws.AutoScalingInstance{ID: fakeInstanceID,
		Group: "dynk8s-" + cfg.ClusterName + "-" + pool.Name, Hook: infra.LaunchHook(pool)})
	asg.Hold()
	return cfg, pool, asg
}

// waitCloudInit waits until cloud-init has finished this boot (its boot-finished marker), or fails the test.
func (n *boxNode) waitCloudInit(ctx context.Context, t *testing.T, limit time.Duration) {
	t.Helper()
	err := n.wait(ctx, limit, "cloud-init finished", func(ctx context.Context) bool {
		_, err := n.exec(ctx, "test", "-e", "/var/lib/cloud/instance/boot-finished")
		return err == nil
	})
	assert.NilError(t, err)
}

// prepareInWarmPool runs the boot that puts the instance in the warm pool: it prepares, completes the launch hook's
// action, and joins nothing; cloud-init and systemd end clean.
func (n *boxNode) prepareInWarmPool(ctx context.Context, t *testing.T, asg *fakeaws.AutoScaling) {
	t.Helper()
	start := time.Now()
	n.boot(t)
	n.waitCloudInit(ctx, t, 4*time.Minute)
	t.Logf("prepare boot: cloud-init finished %.1f s after the box started", time.Since(start).Seconds())
	if asg.Completed("CONTINUE") != 1 {
		t.Errorf("the launch hook's action was not completed once with CONTINUE:\n%s", strings.Join(asg.Calls(), "\n"))
	}
	n.checkSettled(ctx, t)
	n.checkCloudInit(t)
	n.checkPinnedPackages(ctx, t)
	if result, mode := n.timeline(ctx, t); result != "prepared" || mode != "prepare" {
		t.Errorf("timeline: result %q mode %q, want prepared, prepare", result, mode)
	}
	if name, err := findNode(ctx, n.c, n.providerID()); err != nil || name != "" {
		t.Errorf("a Node registered from the warm pool: %q %v", name, err)
	}
}

// TestBoxNodeWarmStopped: a warm pool that waits Stopped (the default). Boot 1 prepares in the warm pool and the
// group stops the instance; boot 2 of the same disk, in service, joins and is Ready well within the join's
// deadline, with no job left waiting: the boot whose transaction holds kubelet's start job while kubeadm restarts
// the kubelet.
func TestBoxNodeWarmStopped(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)
	cfg, pool, asg := warmPool(t, "Stopped")
	n := newBoxNode(ctx, t, c, cfg, pool, "box-warm-stopped", "Warmed:Stopped", asg.URL)

	t.Run("prepare", func(t *testing.T) {
		n.prepareInWarmPool(ctx, t, asg)
		assert.NilError(t, n.poweroff(time.Minute))
	})
	if t.Failed() {
		return
	}
	t.Run("enters service", func(t *testing.T) {
		n.imds.SetLifecycleState("InService")
		asg.Hold()
		start := time.Now()
		n.boot(t)
		// The join's own deadline is 12 minutes; a join that works takes well under one here.
		node := n.waitReady(ctx, t, 4*time.Minute)
		t.Logf("warm boot: Node Ready %.1f s after the box started", time.Since(start).Seconds())
		checkRegisteredSince(t, node, start)
		n.checkSettled(ctx, t)
		n.checkCloudInit(t)
		checkJoinedNode(t, node, n.cfg, n.pool, n.zone)
		if result, mode := n.timeline(ctx, t); result != "joined" || mode != "join" {
			t.Errorf("timeline: result %q mode %q, want joined, join", result, mode)
		}
		if asg.Completed("CONTINUE") != 2 {
			t.Errorf("the action the group held the instance in was not completed:\n%s", strings.Join(asg.Calls(), "\n"))
		}
		n.checkMetadataLocked(ctx, t)
		n.checkLockBeforeKubelet(ctx, t)
		n.checkTimerStopped(ctx, t)
	})
	t.Logf("box boots (nspawn start to exit): %v", n.boots)
}

// TestBoxNodeWarmRunning: a warm pool that waits Running. The instance prepares and stays up; when the group puts it
// in service, the join timer joins it on the same boot, and the metadata lockdown is loaded after that join too.
func TestBoxNodeWarmRunning(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)
	cfg, pool, asg := warmPool(t, "Running")
	n := newBoxNode(ctx, t, c, cfg, pool, "box-warm-running", "Warmed:Running", asg.URL)
	n.prepareInWarmPool(ctx, t, asg)
	if t.Failed() {
		return
	}
	if got := n.unitProp(ctx, t, "dynk8s-join.timer", "ActiveState"); got != "active" {
		t.Fatalf("dynk8s-join.timer is %s", got)
	}
	n.imds.SetLifecycleState("InService")
	asg.Hold()
	start := time.Now()
	node := n.waitReady(ctx, t, 3*time.Minute)
	t.Logf("warm running: Node Ready %.1f s after the group put it in service", time.Since(start).Seconds())
	checkRegisteredSince(t, node, start)
	if len(n.boots) != 0 {
		t.Errorf("the box booted again: %v", n.boots)
	}
	checkJoinedNode(t, node, n.cfg, n.pool, n.zone)
	if err := n.wait(ctx, time.Minute, "lifecycle action completed", func(context.Context) bool {
		return asg.Completed("CONTINUE") == 2
	}); err != nil {
		t.Errorf("%v:\n%s", err, strings.Join(asg.Calls(), "\n"))
	}
	n.checkSettled(ctx, t)
	n.checkMetadataLocked(ctx, t)
	n.checkLockBeforeKubelet(ctx, t)
	n.checkTimerStopped(ctx, t)
}

// checkTimerStopped: a joined node's join timer is stopped and disabled (it would otherwise fire every 15 s for the
// node's life, each run skipped by the join unit's condition).
func (n *boxNode) checkTimerStopped(ctx context.Context, t *testing.T) {
	t.Helper()
	err := n.wait(ctx, 30*time.Second, "dynk8s-join.timer stopped", func(ctx context.Context) bool {
		return n.unitProp(ctx, t, "dynk8s-join.timer", "ActiveState") == "inactive"
	})
	assert.Check(t, err)
	if got := n.unitProp(ctx, t, "dynk8s-join.timer", "UnitFileState"); got != "disabled" {
		t.Errorf("dynk8s-join.timer is %s after the join, want disabled", got)
	}
}

// TestBoxNodeFailedJoinIsCloudInitsError is the negative of the cold boot's "cloud-init finished with no error":
// with no join token in SSM and the join's deadline cut to 20 s (a box-only drop-in), the join unit fails, and
// cloud-init must say so (runcmd's last command), not report done.
func TestBoxNodeFailedJoinIsCloudInitsError(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)
	cfg := devConfig(t)
	n := newBoxNode(ctx, t, c, cfg, firstTaintedPool(t, cfg), "box-nojoin", "", "")
	if status, b := n.moto.ssm(t, cfg.Region, "DeleteParameter", map[string]any{"Name": n.param}); status != 200 {
		t.Fatalf("SSM DeleteParameter: HTTP %d: %s", status, b)
	}
	dropIn := filepath.Join(n.root, "/etc/systemd/system/dynk8s-join.service.d/91-box-deadline.conf")
	assert.NilError(t, os.WriteFile(dropIn, []byte("[Service]\nEnvironment=DYNK8S_DEADLINE_SECONDS=20\n"), 0o644))
	n.boot(t)
	n.waitCloudInit(ctx, t, 3*time.Minute)
	if !n.unitFailed(ctx, "dynk8s-join.service") {
		t.Fatal("the join unit did not fail without a token")
	}
	out, err := n.exec(ctx, "cloud-init", "status", "--long")
	t.Logf("cloud-init status --long (%v):\n%s", err, out)
	if err == nil || !strings.Contains(out, "status: error") {
		t.Errorf("cloud-init reports no error for a failed join")
	}
	if !strings.Contains(n.file(t, "/var/lib/cloud/data/result.json"), "scripts-user") {
		t.Errorf("cloud-init's result.json names no failed scripts-user:\n%s", n.file(t, "/var/lib/cloud/data/result.json"))
	}
}

//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The baked image in the box (docs/baked-images.md): a box booted from the stock root with the pool's bake user data
// (cloudinit.Bake, what cmd/bake launches) prepares itself, removes its identity and powers itself off, and instances
// booted from what it left join without the package manager, or refuse an image baked for another version.

// bakeImage boots a box from the stock root with the pool's bake user data, as cmd/bake launches its instance: the
// agent is where the bootstrap installs it (the user data is rendered without the bootstrap, as there is no bucket
// here), cloud-init writes the pool's files and runs the bake unit, whose `dynk8s-node bake` prepares, cleans the
// identity, checks the image and powers the box off. The image is what the box changed: a copy of its overlay's
// upper directory, a layer over the stock root for the boxes that boot from it (an EBS snapshot of the bake
// instance's volume, in the box's terms). image is where the layer goes (a directory that outlives the bake's box).
func bakeImage(t *testing.T, j *boxJoin, zone, image string) {
	t.Helper()
	node, render := infra.NodeConfig(j.cfg, j.pool, nil, infra.JoinTokenParameter(j.cfg.ClusterName))
	userData, err := cloudinit.Bake(node, render)
	assert.NilError(t, err)
	// The bake's box is the join's with the bake's user data, whatever user data the join has (none yet, in a
	// burst that bakes before it renders the node's).
	bake := *j
	bake.userData = userData
	n := bake.newNode(t, "box-bake", boxInstance{id: "i-0ba4ed00000000b01", zone: zone, ip: "10.100.1.40"})
	writeBoxFile(t, n.root, "/var/lib/cloud/seed/nocloud/user-data", localRepositories(t, userData), 0o600)
	agent, err := os.ReadFile(nodetest.BuiltAgent(t))
	assert.NilError(t, err)
	writeBoxFile(t, n.root, nodetest.AgentPath, agent, 0o755)
	start := time.Now()
	n.boot(t)
	// A hang's bound on a loaded machine, not a speed target: the bake took about a minute here.
	if err := n.waitStopped(10 * time.Minute); err != nil {
		n.diagnose(t)
		t.Fatalf("the bake did not power the box off: %v", err)
	}
	t.Logf("bake: the box booted, baked, cleaned its identity and powered itself off in %.1f s", time.Since(start).Seconds())
	// Its journal went with its identity: the marker says it was this bake (a failed one never powers off).
	var marker struct{ Config struct{ SHA256 string } }
	b, err := os.ReadFile(filepath.Join(n.dir, "upper", "etc/dynk8s/baked.json"))
	assert.NilError(t, err, "the bake powered off without a marker")
	assert.NilError(t, json.Unmarshal(b, &marker))
	files, err := cloudinit.Files(userData)
	assert.NilError(t, err)
	for _, f := range files {
		if f.Path == nodeconfig.BakePath {
			assert.Check(t, is.Equal(marker.Config.SHA256, fmt.Sprintf("%x", sha256.Sum256([]byte(f.Content)))),
				"the marker names another config than the bake's bake.json")
		}
	}
	run(t, "cp", "-a", filepath.Join(n.dir, "upper"), image)
}

func writeBoxFile(t *testing.T, root, path string, content []byte, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(root, path)
	assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	assert.NilError(t, os.WriteFile(p, content, mode))
}

// checkImage: the image holds the marker and the packages, and none of the build instance's identity.
func checkImage(t *testing.T, image string) {
	t.Helper()
	var marker struct {
		Format    int
		Installed []struct{ Spec, NEVRA string }
	}
	b, err := os.ReadFile(filepath.Join(image, "etc/dynk8s/baked.json"))
	assert.NilError(t, err, "the image has no marker")
	if err := json.Unmarshal(b, &marker); err != nil || marker.Format != 1 || len(marker.Installed) == 0 {
		t.Errorf("the marker: %v: %s", err, b)
	}
	t.Logf("the image's marker:\n%s", b)
	if id, err := os.ReadFile(filepath.Join(image, "etc/machine-id")); err != nil || string(id) != "uninitialized\n" {
		t.Errorf("the image's /etc/machine-id: %q (%v), want uninitialized", id, err)
	}
	for _, p := range []string{"usr/bin/kubelet", "usr/bin/kubeadm", "usr/lib/systemd/system/crio.service", "usr/local/bin/dynk8s-node"} {
		if _, err := os.Stat(filepath.Join(image, p)); err != nil {
			t.Errorf("the image lacks /%s: %v", p, err)
		}
	}
	// What clean-identity removed is a whiteout (a character device) in the layer, or absent from it.
	for _, p := range []string{"var/lib/cloud/instance", "var/lib/cloud/instances", "var/log/cloud-init.log",
		"var/lib/dynk8s", "etc/dynk8s/bake.json", "etc/systemd/system/dynk8s-bake.service"} {
		if st, err := os.Lstat(filepath.Join(image, p)); err == nil && st.Mode()&os.ModeCharDevice == 0 {
			t.Errorf("the image keeps the build instance's /%s", p)
		}
	}
	// dnf's log of what rpm did in its transactions (dnf4: /var/log/dnf.rpm.log).
	rpmLog, _ := os.ReadFile(filepath.Join(image, "var/log/dnf.rpm.log"))
	if !strings.Contains(string(rpmLog), "Installed: kubelet-") {
		t.Errorf("the bake installed no kubelet (dnf.rpm.log):\n%s", rpmLog)
	}
}

// bootPhases is one boot's /run/dynk8s/timeline.json, and how long after the box started its Node was Ready.
type bootPhases struct {
	Result       string
	TotalSeconds float64
	Phases       []struct {
		Name    string
		Seconds float64
	}
	ready time.Duration
}

func (n *boxNode) bootPhases(ctx context.Context, t *testing.T) bootPhases {
	t.Helper()
	out, err := n.exec(ctx, "cat", "/run/dynk8s/timeline.json")
	if err != nil {
		t.Fatalf("timeline.json: %v: %s", err, out)
	}
	var p bootPhases
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("timeline.json: %v: %s", err, out)
	}
	return p
}

// dnfLogs are dnf 4's logs (dnf.conf(5), logdir): every run writes its command line to dnf.log.
var dnfLogs = []string{"var/log/dnf.log", "var/log/dnf.rpm.log", "var/log/dnf.librepo.log", "var/log/hawkey.log"}

// forgetDNF removes dnf's logs from the box's disk before a boot, so that dnfCommands tells that boot's runs.
func forgetDNF(t *testing.T, b *box) {
	t.Helper()
	for _, l := range dnfLogs {
		if err := os.Remove(filepath.Join(b.root, l)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
}

// dnfCommands are the command lines dnf ran, from its log (dnf.log's "Command: " lines, which dnf 4 writes at the
// start of every run).
func dnfCommands(t *testing.T, b *box) []string {
	t.Helper()
	c, err := os.ReadFile(filepath.Join(b.root, dnfLogs[0]))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for l := range strings.Lines(string(c)) {
		if _, cmd, ok := strings.Cut(l, " Command: "); ok {
			out = append(out, strings.TrimSpace(cmd))
		}
	}
	return out
}

// installedPackages are the NEVRAs rpm's database holds in the running box (rpm -qa).
func (b *box) installedPackages(ctx context.Context, t *testing.T) []string {
	t.Helper()
	out, err := b.exec(ctx, "rpm", "-qa", "--qf", "%{NEVRA}\\n")
	assert.NilError(t, err, "rpm -qa: %s", out)
	return strings.Fields(out)
}

// joinJournal is the join unit's journal of the running box.
func (n *boxNode) joinJournal(ctx context.Context) string {
	out, _ := n.exec(ctx, "journalctl", "-u", "dynk8s-join.service", "--no-pager", "-o", "cat")
	return out
}

// TestBoxNodeBakedImage proves the baked image in the box: (a) a box booted from the stock root with the pool's bake
// user data (cloudinit.Bake) runs `dynk8s-node bake` (prepare, clean-identity, the image's check) and powers itself
// off; (b) a copy of what it left, booted with the pool's user
// data in InService, joins and is Ready without running the package manager (dnf logs no command), its
// packages and pre-pull phases logged as baked, with cloud-init and systemd clean and the kubelet started behind the
// metadata lockdown; (c) a cold box of the same pool joins for the comparison of the in-box phase times, which
// the test logs; (d) the same image booted with the user data of another Kubernetes version refuses to join, with
// one reason, and installs nothing.
func TestBoxNodeBakedImage(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)
	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	j := newBoxJoin(ctx, t, c, cfg, pool, "")
	zone := cfg.Region + fakeZoneSuffix

	image := filepath.Join(t.TempDir(), "image")
	t.Run("bake", func(t *testing.T) {
		bakeImage(t, j, zone, image)
		checkImage(t, image)
	})
	if t.Failed() {
		return
	}
	boot := func(t *testing.T, n *boxNode) bootPhases {
		t.Helper()
		start := time.Now()
		n.boot(t)
		n.waitReady(ctx, t, 4*time.Minute)
		ready := time.Since(start)
		n.checkSettled(ctx, t)
		n.checkCloudInit(t)
		n.checkMetadataLocked(ctx, t)
		n.checkLockBeforeKubelet(ctx, t)
		p := n.bootPhases(ctx, t)
		p.ready = ready
		if p.Result != "joined" {
			t.Errorf("timeline: result %q, want joined", p.Result)
		}
		t.Logf("Node Ready %.1f s after the box started; timeline total %.1f s, phases %+v", ready.Seconds(),
			p.TotalSeconds, p.Phases)
		return p
	}

	var baked, cold bootPhases
	t.Run("baked", func(t *testing.T) {
		n := j.newNode(t, "box-baked", boxInstance{id: "i-0ba4ed00000000b02", zone: zone, ip: "10.100.1.41",
			state: "InService", image: image})
		// The bake's dnf logs are the build's, not this boot's.
		forgetDNF(t, n.box)
		baked = boot(t, n)
		if dnf := dnfCommands(t, n.box); len(dnf) > 0 {
			t.Errorf("the baked boot ran the package manager:\n%s", strings.Join(dnf, "\n"))
		}
		journal := n.joinJournal(ctx)
		for _, want := range []string{"phase=packages took=", "s (baked)", "baked image holds kubelet-1.34.4-150500.1.1."} {
			if !strings.Contains(journal, want) {
				t.Errorf("the join's journal lacks %q:\n%s", want, journal)
			}
		}
	})
	t.Run("cold", func(t *testing.T) {
		n := j.newNode(t, "box-cold2", boxInstance{id: "i-0c01d000000000c03", zone: zone, ip: "10.100.1.42",
			state: "InService"})
		cold = boot(t, n)
		if !hasPackage(n.installedPackages(ctx, t), "kubelet-1.34.4-150500.1.1.") {
			t.Errorf("the cold boot installed no kubelet: the comparison is not cold against baked")
		}
		// The control of the baked boots' "dnf logged no command": a boot that runs dnf is seen in its log.
		if dnf := dnfCommands(t, n.box); len(dnf) == 0 {
			t.Errorf("the cold boot's dnf logged no command: the baked boots' check would see none either")
		} else {
			t.Logf("the cold boot's dnf commands:\n%s", strings.Join(dnf, "\n"))
		}
	})
	t.Run("stale", func(t *testing.T) {
		other := *cfg
		other.Kubernetes.Version = kube.Version{Major: 1, Minor: 33, Patch: 7}
		stale := *j
		stale.userData = renderNodeUserData(ctx, t, c, &other, pool, j.param)
		n := stale.newNode(t, "box-stale", boxInstance{id: "i-05a1e000000000d04", zone: zone, ip: "10.100.1.43",
			state: "InService", image: image})
		forgetDNF(t, n.box)
		n.boot(t)
		assert.NilError(t, n.wait(ctx, 3*time.Minute, "the join unit failed", func(ctx context.Context) bool {
			return n.unitFailed(ctx, "dynk8s-join.service")
		}))
		journal := n.joinJournal(ctx)
		var failed []string
		for _, l := range strings.Split(journal, "\n") {
			if strings.Contains(l, "FAILED:") {
				failed = append(failed, l)
			}
		}
		const want = "FAILED: baked image: kubelet-1.34.4-150500.1.1."
		t.Logf("the stale boot's refusal: %q", failed)
		if len(failed) != 1 || !strings.Contains(failed[0], want) || !strings.Contains(failed[0], "is installed, not kubelet-1.33.7") {
			t.Errorf("want one %q line naming kubelet-1.33.7, got %q:\n%s", want, failed, journal)
		}
		if dnf := dnfCommands(t, n.box); len(dnf) > 0 {
			t.Errorf("the refused boot ran the package manager:\n%s", strings.Join(dnf, "\n"))
		}
		if name, err := findNode(ctx, c, "aws:///"+zone+"/i-05a1e000000000d04"); err != nil || name != "" {
			t.Errorf("a refused baked image registered Node %q (%v)", name, err)
		}
	})
	if baked.Result == "" || cold.Result == "" {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-14s %8s %8s\n", "phase", "cold", "baked")
	seconds := func(p bootPhases, name string) string {
		for _, ph := range p.Phases {
			if ph.Name == name {
				return fmt.Sprintf("%.1f", ph.Seconds)
			}
		}
		return "-"
	}
	for _, ph := range cold.Phases {
		fmt.Fprintf(&b, "%-14s %8s %8s\n", ph.Name, seconds(cold, ph.Name), seconds(baked, ph.Name))
	}
	fmt.Fprintf(&b, "%-14s %8.1f %8.1f\n", "total", cold.TotalSeconds, baked.TotalSeconds)
	fmt.Fprintf(&b, "%-14s %8.1f %8.1f\n", "Node Ready", cold.ready.Seconds(), baked.ready.Seconds())
	t.Logf("in-box phases of a cold and a baked boot (s; the join's timeline, and the box's start to the Node Ready):\n%s", b.String())
}

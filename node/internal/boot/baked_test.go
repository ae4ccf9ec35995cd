package boot

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/node/internal/cli"
	"github.com/dynk8s/dynk8s/node/internal/cloud/cloudfake"
	"github.com/dynk8s/dynk8s/node/internal/image"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The image build's prepare and clean-identity, and the boot from a baked image (docs/baked-images.md).

// bakeRig runs the image build's prepare on the rig's root, as `dynk8s-node prepare` does, and returns its log.
func (r *rig) bakeRig() (string, error) {
	r.t.Helper()
	r.log = &nodetest.SyncBuffer{}
	log := system.NewLogger("dynk8s-prepare", r.log, r.root)
	log.Journal = false
	j := newJoiner(&bootEnv{cfg: r.cfg, host: r.host, files: system.Files{Root: r.root, Proc: filepath.Join(r.root, "proc")},
		log: log, clock: system.NewClock(r.cfg.Deadlines.Join.D(), r.cfg.Deadlines.BackoffInitial.D(),
			r.cfg.Deadlines.BackoffMax.D()), tl: system.NewTimeline(time.Now)})
	j.baking = true
	err := j.bake(context.Background(), "c0ffee")
	j.finish()
	r.t.Logf("prepare: %v\n%s", err, r.log.String())
	return r.log.String(), err
}

func (r *rig) marker() image.Marker {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.root, "etc/dynk8s/baked.json"))
	assert.NilError(r.t, err)
	var m image.Marker
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	assert.NilError(r.t, dec.Decode(&m))
	return m
}

func (r *rig) writeMarker(m image.Marker) {
	r.t.Helper()
	b, err := json.Marshal(m)
	assert.NilError(r.t, err)
	assert.NilError(r.t, system.WriteFileAtomic(filepath.Join(r.root, "etc/dynk8s/baked.json"), b, 0o644))
}

func dnfCalls(calls []string) []string {
	var out []string
	for _, c := range calls {
		if strings.HasPrefix(c, "dnf ") {
			out = append(out, c)
		}
	}
	return out
}

// prepare installs as the boot does, waits for the pre-pull, and writes the marker of what rpm says it installed:
// the NEVRAs, CRI-O's version, the images that were pulled (a failed pull is not listed), the agent and the config.
// It leaves the kubelet disabled and never reads IMDS or joins.
func TestPrepareWritesTheMarker(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.host.rpmMissing = []string{"container-selinux"}
	r.cfg.PrePullImages = append(r.cfg.PrePullImages, "docker.io/library/busybox:latest") // the fake's pull fails
	log, err := r.bakeRig()
	assert.NilError(t, err)
	calls := r.host.Recorded()
	assert.Check(t, is.DeepEqual(dnfCalls(calls), []string{dnfInstall + " --repo=dynk8s-kubernetes --repo=dynk8s-cri-o" +
		fedoraRepo + " kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.* container-selinux", dnfLock}))
	assert.Check(t, slices.Index(calls, "systemctl disable kubelet.service") > slices.Index(calls, enableRuntime),
		"the kubelet is left enabled: %v", calls)
	assert.Check(t, slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "kubeadm") }) < 0)
	assert.Check(t, is.Equal(r.imds.Requests, 0))

	m := r.marker()
	assert.Check(t, is.Equal(m.Format, 1))
	assert.Check(t, is.Equal(m.Agent.Version, system.Version))
	assert.Check(t, is.Equal(m.Config.SHA256, "c0ffee"))
	assert.Check(t, is.DeepEqual(m.Config.Packages, r.cfg.Packages))
	assert.Check(t, is.DeepEqual(m.Config.PrePullImages, r.cfg.PrePullImages))
	assert.Check(t, is.DeepEqual(m.Installed, []image.MarkerPackage{
		{Spec: "kubelet-1.34.4", Name: "kubelet", NEVRA: "kubelet-1.34.4-150500.1.1.x86_64"},
		{Spec: "kubeadm-1.34.4", Name: "kubeadm", NEVRA: "kubeadm-1.34.4-150500.1.1.x86_64"},
		{Spec: "cri-tools-1.34.*", Name: "cri-tools", NEVRA: "cri-tools-1.34.0-150500.1.1.x86_64"},
		{Spec: "cri-o-1.34.*", Name: "cri-o", NEVRA: "cri-o-1.34.2-150500.1.1.x86_64"},
		{Spec: "container-selinux", Name: "container-selinux", NEVRA: "container-selinux-1.0-1.fc43.noarch"},
		{Spec: "iptables", Name: "iptables", NEVRA: "iptables-1.0-1.fc43.noarch"},
		{Spec: "nftables", Name: "nftables", NEVRA: "nftables-1.0-1.fc43.noarch"},
	}))
	assert.Check(t, is.Equal(m.CRIO, "1.34.2-150500.1.1"))
	assert.Check(t, is.DeepEqual(m.Images, []string{"registry.k8s.io/pause:3.10.1", "registry.k8s.io/kube-proxy:v1.34.4"}))
	assert.Check(t, is.Contains(log, "phase=pre-pull took="))
	assert.Check(t, is.Contains(log, "timeline: result=baked mode=bake total="))
}

// A prepare whose packages are not what node.json pins (a repository that serves another version) writes no marker.
func TestPrepareRefusesWhatItDidNotInstall(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.cfg.Packages = []string{"kubelet-1.35.0", "kubeadm-1.34.4", "cri-tools-1.34.*", "cri-o-1.34.*"}
	log, err := r.bakeRig()
	assert.ErrorContains(t, err, "after the install, kubelet-1.34.4-150500.1.1.x86_64 is installed, not kubelet-1.35.0")
	assert.Check(t, is.Contains(log, "timeline: result=failed mode=bake"))
	_, statErr := os.Stat(filepath.Join(r.root, "etc/dynk8s/baked.json"))
	assert.Check(t, os.IsNotExist(statErr), "a marker was written: %v", statErr)
}

// The boot knows: from an image baked for its packages it installs nothing (no dnf call at all), logs the skipped
// phases as baked, and joins; an image baked for something else, or changed since, is refused with one reason and
// never joins; without a marker the boot is today's.
func TestJoinBaked(t *testing.T) {
	t.Parallel()
	baked := func(r *rig) image.Marker {
		return image.Marker{Format: 1, Agent: image.MarkerAgent{Version: "devel"},
			Config: image.MarkerConfig{Packages: r.cfg.Packages, SystemPackages: r.cfg.SystemPackages},
			Installed: []image.MarkerPackage{{NEVRA: "kubelet-1.34.4-150500.1.1.x86_64"}, {NEVRA: "kubeadm-1.34.4-150500.1.1.x86_64"},
				{NEVRA: "cri-tools-1.34.0-150500.1.1.x86_64"}, {NEVRA: "cri-o-1.34.2-150500.1.1.x86_64"}},
			Images: r.cfg.PrePullImages}
	}
	installed := func(r *rig) {
		r.host.install([]string{"kubelet-1.34.4", "kubeadm-1.34.4", "cri-tools-1.34.*", "cri-o-1.34.*"})
	}
	for name, c := range map[string]struct {
		image  func(r *rig)
		reason string // "": joins
		baked  bool
	}{
		"baked and matching": {baked: true, image: func(r *rig) { installed(r); r.writeMarker(baked(r)) }},
		"baked for another Kubernetes version": {image: func(r *rig) {
			r.host.rpmDB = map[string]rpmPackage{"kubelet": fakeRPM("kubelet", "1.33.7", "150500.1.1", "x86_64"),
				"kubeadm": fakeRPM("kubeadm", "1.33.7", "150500.1.1", "x86_64")}
			m := baked(r)
			m.Config.Packages = []string{"kubelet-1.33.7", "kubeadm-1.33.7", "cri-tools-1.33.*", "cri-o-1.33.*"}
			r.writeMarker(m)
		}, reason: "baked image: kubelet-1.33.7-150500.1.1.x86_64 is installed, not kubelet-1.34.4, and the pool needs " +
			"kubelet-1.34.4: the image was baked for packages kubelet-1.33.7 kubeadm-1.33.7 cri-tools-1.33.* cri-o-1.33.*"},
		"baked, a package missing": {image: func(r *rig) {
			installed(r)
			delete(r.host.rpmDB, "cri-o")
			r.writeMarker(baked(r))
		}, reason: "baked image: cri-o is not installed (rpm -q), and the pool needs cri-o-1.34.*"},
		"baked, a system package missing": {image: func(r *rig) {
			installed(r)
			r.host.rpmMissing = []string{"container-selinux"}
			r.writeMarker(baked(r))
		}, reason: "baked image: nothing installed provides container-selinux (rpm -q --whatprovides), which the pool needs"},
		"baked, then changed": {image: func(r *rig) {
			installed(r)
			r.host.rpmDB["kubelet"] = fakeRPM("kubelet", "1.34.4", "150500.2.1", "x86_64")
			r.writeMarker(baked(r))
		}, reason: "baked image: rpm -q has kubelet-1.34.4-150500.2.1.x86_64, which its marker"},
		"a marker of another format": {image: func(r *rig) {
			installed(r)
			m := baked(r)
			m.Format = 2
			r.writeMarker(m)
		}, reason: "has format 2, this agent reads 1: build the pool's image again"},
		"a marker that does not parse": {image: func(r *rig) {
			assert.NilError(t, system.WriteFileAtomic(filepath.Join(r.root, "etc/dynk8s/baked.json"), []byte("{"), 0o644))
		}, reason: "does not parse"},
		"no marker": {image: func(*rig) {}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			c.image(r)
			run := r.join()
			dnf := dnfCalls(run.calls)
			if c.reason != "" {
				assert.Check(t, run.err != nil)
				assert.Assert(t, is.Len(nodetest.FailedLines(run.log), 1))
				assert.Check(t, is.Contains(nodetest.FailedLines(run.log)[0], c.reason))
				assert.Check(t, is.Len(dnf, 0), "a refused baked image installed: %v", dnf)
				assert.Check(t, run.index("kubeadm join") < 0, "a refused baked image joined: %v", run.calls)
				assert.Check(t, is.Equal(run.timeline.Result, "failed"))
				assert.Check(t, is.Contains(run.timeline.Reason, c.reason))
				return
			}
			assert.NilError(t, run.err)
			assert.Check(t, is.Equal(run.timeline.Result, "joined"))
			// The timeline keeps its phases, in order, on either image.
			assert.Check(t, is.DeepEqual(run.phases(), []string{"identity", "kernel", "packages", "crio", "checks", "token",
				"kubelet-key", "api-server", "lock", "kubeadm-join", "pre-pull"}))
			checkTimeline(t, run)
			checkLocksBeforeJoin(t, run)
			assert.Check(t, is.Contains(run.calls, enableRuntime))
			if !c.baked {
				assert.Check(t, is.DeepEqual(dnf, []string{dnfInstall + " --repo=dynk8s-kubernetes --repo=dynk8s-cri-o " +
					"kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*", dnfLock}))
				assert.Check(t, !strings.Contains(run.log, "(baked)"))
				assert.Check(t, run.index("crictl") >= 0, "no pre-pull: %v", run.calls)
				return
			}
			assert.Check(t, is.Len(dnf, 0), "a baked boot ran dnf: %v", dnf)
			assert.Check(t, run.index("crictl") < 0, "a baked boot pulled what the image holds: %v", run.calls)
			assert.Check(t, is.Contains(run.log, "baked image holds kubelet-1.34.4-150500.1.1.x86_64 kubeadm-1.34.4-"+
				"150500.1.1.x86_64 cri-tools-1.34.0-150500.1.1.x86_64 cri-o-1.34.2-150500.1.1.x86_64 and container-selinux "+
				"iptables nftables (rpm -q): nothing to install"))
			for _, p := range []string{"packages", "pre-pull"} {
				assert.Check(t, is.Regexp(`phase=`+p+` took=[0-9.]+s \(baked\)`, run.log))
			}
		})
	}
}

// A baked boot pulls only the images its image lacks, and loads its kernel modules without dnf (a module the image
// lacks stays missing, as on a stock image whose kernel-modules-extra failed).
func TestJoinBakedPullsWhatTheImageLacks(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.host.modulesMissing = []string{"br_netfilter"}
	r.host.install([]string{"kubelet-1.34.4", "kubeadm-1.34.4", "cri-tools-1.34.*", "cri-o-1.34.*"})
	r.writeMarker(image.Marker{Format: 1, Images: []string{"registry.k8s.io/pause:3.10.1"}, Installed: []image.MarkerPackage{
		{NEVRA: "kubelet-1.34.4-150500.1.1.x86_64"}, {NEVRA: "kubeadm-1.34.4-150500.1.1.x86_64"},
		{NEVRA: "cri-tools-1.34.0-150500.1.1.x86_64"}, {NEVRA: "cri-o-1.34.2-150500.1.1.x86_64"}}})
	run := r.join()
	assert.NilError(t, run.err)
	var pulls []string
	for _, c := range run.calls {
		if strings.HasPrefix(c, "crictl") {
			pulls = append(pulls, c)
		}
	}
	assert.Check(t, is.DeepEqual(pulls, []string{"crictl --runtime-endpoint unix:///var/run/crio/crio.sock pull registry.k8s.io/kube-proxy:v1.34.4"}))
	assert.Check(t, is.Contains(run.log, "phase=pre-pull took="))
	assert.Check(t, !strings.Contains(run.log, "phase=pre-pull took=0.0s (baked)"))
	assert.Check(t, is.Len(dnfCalls(run.calls), 0))
	assert.Check(t, is.Contains(run.log, "still missing kernel modules: br_netfilter"))
}

// The image build end to end on one root: prepare, clean-identity, then the boot of that image joins without dnf.
func TestBakeThenBootJoinsWithoutDnf(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	_, err := r.bakeRig()
	assert.NilError(t, err)
	assert.NilError(t, image.CleanIdentity(system.Files{Root: r.root}, r.quietLogger(), false))
	r.reboot()
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, is.Len(dnfCalls(run.calls), 0), "the baked boot ran dnf: %v", run.calls)
	assert.Check(t, is.Contains(run.log, "phase=packages took="))
	assert.Check(t, is.Contains(run.log, "(baked)"))
	assert.Check(t, is.Equal(run.timeline.Result, "joined"))
}

func TestParseSpec(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]packageSpec{
		"kubelet-1.34.4":     {spec: "kubelet-1.34.4", name: "kubelet", version: "1.34.4"},
		"cri-o-1.34.*":       {spec: "cri-o-1.34.*", name: "cri-o", version: "1.34.*"},
		"cri-tools-1.34.0-1": {spec: "cri-tools-1.34.0-1", name: "cri-tools", version: "1.34.0-1"},
		"container-selinux":  {spec: "container-selinux", name: "container-selinux"},
	} {
		assert.Check(t, parseSpec(spec) == want, "%s: %+v", spec, parseSpec(spec))
	}
	p := fakeRPM("cri-o", "1.34.2", "150500.1.1", "x86_64")
	for spec, want := range map[string]bool{"cri-o-1.34.*": true, "cri-o-1.34.2": true, "cri-o-1.34.2-150500.1.1": true,
		"cri-o-1.34.2-2": false, "cri-o-1.33.*": false, "cri-o-1.3": false, "cri-o": true, "cri-tools-1.34.*": false} {
		assert.Check(t, is.Equal(parseSpec(spec).matches(p), want), spec)
	}
}

// A baked image in a warm pool: the warm boot checks instead of installing, completes the launch hook's action, and
// its start into service joins as from a stock warm instance; a stale baked image in the warm pool fails there,
// completing the action with CONTINUE (as every failed boot does), and never joins.
func TestJoinBakedInTheWarmPool(t *testing.T) {
	t.Parallel()
	for name, version := range map[string]string{"matching": "1.34.4", "stale": "1.33.7"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "Warmed:Stopped", cloudfake.Hook)
			r.asg.PendingAction = true
			r.host.rpmDB = map[string]rpmPackage{}
			for _, p := range []string{"kubelet", "kubeadm", "cri-tools", "cri-o"} {
				r.host.rpmDB[p] = fakeRPM(p, version, "150500.1.1", "x86_64")
			}
			installed := []image.MarkerPackage{}
			for _, p := range r.host.rpmDB {
				installed = append(installed, image.MarkerPackage{NEVRA: p.nevra})
			}
			specs := []string{"kubelet-" + version, "kubeadm-" + version, "cri-tools-" + version, "cri-o-" + version}
			r.writeMarker(image.Marker{Format: 1, Config: image.MarkerConfig{Packages: specs}, Installed: installed,
				Images: r.cfg.PrePullImages})
			warm := r.join()
			assert.Check(t, is.Len(dnfCalls(warm.calls), 0))
			complete := "CompleteLifecycleAction " + cloudfake.Group + " " + cloudfake.Hook + " " + cloudfake.InstanceID + " CONTINUE"
			assert.Check(t, is.Contains(r.asg.Recorded(), complete))
			if version != "1.34.4" {
				assert.Check(t, warm.err != nil)
				assert.Check(t, is.Len(nodetest.FailedLines(warm.log), 1))
				assert.Check(t, is.Contains(warm.log, "FAILED: baked image: kubelet-1.33.7-150500.1.1.x86_64 is installed, not kubelet-1.34.4"))
				assert.Check(t, is.Equal(warm.timeline.Result, "failed"))
				return
			}
			assert.NilError(t, warm.err)
			assert.Check(t, is.Equal(warm.timeline.Result, "prepared"))
			assert.Check(t, is.DeepEqual(warm.phases(), []string{"identity", "kernel", "packages", "crio", "lock", "pre-pull", "lifecycle"}))
			start := r.startFromTheWarmPool()
			assert.NilError(t, start.err)
			assert.Check(t, is.Len(dnfCalls(start.calls), 0))
			assert.Check(t, is.Equal(start.timeline.Result, "joined"))
		})
	}
}

func (r *rig) quietLogger() *system.Logger {
	r.log = &nodetest.SyncBuffer{}
	l := system.NewLogger("dynk8s-clean-identity", r.log, r.root)
	l.Journal = false
	return l
}

// bakeCommand runs `dynk8s-node bake` on the rig's root with the rig's pool's bake.json, and returns its log.
func (r *rig) bakeCommand() (string, []byte, error) {
	r.t.Helper()
	cfg, err := r.cfg.Bake().Encode()
	assert.NilError(r.t, err)
	path := filepath.Join(r.root, "etc/dynk8s/bake.json")
	assert.NilError(r.t, os.MkdirAll(filepath.Dir(path), 0o755))
	assert.NilError(r.t, os.WriteFile(path, cfg, 0o644))
	r.log = &nodetest.SyncBuffer{}
	log := system.NewLogger("dynk8s-bake", r.log, r.root)
	log.Journal = false
	env := &cli.Env{Files: system.Files{Root: r.root, Proc: filepath.Join(r.root, "proc")}, Log: log, Out: r.log,
		Config: path}
	err = bakeImage(context.Background(), env, r.host)
	r.t.Logf("bake: %v\n%s", err, r.log.String())
	return r.log.String(), cfg, err
}

// The bake command, as a bake instance's unit runs it: the prepare from bake.json and its marker, then the identity
// removed (bake.json with it) and the image checked, then the power-off, last; a boot from what it leaves joins
// without dnf. A bake that fails never powers off: the instance keeps running with its reason on the console.
func TestBakeCommandPreparesCleansAndPowersOff(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	log, cfg, err := r.bakeCommand()
	assert.NilError(t, err)
	calls := r.host.Recorded()
	assert.Check(t, is.Equal(calls[len(calls)-1], "systemctl --no-block poweroff"), "the last call: %v", calls)
	m := r.marker()
	assert.Check(t, is.Equal(m.Config.SHA256, fmt.Sprintf("%x", sha256.Sum256(cfg))))
	_, statErr := os.Stat(filepath.Join(r.root, "etc/dynk8s/bake.json"))
	assert.Check(t, os.IsNotExist(statErr), "bake.json is left in the image: %v", statErr)
	id, _ := os.ReadFile(filepath.Join(r.root, "etc/machine-id"))
	assert.Check(t, is.Equal(string(id), "uninitialized\n"))
	assert.Check(t, is.Contains(log, "powering off for the image to be taken"))
	assert.Check(t, is.Equal(r.imds.Requests, 0), "a bake reads no IMDS")

	r.reboot()
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, is.Len(dnfCalls(run.calls), 0), "the baked boot ran dnf: %v", run.calls)

	bad := newRig(t, "", "")
	bad.cfg.Packages = []string{"kubelet-1.35.0", "kubeadm-1.34.4", "cri-tools-1.34.*", "cri-o-1.34.*"}
	_, _, err = bad.bakeCommand()
	assert.ErrorContains(t, err, "not kubelet-1.35.0")
	assert.Check(t, !slices.Contains(bad.host.Recorded(), "systemctl --no-block poweroff"), "a failed bake powered off")
}

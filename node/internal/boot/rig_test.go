package boot

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/cloud/cloudfake"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// fakeHost records every command line, fails those listed, and plays kubeadm, crictl and the tools' presence.
type fakeHost struct {
	nodetest.Calls
	mu   sync.Mutex
	root string
	// fail: command lines (exact) that fail; failN: a command's name that fails its first n runs.
	fail  map[string]bool
	failN map[string]int
	// missing: commands not on PATH; modulesMissing: modules modprobe cannot load until kernel-modules-extra is in;
	// rpmMissing: packages rpm -q does not find; dnfNeedsRepo: a repository every transaction needs.
	missing        []string
	modulesMissing []string
	rpmMissing     []string
	dnfNeedsRepo   string
	modulesExtra   bool
	// dnf4: dnf answers versionlock as dnf4 does without its plugin, until a transaction installs
	// dnf-command(versionlock); dnfTail: what a failed dnf install writes last (its reason).
	dnf4, versionlockPlugin bool
	dnfTail                 string
	// rpmDB: the pinned packages installed, by name (dnf installs them at the repository's versions, repoVersions).
	rpmDB map[string]rpmPackage
	// blkid is the file system blkid finds on a cache volume's device ("": none).
	blkid string
	// gates: a command line (exact) that waits for its channel to close before it runs; its context's end, or 30 s,
	// fails it.
	gates map[string]chan struct{}
	// awaitJoin makes a pull last until kubeadm join has run, as a big image would.
	awaitJoin chan struct{}
	joined    bool
	// joinConfigs are the JoinConfigurations kubeadm join got, with their modes.
	joinConfigs []string
	joinModes   []os.FileMode
	// joinKeys are the kubelet bootstrap keys each kubeadm join found ("": none).
	joinKeys []string
}

func (h *fakeHost) Has(name string) bool { return !slices.Contains(h.missing, name) }

// waitGate waits for line's gate, if it has one.
func (h *fakeHost) waitGate(ctx context.Context, line string) error {
	gate := h.gates[line]
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second): // a hang's bound, not a speed target
		return fmt.Errorf("%s: waited 30 s for its gate", line)
	}
}

func (h *fakeHost) Run(ctx context.Context, _ time.Duration, _ bool, name string, args ...string) error {
	line := h.Record(name, args)
	if err := h.waitGate(ctx, line); err != nil {
		return err
	}
	h.mu.Lock()
	failed := h.fail[line]
	if h.failN[name] > 0 {
		h.failN[name]--
		failed = true
	}
	h.mu.Unlock()
	if name == "kubeadm" && args[0] == "join" {
		return h.kubeadmJoin(args[2], failed)
	}
	if name == "kubeadm" && args[0] == "reset" && !failed {
		// kubeadm reset empties /var/lib/kubelet (cmd/kubeadm/app/cmd/phases/reset/cleanupnode.go).
		entries, _ := os.ReadDir(filepath.Join(h.root, "var/lib/kubelet"))
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(h.root, "var/lib/kubelet", e.Name())); err != nil {
				return err
			}
		}
	}
	if failed {
		tail := ""
		if name == "dnf" {
			tail = h.dnfTail
		}
		return &system.ExitError{Name: name, Code: 1, Tail: tail}
	}
	switch name {
	case "modprobe":
		h.mu.Lock()
		defer h.mu.Unlock()
		if slices.Contains(h.modulesMissing, args[0]) && !h.modulesExtra {
			return &system.ExitError{Name: name, Code: 1}
		}
	case "rpm":
		if slices.Contains(h.rpmMissing, args[2]) {
			return &system.ExitError{Name: name, Code: 1}
		}
	case "dnf":
		if slices.Contains(args, "versionlock") {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.dnf4 && !h.versionlockPlugin {
				return &system.ExitError{Name: name, Code: 1, Tail: "No such command: versionlock. Please use /usr/bin/dnf --help\n" +
					"It could be a DNF plugin command, try: \"dnf install 'dnf-command(versionlock)'\"\n"}
			}
			return nil
		}
		if h.dnfNeedsRepo != "" && !slices.Contains(args, "--repo="+h.dnfNeedsRepo) {
			return &system.ExitError{Name: name, Code: 1, Tail: h.dnfTail}
		}
		if slices.Contains(args, "dnf-command(versionlock)") {
			h.mu.Lock()
			h.versionlockPlugin = true
			h.mu.Unlock()
		}
		if strings.Contains(line, " kernel-modules-extra-") {
			h.mu.Lock()
			h.modulesExtra = true
			h.mu.Unlock()
		}
		h.install(args)
	case "crictl":
		if h.awaitJoin != nil {
			select {
			case <-h.awaitJoin:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if args[len(args)-1] == "docker.io/library/busybox:latest" {
			return &system.ExitError{Name: name, Code: 1}
		}
	}
	return nil
}

// install: what a dnf transaction leaves in rpmDB, the pinned packages at the repositories' versions and the
// system packages the image lacked.
func (h *fakeHost) install(args []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rpmDB == nil {
		h.rpmDB = map[string]rpmPackage{}
	}
	for _, a := range args {
		for name, p := range repoVersions {
			if strings.HasPrefix(a, name+"-") {
				h.rpmDB[name] = p
			}
		}
		if slices.Contains(h.rpmMissing, a) {
			h.rpmDB[a] = fakeRPM(a, "1.0", "1.fc43", "noarch")
		}
	}
}

// repoVersions are what the pinned repositories hold: what the fake dnf installs for kubelet-1.34.4 and the rest.
var repoVersions = map[string]rpmPackage{
	"kubelet":   fakeRPM("kubelet", "1.34.4", "150500.1.1", "x86_64"),
	"kubeadm":   fakeRPM("kubeadm", "1.34.4", "150500.1.1", "x86_64"),
	"cri-tools": fakeRPM("cri-tools", "1.34.0", "150500.1.1", "x86_64"),
	"cri-o":     fakeRPM("cri-o", "1.34.2", "150500.1.1", "x86_64"),
}

func fakeRPM(name, version, release, arch string) rpmPackage {
	return rpmPackage{name: name, version: version, release: release, nevra: name + "-" + version + "-" + release + "." + arch}
}

// Output plays rpm -q --qf rpmQueryFormat: the pinned packages from rpmDB, the system packages unless rpmMissing.
func (h *fakeHost) Output(_ context.Context, _ time.Duration, name string, args ...string) (string, error) {
	line := h.Record(name, args)
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(args)
	if name == "blkid" {
		if h.blkid == "" {
			return "", &system.ExitError{Name: name, Code: 2}
		}
		return h.blkid + "\n", nil
	}
	if name != "rpm" || args[0] != "-q" || n < 4 || args[n-3] != "--qf" || args[n-2] != rpmQueryFormat {
		return "", fmt.Errorf("fake host: no output for %s", line)
	}
	pkg := args[n-1]
	p, ok := h.rpmDB[pkg]
	if slices.Contains(args, "--whatprovides") && !ok && !slices.Contains(h.rpmMissing, pkg) {
		p, ok = fakeRPM(pkg, "1.0", "1.fc43", "noarch"), true
	}
	if !ok {
		return "package " + pkg + " is not installed\n", &system.ExitError{Name: name, Code: 1}
	}
	return strings.Join([]string{p.name, p.version, p.release, p.nevra}, "\t") + "\n", nil
}

// kubeadmJoin records the JoinConfiguration and, unless it fails, joins: kubelet.conf appears.
func (h *fakeHost) kubeadmJoin(config string, fail bool) error {
	b, err := os.ReadFile(config)
	if err != nil {
		return err
	}
	st, err := os.Stat(config)
	if err != nil {
		return err
	}
	key, _ := os.ReadFile(filepath.Join(h.root, "var/lib/kubelet/pki/kubelet-client.key.tmp"))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.joinKeys = append(h.joinKeys, string(key))
	h.joinConfigs = append(h.joinConfigs, string(b))
	h.joinModes = append(h.joinModes, st.Mode().Perm())
	if fail {
		return &system.ExitError{Name: "kubeadm", Code: 1}
	}
	if h.awaitJoin != nil && !h.joined {
		close(h.awaitJoin)
	}
	h.joined = true
	dir := filepath.Join(h.root, "etc/kubernetes")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "kubelet.conf"), nil, 0o600)
}

// rig is one instance for the agent: its root, its config, the fakes, and what the last run logged.
type rig struct {
	t    *testing.T
	root string
	cfg  nodeconfig.Node
	imds *cloudfake.IMDS
	ssm  *cloudfake.SSM
	asg  *cloudfake.AutoScaling
	ec2  *cloudfake.EC2
	host *fakeHost
	log  *nodetest.SyncBuffer
	// skip are the phases the join skips (--skip).
	skip map[string]bool
}

// newRig is a spot pool's instance in lifecycle state ("": none) with a launch hook hook ("": none) and an API server
// that answers.
func newRig(t *testing.T, lifecycle, hook string) *rig {
	t.Helper()
	root := t.TempDir()
	for path, content := range map[string]string{"proc/sys/net/ipv4/ip_forward": "1\n", "proc/uptime": "42.50 80.00\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	api := fakeaws.NewAPIServer(t, 0)
	r := &rig{t: t, root: root, imds: cloudfake.NewIMDS(lifecycle, ""), ssm: &cloudfake.SSM{Value: cloudfake.Token}, asg: &cloudfake.AutoScaling{},
		ec2: &cloudfake.EC2{State: "stopped"}, host: &fakeHost{root: root, fail: map[string]bool{}, failN: map[string]int{}}}
	r.cfg = nodeconfig.Node{
		ClusterName: "homelab", PoolName: "spot-arm64", APIServerEndpoint: endpoint.MustParse(strings.TrimPrefix(api.URL, "https://")),
		JoinTokenParameter: cloudfake.TokenParameter, LaunchHook: hook, CRISocket: "unix:///var/run/crio/crio.sock",
		KernelModules: []string{"overlay", "br_netfilter"},
		Packages:      []string{"kubelet-1.34.4", "kubeadm-1.34.4", "cri-tools-1.34.*", "cri-o-1.34.*"},
		Repos:         []string{"dynk8s-kubernetes", "dynk8s-cri-o"}, SystemPackages: []string{"container-selinux", "iptables", "nftables"},
		SystemRepos: []string{"fedora"}, UpdateRepos: []string{"updates"},
		PrePullImages: []string{"registry.k8s.io/pause:3.10.1", "registry.k8s.io/kube-proxy:v1.34.4"},
		Join: nodeconfig.Join{CACertHashes: []string{cloudfake.CAHash}, PatchesDirectory: "/etc/kubernetes/patches",
			Labels: map[string]string{"dynk8s.io/pool": "spot-arm64", "dynk8s.io/capacity-type": "spot"},
			Taints: []kube.Taint{{Key: "dynk8s.io/capacity-type", Value: "spot", Effect: "NoSchedule"}}},
		Host: nodeconfig.Host{OnPremCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}, TunnelMTU: 1420,
			MetadataUIDs: []int{1000}},
		Deadlines: nodeconfig.DefaultDeadlines,
	}
	r.cfg.Deadlines.Join = nodeconfig.Duration(5 * time.Second)
	r.cfg.Deadlines.Wake = nodeconfig.Duration(5 * time.Second)
	r.cfg.Deadlines.BackoffInitial = nodeconfig.Duration(20 * time.Millisecond)
	r.cfg.Deadlines.BackoffMax = nodeconfig.Duration(100 * time.Millisecond)
	r.cfg.Deadlines.WakeSettle = nodeconfig.Duration(300 * time.Millisecond)
	r.cfg.Deadlines.WakeInterval = nodeconfig.Duration(100 * time.Millisecond)
	return r
}

func (r *rig) cloud() *cloud.Cloud {
	return &cloud.Cloud{IMDS: r.imds, Connect: func(c *cloud.Cloud, region, domain string) {
		if region != "eu-central-1" || domain == "" {
			r.t.Errorf("connect(%q, %q)", region, domain)
		}
		c.SSM, c.ASG, c.EC2 = r.ssm, r.asg, r.ec2
	}}
}

// joinRun is what one run of the join did.
type joinRun struct {
	root     string
	err      error
	waited   bool // the warm pool's quiet tick
	log      string
	calls    []string
	elapsed  time.Duration
	timeline *system.TimelineDoc
}

// join runs the agent's join as main does (already joined, waiting, then the boot) and reads its timeline.
func (r *rig) join() joinRun {
	r.t.Helper()
	r.log = &nodetest.SyncBuffer{}
	f := system.Files{Root: r.root, Proc: filepath.Join(r.root, "proc")}
	log := system.NewLogger("dynk8s-join", r.log, r.root)
	log.Journal = false
	before := len(r.host.Recorded())
	start := time.Now()
	run := joinRun{root: r.root}
	if alreadyJoined(f) {
		log.Printf("already joined; nothing to do")
	} else {
		j := newJoiner(&bootEnv{skip: r.skip, cfg: r.cfg, cloud: r.cloud(), host: r.host, files: f, log: log,
			clock: system.NewClock(r.cfg.Deadlines.Join.D(), r.cfg.Deadlines.BackoffInitial.D(), r.cfg.Deadlines.BackoffMax.D()),
			tl:    system.NewTimeline(time.Now)})
		// One read per run here; TestJoinWaitingReadsTheStateUntilInService has the polling.
		if j.waiting(context.Background(), 0, 0) {
			run.waited = true
		} else {
			run.err = j.Run(context.Background())
		}
	}
	run.elapsed = time.Since(start)
	run.log = r.log.String()
	run.calls = r.host.Recorded()[before:]
	if b, err := os.ReadFile(filepath.Join(r.root, "run/dynk8s/timeline.json")); err == nil {
		var tl system.TimelineDoc
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&tl); err != nil {
			r.t.Fatalf("timeline.json: %v\n%s", err, b)
		}
		run.timeline = &tl
	}
	r.t.Logf("join: %v after %s\n%s", run.err, run.elapsed.Round(time.Millisecond), run.log)
	return run
}

// reboot is what a stop and start leaves: /run is a tmpfs.
func (r *rig) reboot() {
	r.t.Helper()
	if err := os.RemoveAll(filepath.Join(r.root, "run")); err != nil {
		r.t.Fatal(err)
	}
}

func (run joinRun) phases() []string {
	if run.timeline == nil {
		return nil
	}
	var out []string
	for _, p := range run.timeline.Phases {
		out = append(out, p.Name)
	}
	return out
}

// index is the position of the first call that starts with prefix, -1 for none.
func (run joinRun) index(prefix string) int {
	return slices.IndexFunc(run.calls, func(c string) bool { return strings.HasPrefix(c, prefix) })
}

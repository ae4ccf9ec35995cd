//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The box: one "instance" booted from the rendered user data under real systemd and real cloud-init. The cached
// Debian root (hack/tools.sh --box-root) gets an overlay of its own per box, so the cache stays clean and a second
// boot of the same box is a stop and start of the same instance (its disk kept, /run gone). systemd-nspawn boots it
// in a network namespace the test made, where the test's forwarders answer for the instance metadata service
// (169.254.169.254:80), moto and the API server.
//
// What the box adds to the root, and only to the box (none of it is in the user data): the NoCloud seed, dnf and
// rpm stand-ins with the kubelet's and kubeadm's real binaries and their packages' units, containerd behind CRI-O's
// socket (testdata/box), a writable /proc/sys/net and writable cgroup controllers with a cgroup root of its own
// for the kubelet (dynk8s-box-apivfs.service), the AWS endpoints for the join and agent units (on EC2 the service names
// resolve; here they are loopback ports), and empty overrides of two Debian sysctl.d files that write kernel-wide
// settings a container may not.
type box struct {
	name       string // the network namespace's name, the box's cgroup root
	dir        string
	root       string // the overlay's merged directory: the box's /
	netns      string // /run/netns/<name>
	cgroupRoot string
	binds      []string
	cur        *boxBoot
	boots      []time.Duration // each finished boot's wall time, nspawn start to exit
}

// boxBoot is one run of systemd-nspawn.
type boxBoot struct {
	cmd     *exec.Cmd
	done    chan struct{}
	console *nodetest.SyncBuffer
	start   time.Time
}

type boxSpec struct {
	// name: a short unique name (network namespace, cgroup root).
	name, instanceID, hostname, nodeIP string
	// userData is the launch template's user data as EC2 hands it to the instance (base64 decoded: gzip).
	userData []byte
	// forwards: loopback addresses of the test's servers that the box reaches at the same address.
	forwards []string
	// imds is the fake IMDS's host:port, answered inside the box on 169.254.169.254:80.
	imds string
	// endpoints: the endpoint overrides for the join and agent units (DYNK8S_SSM_ENDPOINT=...).
	endpoints map[string]string
	// router is the "VPC router" the box's interface leads to: a network namespace of the test's shared by the
	// boxes of one VPC (see vpcRouter); "" for one of the box's own, in its namespace, where nothing leaves.
	router *vpcRouter
	// image is a layer over the cached root that the instance's disk starts from (a baked image: what a box that
	// baked it changed, see bakedImage); "": the stock root.
	image string
}

// launchTemplateUserData is what EC2 gives an instance of a launch template whose user data is cloudinit.Encode's.
func launchTemplateUserData(t *testing.T, userData []byte) []byte {
	t.Helper()
	enc, err := cloudinit.Encode(userData)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// boxRoot is the cached root, or the test skips (fails under DYNK8S_REQUIRE_TOOLS) without it.
func boxRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join("..", "hack", "tools.sh"), "--box-root").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh --box-root: %v", err)
	}
	root := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(root, ".dynk8s-box")); err != nil {
		missing(t, "the box root (hack/tools.sh builds it): "+err.Error())
	}
	return root
}

func newBox(t *testing.T, spec boxSpec) *box {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "root (mounts, network namespaces, systemd-nspawn)")
	}
	for _, tool := range []string{"systemd-nspawn", "ip", "mount", "nsenter", "journalctl"} {
		requireTool(t, tool)
	}
	lower := boxRoot(t)
	b := &box{name: spec.name, dir: t.TempDir(), netns: "/run/netns/" + spec.name, cgroupRoot: "dynk8s-" + spec.name}
	b.root = filepath.Join(b.dir, "merged")
	for _, d := range []string{"upper", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(b.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if spec.image != "" {
		lower = spec.image + ":" + lower
	}
	run(t, "mount", "-t", "overlay", "overlay", "-o",
		"lowerdir="+lower+",upperdir="+filepath.Join(b.dir, "upper")+",workdir="+filepath.Join(b.dir, "work"), b.root)
	t.Cleanup(func() {
		if err := exec.Command("umount", b.root).Run(); err != nil {
			t.Errorf("umount %s: %v", b.root, err)
		}
		removeCgroupTrees(t, b.cgroupRoot)
		removeCgroupTrees(t, b.nspawnCgroup())
	})
	b.network(t, spec)
	b.provision(t, spec)

	for _, tool := range []string{"kubelet", "kubeadm"} {
		b.binds = append(b.binds, "--bind-ro="+requireTool(t, tool)+":/opt/dynk8s-box/bin/"+tool)
	}
	return b
}

// network makes the box's network namespace: the instance's interface with its private IP and a default route via
// the "VPC router" (the veth's other end: in the same namespace, where nothing leaves it, or in spec.router's), and
// the metadata service's address, where a forwarder answers for the fake IMDS.
func (b *box) network(t *testing.T, spec boxSpec) {
	t.Helper()
	run(t, "ip", "netns", "add", spec.name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", spec.name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", spec.name, err, out)
		}
	})
	gw := spec.nodeIP[:strings.LastIndexByte(spec.nodeIP, '.')] + ".1"
	peer := "vpc0"
	if spec.router != nil {
		peer = spec.router.port()
	}
	steps := [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", "169.254.169.254/32", "dev", "lo"},
		{"link", "add", "eth0", "type", "veth", "peer", "name", peer},
		{"addr", "add", spec.nodeIP + "/24", "dev", "eth0"},
	}
	if spec.router == nil {
		steps = append(steps, []string{"addr", "add", gw + "/24", "dev", peer}, []string{"link", "set", peer, "up"})
	} else {
		steps = append(steps, []string{"link", "set", peer, "netns", spec.router.name})
	}
	steps = append(steps, []string{"link", "set", "eth0", "up"})
	for _, args := range steps {
		run(t, "ip", append([]string{"-n", spec.name}, args...)...)
	}
	if spec.router != nil {
		spec.router.attach(t, peer, spec.nodeIP, gw)
	}
	run(t, "ip", "-n", spec.name, "route", "add", "default", "via", gw, "dev", "eth0")
	forwardIntoNetnsFile(t, b.netns, "169.254.169.254:80", spec.imds)
	for _, addr := range spec.forwards {
		forwardIntoNetnsFile(t, b.netns, addr, addr)
	}
}

// provision writes the box's own files (see box) and the NoCloud seed.
func (b *box) provision(t *testing.T, spec boxSpec) {
	t.Helper()
	src := filepath.Join("testdata", "box")
	read := func(name string) string {
		c, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(c)
	}
	var env strings.Builder
	env.WriteString("[Service]\n")
	for _, k := range slices.Sorted(maps.Keys(spec.endpoints)) {
		env.WriteString("Environment=" + k + "=" + spec.endpoints[k] + "\n")
	}
	files := []struct {
		path, content string
		mode          os.FileMode
	}{
		{"/var/lib/cloud/seed/nocloud/meta-data", "instance-id: " + spec.instanceID + "\nlocal-hostname: " +
			spec.hostname + "\n", 0o644},
		{"/var/lib/cloud/seed/nocloud/user-data", string(spec.userData), 0o600},
		// A machine ID of its own, kept across its boots: journalctl -D reads every boot of the instance.
		{"/etc/machine-id", fmt.Sprintf("%032x\n", []byte(spec.instanceID))[:32] + "\n", 0o444},
		{"/etc/hosts", "127.0.0.1 localhost\n" + spec.nodeIP + " " + spec.hostname + "\n", 0o644},
		{"/usr/local/bin/dnf", read("dnf"), 0o755},
		{"/usr/local/bin/rpm", read("rpm"), 0o755},
		{"/opt/dynk8s-box/units/kubelet.service", read("kubelet.service"), 0o644},
		{"/opt/dynk8s-box/units/10-kubeadm.conf", read("10-kubeadm.conf"), 0o644},
		{"/opt/dynk8s-box/units/crio.service", read("crio.service"), 0o644},
		{"/opt/dynk8s-box/containerd.toml", read("containerd.toml"), 0o644},
		{"/opt/dynk8s-box/apivfs.sh", read("apivfs.sh"), 0o755},
		{"/opt/dynk8s-box/cgroup-root.env", "BOX_CGROUP_ROOT=" + b.cgroupRoot + "\n", 0o644},
		{"/etc/systemd/system/dynk8s-box-apivfs.service", read("dynk8s-box-apivfs.service"), 0o644},
		{"/etc/cni/net.d/10-box-bridge.conflist", read("10-box-bridge.conflist"), 0o644},
		{"/etc/kubernetes/patches/kubeletconfiguration-box+merge.yaml", "cgroupRoot: /" + b.cgroupRoot + "\n", 0o644},
		{"/etc/systemd/system/dynk8s-join.service.d/90-box-endpoints.conf", env.String(), 0o644},
		{"/etc/systemd/system/dynk8s-agent.service.d/90-box-endpoints.conf", env.String(), 0o644},
		{"/etc/sysctl.d/50-pid-max.conf", "", 0o644},
		{"/etc/sysctl.d/99-protect-links.conf", "", 0o644},
	}
	for _, f := range files {
		p := filepath.Join(b.root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.content), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"/var/log/journal", "/etc/systemd/system/sysinit.target.wants"} {
		if err := os.MkdirAll(filepath.Join(b.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// An image baked in a box has both done already.
	if err := os.Symlink("../dynk8s-box-apivfs.service",
		filepath.Join(b.root, "/etc/systemd/system/sysinit.target.wants/dynk8s-box-apivfs.service")); err != nil &&
		!errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	// Debian's containerd package enables its own service; the box's runtime is crio.service.
	if err := os.Remove(filepath.Join(b.root, "/etc/systemd/system/multi-user.target.wants/containerd.service")); err != nil &&
		!errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

// boot starts the box (one start of the instance); the test ends it with poweroff, or the box powers itself off.
func (b *box) boot(t *testing.T) {
	t.Helper()
	if b.cur != nil && b.running() {
		t.Fatal("the box is still running")
	}
	args := append([]string{"--quiet", "-D", b.root, "--boot", "--register=no", "--keep-unit",
		"--network-namespace-path=" + b.netns, "--console=pipe",
		// What --private-network grants: the network namespace is the box's own (routes, net.* sysctls).
		"--capability=CAP_NET_ADMIN",
		// The kubelet will not start without a /dev/kmsg to open (its OOM watcher reads the kernel log), which a VM
		// has and a container does not; reading the host's would take CAP_SYSLOG. An empty one will do: no pod runs.
		"--bind-ro=/dev/null:/dev/kmsg"}, b.binds...)
	// systemd-nspawn puts the box's systemd in a "payload" cgroup beside its own (name=systemd and unified
	// hierarchies): started from the root cgroup, as here with no systemd on the host, every box would share
	// /payload, and one box's systemd would stop the other's units. So nspawn starts in a cgroup of the box's own.
	var groups []string
	for _, h := range []string{"systemd", "unified"} {
		g := filepath.Join("/sys/fs/cgroup", h, b.nspawnCgroup())
		if _, err := os.Stat(filepath.Dir(g)); err != nil {
			continue
		}
		if err := os.MkdirAll(g, 0o755); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g)
	}
	cmd := exec.Command("sh", append([]string{"-c", `for g in $BOX_CGROUPS; do echo $$ >"$g/cgroup.procs"; done; exec "$0" "$@"`,
		"systemd-nspawn"}, args...)...)
	cmd.Env = append(os.Environ(), "BOX_CGROUPS="+strings.Join(groups, " "))
	bb := &boxBoot{cmd: cmd, done: make(chan struct{}), console: &nodetest.SyncBuffer{}, start: time.Now()}
	cmd.Stdout, cmd.Stderr = bb.console, bb.console
	// Should the test die, nspawn shuts the box down on SIGTERM (a SIGKILL would leave it running, orphaned).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	go func() {
		_ = cmd.Wait()
		b.boots = append(b.boots, time.Since(bb.start))
		close(bb.done)
	}()
	b.cur = bb
	t.Cleanup(func() {
		if !b.running() {
			return
		}
		if t.Failed() {
			b.diagnose(t)
		}
		if err := b.poweroff(30 * time.Second); err != nil {
			t.Errorf("box %s: %v; killing it", b.name, err)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-bb.done
		}
	})
}

// nspawnCgroup is the cgroup (name=systemd and unified hierarchies) systemd-nspawn runs the box in.
func (b *box) nspawnCgroup() string { return "dynk8s-nspawn-" + b.name }

func (b *box) running() bool {
	select {
	case <-b.cur.done:
		return false
	default:
		return true
	}
}

// leader is the box's PID 1 as the host sees it: systemd-nspawn's child.
func (b *box) leader() (int, error) {
	pid := b.cur.cmd.Process.Pid
	c, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(c))
	if len(f) == 0 {
		return 0, errors.New("systemd-nspawn has no child yet")
	}
	return strconv.Atoi(f[0])
}

// exec runs a command inside the running box (its namespaces) and returns its combined output.
func (b *box) exec(ctx context.Context, args ...string) (string, error) {
	pid, err := b.leader()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(pid), "-m", "-u", "-i", "-n", "-p",
		"--", "env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	return out.String(), err
}

// wait polls cond inside the box until it holds, the box stops, or timeout passes.
func (b *box) wait(ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond(ctx) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %s", what, timeout)
		}
		select {
		case <-b.cur.done:
			return fmt.Errorf("%s: the box stopped first", what)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitBooted waits until systemd has finished the boot transaction: no job left (systemctl is-system-running says
// running or degraded, never starting).
func (b *box) waitBooted(ctx context.Context, timeout time.Duration) error {
	return b.wait(ctx, timeout, "boot finished", func(ctx context.Context) bool {
		out, _ := b.exec(ctx, "systemctl", "is-system-running")
		s := strings.TrimSpace(out)
		return s == "running" || s == "degraded"
	})
}

// waitStopped waits for the box to power itself off.
func (b *box) waitStopped(timeout time.Duration) error {
	select {
	case <-b.cur.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("the box did not power off within %s", timeout)
	}
}

// poweroff stops the instance as a stop from the console would: systemd's orderly shutdown.
func (b *box) poweroff(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := b.exec(ctx, "systemctl", "poweroff"); err != nil && b.running() {
		return fmt.Errorf("systemctl poweroff: %w: %s", err, out)
	}
	return b.waitStopped(timeout)
}

// diagnose logs what a failed boot left: while the box runs, its failed units, jobs and cloud-init's status; in any
// case its journal (every boot) and the stand-ins' calls.
func (b *box) diagnose(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.cur != nil && b.running() {
		for _, args := range [][]string{
			{"systemctl", "--failed", "--no-pager"},
			{"systemctl", "list-jobs", "--no-pager"},
			{"cloud-init", "status", "--long"},
			{"nft", "list", "ruleset"},
		} {
			out, err := b.exec(ctx, args...)
			t.Logf("box %s: %s (%v):\n%s", b.name, strings.Join(args, " "), err, out)
		}
	}
	journal := func(args ...string) string {
		out, err := exec.CommandContext(ctx, "journalctl", append([]string{"-D", filepath.Join(b.root, "var/log/journal"),
			"--no-pager", "-o", "short-monotonic"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%s(journalctl: %v)", out, err)
		}
		return string(out)
	}
	// The boot's own units in full, then the last of everything (the kubelet alone can fill it).
	t.Logf("box %s: journalctl -D, the dynk8s units, every boot:\n%s", b.name, journal("-u", "dynk8s-*", "-u", "cloud-final.service"))
	t.Logf("box %s: journalctl -D, the last lines:\n%s", b.name, tail(journal(), 150))
	calls, _ := os.ReadFile(filepath.Join(b.root, "var/log/dynk8s-box/calls.log"))
	t.Logf("box %s: dnf/rpm stand-in calls:\n%s", b.name, calls)
	if b.cur != nil {
		t.Logf("box %s: systemd-nspawn output:\n%s", b.name, tail(b.cur.console.String(), 60))
	}
}

// file reads a file of the box's disk (what persists across its boots), from the host.
func (b *box) file(t *testing.T, path string) string {
	t.Helper()
	c, err := os.ReadFile(filepath.Join(b.root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(c)
}

// removeCgroupTrees removes /sys/fs/cgroup/<controller>/<name> with everything below it.
func removeCgroupTrees(t *testing.T, name string) {
	t.Helper()
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	for _, root := range roots {
		removeCgroupTree(t, root)
	}
}

// removeCgroupTree removes one cgroup directory and those below it, deepest first (a cgroup is removed with rmdir,
// and only once it has no children).
func removeCgroupTree(t *testing.T, root string) {
	t.Helper()
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			t.Logf("remove cgroup %s: %v", dirs[i], err)
		}
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

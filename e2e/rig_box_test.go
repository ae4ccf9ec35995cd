//go:build e2e

package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The box: one "instance" booted from the rendered user data under real systemd and real cloud-init. The cached
// Debian root (hack/tools.sh --box-root) gets an overlay of its own per box, so the cache stays clean and a second
// boot of the same box is a stop and start of the same instance (its disk kept, /run gone). systemd-nspawn boots it
// in a network namespace the test made, where the test's forwarders answer for the instance metadata service
// (169.254.169.254:80), moto and the API server.
//
// What the box adds to the root, and only to the box (none of it is in the user data): the NoCloud seed, its
// upstream repositories' base URLs pointed at signed local ones (localRepositories); what a Fedora Cloud image has
// for the box root's real dnf 4 and rpm (installImage: rpm's database with the image package, the fedora and updates
// repositories; yumAddRepoStage: cloud-init's yum_add_repo in its config stage); the kubelet's and kubeadm's real
// binaries, which the local kubelet and kubeadm packages run; containerd behind CRI-O's socket (testdata/box), a
// writable /proc/sys/net and writable cgroup controllers with a cgroup root of its own for the kubelet
// (dynk8s-box-apivfs.service), the AWS endpoints for the join and agent units (on EC2 the service names resolve;
// here they are loopback ports), and empty overrides of two Debian sysctl.d files that write kernel-wide settings a
// container may not.
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
	// volumes are the loop devices of the volumes attached during this boot, by volume id (rig_volumes_test.go),
	// under volumesMu: the boot's end lets them go.
	volumesMu sync.Mutex
	volumes   map[string]string
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
	// installed: globs of rpm files under boxRepos that the instance's rpm database holds before its boot (an earlier
	// life of the instance installed them); the stock image's own package in any case, unless image is set (a baked
	// image has its database already).
	installed []string
}

// launchTemplateUserData is what EC2 gives an instance of a launch template whose user data is cloudinit.Encode's.
func launchTemplateUserData(t *testing.T, userData []byte) []byte {
	t.Helper()
	enc, err := cloudinit.Encode(userData)
	assert.NilError(t, err)
	raw, err := base64.StdEncoding.DecodeString(enc)
	assert.NilError(t, err)
	return raw
}

// boxRoot is the cached root, or the test skips (fails under DYNK8S_REQUIRE_TOOLS) without it.
func boxRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join("..", "hack", "tools.sh"), "--box-root").Output()
	assert.NilError(t, err, "hack/tools.sh --box-root")
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
		assert.NilError(t, os.MkdirAll(filepath.Join(b.dir, d), 0o755))
	}
	if spec.image != "" {
		lower = spec.image + ":" + lower
	}
	run(t, "mount", "-t", "overlay", "overlay", "-o",
		"lowerdir="+lower+",upperdir="+filepath.Join(b.dir, "upper")+",workdir="+filepath.Join(b.dir, "work"), b.root)
	t.Cleanup(func() {
		assert.Check(t, exec.Command("umount", b.root).Run(), "umount %s", b.root)
		removeCgroupTrees(t, b.cgroupRoot)
		removeCgroupTrees(t, b.nspawnCgroup())
	})
	b.network(t, spec)
	b.provision(t, spec)
	repos := boxPackageRepos(t)
	b.binds = append(b.binds, "--bind-ro="+repos+":"+boxRepos)
	if spec.image == "" {
		b.installImage(t, repos, spec.installed...)
	}

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
		assert.NilError(t, err)
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
		{"/var/lib/cloud/seed/nocloud/user-data", string(localRepositories(t, spec.userData)), 0o600},
		{"/etc/cloud/cloud.cfg.d/91-dynk8s-box-yum.cfg", yumAddRepoStage(t, b.root), 0o644},
		{"/etc/cloud/cloud.cfg.d/92-dynk8s-box-locale.cfg", boxLocale, 0o644},
		// A machine ID of its own, kept across its boots: journalctl -D reads every boot of the instance.
		{"/etc/machine-id", fmt.Sprintf("%032x\n", []byte(spec.instanceID))[:32] + "\n", 0o444},
		{"/etc/hosts", "127.0.0.1 localhost\n" + spec.nodeIP + " " + spec.hostname + "\n", 0o644},
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
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(f.content), f.mode))
	}
	for _, d := range []string{"/var/log/journal", "/etc/systemd/system/sysinit.target.wants"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(b.root, d), 0o755))
	}
	// An image baked in a box has both done already.
	if err := os.Symlink("../dynk8s-box-apivfs.service",
		filepath.Join(b.root, "/etc/systemd/system/sysinit.target.wants/dynk8s-box-apivfs.service")); err != nil &&
		!errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	b.builtinModules(t)
	// Debian's containerd package enables its own service; the box's runtime is crio.service.
	if err := os.Remove(filepath.Join(b.root, "/etc/systemd/system/multi-user.target.wants/containerd.service")); err != nil &&
		!errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

// kernelModules are the node's modules (the pools' kernelModules) by the path a kernel's modules.builtin names them
// with, and how this machine's kernel shows it has each, built in or loaded.
var kernelModules = []struct{ name, path, present string }{
	{"overlay", "kernel/fs/overlayfs/overlay.ko", "/sys/module/overlay"},
	{"br_netfilter", "kernel/net/bridge/br_netfilter.ko", "/proc/sys/net/bridge/bridge-nf-call-iptables"},
}

// builtinModules gives the box's modprobe the modules its kernel (this machine's) has: a Fedora kernel package ships
// /lib/modules/$(uname -r) with its modules and their indexes, which the box lacks, so its modprobe would fail for
// overlay and br_netfilter although the kernel has them, and the boot would try to install kernel-modules-extra
// (which the box's repositories cannot have for this kernel). The modules this kernel has are listed as built in,
// and the box root's depmod builds modprobe's indexes from that list; one it lacks stays missing, as on a kernel
// without it.
func (b *box) builtinModules(t *testing.T) {
	t.Helper()
	var u unix.Utsname
	assert.NilError(t, unix.Uname(&u))
	release := unix.ByteSliceToString(u.Release[:])
	var builtin strings.Builder
	for _, m := range kernelModules {
		if _, err := os.Stat(m.present); err == nil {
			builtin.WriteString(m.path + "\n")
		}
	}
	dir := filepath.Join(b.root, "lib/modules", release)
	assert.NilError(t, os.MkdirAll(dir, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(builtin.String()), 0o644))
	for _, empty := range []string{"modules.order", "modules.builtin.modinfo"} { // no loadable module, no modinfo
		assert.NilError(t, os.WriteFile(filepath.Join(dir, empty), nil, 0o644))
	}
	if out, err := exec.Command("chroot", b.root, "depmod", release).CombinedOutput(); err != nil {
		t.Fatalf("depmod %s in the box root: %v\n%s", release, err, out)
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
		assert.NilError(t, os.MkdirAll(g, 0o755))
		groups = append(groups, g)
	}
	cmd := exec.Command("sh", append([]string{"-c", `for g in $BOX_CGROUPS; do echo $$ >"$g/cgroup.procs"; done; exec "$0" "$@"`,
		"systemd-nspawn"}, args...)...)
	cmd.Env = append(os.Environ(), "BOX_CGROUPS="+strings.Join(groups, " "))
	bb := &boxBoot{cmd: cmd, done: make(chan struct{}), console: &nodetest.SyncBuffer{}, start: time.Now()}
	cmd.Stdout, cmd.Stderr = bb.console, bb.console
	// Should the test die, nspawn shuts the box down on SIGTERM (a SIGKILL would leave it running, orphaned).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	assert.NilError(t, cmd.Start(), "systemd-nspawn")
	go func() {
		_ = cmd.Wait()
		b.boots = append(b.boots, time.Since(bb.start))
		close(bb.done)
		// After done: a volume attached from here on would find the boot over.
		bb.detachVolumes()
	}()
	b.cur = bb
	t.Cleanup(func() {
		if !b.running() {
			return
		}
		if t.Failed() || os.Getenv("DYNK8S_E2E_SHOW") != "" {
			b.diagnose(t)
		}
		// A box that still runs its node (a burst that stops at the scale-up) stops its pods' containers first; on
		// a loaded machine that takes a while, so the wait is a hang's bound, not a speed target.
		start := time.Now()
		if err := b.poweroff(2 * time.Minute); err == nil {
			t.Logf("box %s: powered off at the test's end in %.1f s", b.name, time.Since(start).Seconds())
		} else {
			t.Errorf("box %s: %v after %.1f s; killing it", b.name, err, time.Since(start).Seconds())
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := b.exec(ctx, "systemctl", "poweroff"); err != nil && b.running() {
		return fmt.Errorf("systemctl poweroff: %w: %s", err, out)
	}
	return b.waitStopped(timeout)
}

// diagnose logs what a failed boot left: while the box runs, its failed units, jobs and cloud-init's status; in any
// case its journal (every boot) and what dnf installed (its rpm log).
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
	t.Logf("box %s: journalctl -D, the dynk8s units and cloud-init's stages, every boot:\n%s", b.name,
		journal("-u", "dynk8s-*", "-u", "cloud-init-local.service", "-u", "cloud-init.service", "-u",
			"cloud-config.service", "-u", "cloud-final.service"))
	t.Logf("box %s: journalctl -D, the last lines:\n%s", b.name, tail(journal(), 150))
	rpmLog, _ := os.ReadFile(filepath.Join(b.root, "var/log/dnf.rpm.log"))
	t.Logf("box %s: /var/log/dnf.rpm.log:\n%s", b.name, tail(string(rpmLog), 40))
	if b.cur != nil {
		t.Logf("box %s: systemd-nspawn output:\n%s", b.name, tail(b.cur.console.String(), 60))
	}
}

// file reads a file of the box's disk (what persists across its boots), from the host.
func (b *box) file(t *testing.T, path string) string {
	t.Helper()
	c, err := os.ReadFile(filepath.Join(b.root, path))
	assert.NilError(t, err)
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

// A token of its own, so that the box tests and the other join tests never share or delete each other's.
const (
	boxTokenID     = "e2ebx1"
	boxTokenSecret = "0123456789abcdef"
)

// boxNode is a pool instance in a box, with what the test needs around it: the fake IMDS it reads, the cluster
// it joins.
type boxNode struct {
	*box
	*boxJoin
	boxInstance
	imds *fakeaws.IMDS
}

// boxJoin is what every instance of a pool needs to join: the control plane as kubeadm init leaves it, moto as SSM
// holding the join token, and the pool's user data rendered as the stack does (the API server endpoint is the
// test's control plane); autoscaling is the Auto Scaling endpoint the join unit calls.
type boxJoin struct {
	c           cluster
	cfg         *config.Config
	pool        config.NodePool
	userData    []byte
	moto        *motoSSM
	param       string
	autoscaling string
	// vpc, when set, is the VPC the instances are in, through whose gateway they reach the API server; nil: they
	// reach it directly, through a forwarder in their box (see vpcWithGateway).
	vpc *vpcWithGateway
}

// boxInstance is what EC2 tells an instance about itself (IMDS) and the provider ID its Node gets.
type boxInstance struct {
	id, zone, ip string
	// state is the Auto Scaling target lifecycle state; "" for none.
	state string
	// image is the baked image it boots from (boxSpec.image); "": the stock image.
	image string
}

func (i boxInstance) providerID() string { return "aws:///" + i.zone + "/" + i.id }

// hostname is the instance's host name as the stack's subnets have EC2 name it (PrivateDnsHostnameTypeOnLaunch
// resource-name, infra/network.go): its id, which is also its Node's name. The box once used the IP-based name, and
// then kubeadm's Hostname preflight check looked the Node's name up in vain: systemd-resolved, with no unicast
// server here, tried LLMNR for the single-label name for 7.7 s of every join, where on EC2 resolved answers its own
// host name at once.
func (i boxInstance) hostname() string { return i.id }

// newBoxNode makes the box of one instance (the fake one of the join tests) of the pool, with the fake IMDS in
// target lifecycle state state, moto for SSM (holding the join token) and the Auto Scaling endpoint autoscaling
// ("" for moto's).
func newBoxNode(ctx context.Context, t *testing.T, c cluster, cfg *config.Config, pool config.NodePool, name,
	state, autoscaling string) *boxNode {
	t.Helper()
	j := newBoxJoin(ctx, t, c, cfg, pool, autoscaling)
	return j.newNode(t, name, boxInstance{id: fakeInstanceID, zone: cfg.Region + fakeZoneSuffix, ip: fakeNodeIP,
		state: state})
}

func newBoxJoin(ctx context.Context, t *testing.T, c cluster, cfg *config.Config, pool config.NodePool,
	autoscaling string) *boxJoin {
	t.Helper()
	j := prepareBoxJoin(ctx, t, c, cfg, pool, autoscaling)
	j.userData = renderNodeUserData(ctx, t, c, cfg, pool, j.param)
	return j
}

// prepareBoxJoin is newBoxJoin without the user data: the control plane ready for joins, moto holding the token.
func prepareBoxJoin(ctx context.Context, t *testing.T, c cluster, cfg *config.Config, pool config.NodePool,
	autoscaling string) *boxJoin {
	t.Helper()
	moto := startMoto(ctx, t, requireTool(t, "moto_server"))
	token := boxTokenID + "." + boxTokenSecret
	kubeadmInit(ctx, t, c, token)
	kubeadmUploadConfig(ctx, t, c)
	param := infra.JoinTokenParameter(cfg.ClusterName)
	moto.putSecureString(t, cfg.Region, param, token)
	if autoscaling == "" {
		autoscaling = moto.url
	}
	return &boxJoin{c: c, cfg: cfg, pool: pool, moto: moto, param: param, autoscaling: autoscaling}
}

// newNode makes the box of instance inst, named name (see boxSpec), with a fake IMDS of its own.
func (j *boxJoin) newNode(t *testing.T, name string, inst boxInstance) *boxNode {
	t.Helper()
	role := fakeRoleInstance(inst.id, inst.zone, j.cfg.Region, inst.ip, inst.state)
	forwards := []string{strings.TrimPrefix(j.c.Server, "https://"), strings.TrimPrefix(j.moto.url, "http://")}
	var ec2 string
	var router *vpcRouter
	if j.vpc == nil {
		// EC2 is the join's kubelet key mark alone (CreateTags on its own instance, with the role's credentials):
		// a fake that knows the instance, which moto for SSM does not.
		fake := fakeaws.NewEC2(t, fakeaws.SigV4{Region: j.cfg.Region, Credentials: aws.Credentials{
			AccessKeyID: role.AccessKeyID, SecretAccessKey: role.SecretAccessKey, SessionToken: role.SessionToken}},
			fakeaws.EC2Instance{ID: inst.id, State: "running"})
		ec2 = fake.URL
		forwards = append(forwards, strings.TrimPrefix(ec2, "http://"))
	} else {
		// The API server only through the tunnel; EC2 (the gateway's wake-up, the key mark) is the VPC's.
		forwards = forwards[1:]
		ec2, router = j.vpc.aws.url, j.vpc.router
		forwards = append(forwards, strings.TrimPrefix(ec2, "http://"))
		role.AccessKeyID, role.SecretAccessKey, role.SessionToken = j.vpc.nodeRole.Key, j.vpc.nodeRole.Secret,
			j.vpc.nodeRole.Token
	}
	if a := strings.TrimPrefix(j.autoscaling, "http://"); !slices.Contains(forwards, a) {
		forwards = append(forwards, a)
	}
	imds := fakeaws.NewIMDS(t, role)
	b := newBox(t, boxSpec{
		name: name, instanceID: inst.id, hostname: inst.hostname(),
		nodeIP: inst.ip, userData: launchTemplateUserData(t, j.userData), imds: strings.TrimPrefix(imds.URL, "http://"),
		forwards: forwards, router: router, image: inst.image,
		endpoints: map[string]string{
			"DYNK8S_SSM_ENDPOINT": j.moto.url, "DYNK8S_AUTOSCALING_ENDPOINT": j.autoscaling,
			"DYNK8S_EC2_ENDPOINT": ec2, "DYNK8S_S3_ENDPOINT": j.moto.url,
		},
	})
	// User data without the bootstrap (no bucket here: TestBoxNodeInstallsTheAgent has one) gets the agent where the
	// bootstrap would install it.
	if !hasBootstrap(t, j.userData) {
		b.binds = append(b.binds, "--bind-ro="+nodetest.BuiltAgent(t)+":"+nodetest.AgentPath)
	}
	t.Cleanup(func() {
		if name, err := findNode(context.Background(), j.c, inst.providerID()); err == nil && name != "" {
			_, _ = j.c.kubectl(context.Background(), "delete", "node", name, "--wait=false")
		}
	})
	return &boxNode{box: b, boxJoin: j, boxInstance: inst, imds: imds}
}

// findNode is the name of the Node with providerID, "" if there is none.
func findNode(ctx context.Context, c cluster, providerID string) (string, error) {
	var list struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
			Spec     struct {
				ProviderID string `json:"providerID"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := c.getJSON(ctx, &list, "nodes"); err != nil {
		return "", err
	}
	for _, n := range list.Items {
		if n.Spec.ProviderID == providerID {
			return n.Metadata.Name, nil
		}
	}
	return "", nil
}

// waitReady waits for the instance's Node to be Ready and returns it.
func (n *boxNode) waitReady(ctx context.Context, t *testing.T, timeout time.Duration) kubeNode {
	t.Helper()
	var kn kubeNode
	err := n.wait(ctx, timeout, "Node Ready", func(ctx context.Context) bool {
		if n.unitFailed(ctx, "dynk8s-join.service") {
			t.Fatal("dynk8s-join.service failed")
		}
		name, err := findNode(ctx, n.c, n.providerID())
		if err != nil || name == "" {
			return false
		}
		kn = kubeNode{}
		return n.c.getJSON(ctx, &kn, "node", name) == nil && kn.ready()
	})
	assert.NilError(t, err)
	return kn
}

// unitFailed: the unit is in the failed state in the running box.
func (n *boxNode) unitFailed(ctx context.Context, unit string) bool {
	_, err := n.exec(ctx, "systemctl", "is-failed", "--quiet", unit)
	return err == nil
}

// checkCloudInit: cloud-init ran every stage of this boot with no error (its result and status files, which
// `cloud-init status --long` reads).
func (n *boxNode) checkCloudInit(t *testing.T) {
	t.Helper()
	var result struct {
		V1 struct {
			Errors []string `json:"errors"`
		} `json:"v1"`
	}
	assert.NilError(t, json.Unmarshal([]byte(n.file(t, "/var/lib/cloud/data/result.json")), &result), "cloud-init result.json")
	if len(result.V1.Errors) > 0 {
		t.Errorf("cloud-init errors: %v", result.V1.Errors)
	}
	var status struct {
		V1 map[string]json.RawMessage `json:"v1"`
	}
	assert.NilError(t, json.Unmarshal([]byte(n.file(t, "/var/lib/cloud/data/status.json")), &status), "cloud-init status.json")
	for _, stage := range []string{"init-local", "init", "modules-config", "modules-final"} {
		var s struct {
			Errors   []string `json:"errors"`
			Finished *float64 `json:"finished"`
		}
		if err := json.Unmarshal(status.V1[stage], &s); err != nil {
			t.Errorf("cloud-init status.json %s: %v", stage, err)
			continue
		}
		if len(s.Errors) > 0 || s.Finished == nil {
			t.Errorf("cloud-init stage %s: finished %v, errors %v", stage, s.Finished != nil, s.Errors)
		}
	}
}

// checkSettled: systemd has no failed unit and no job left (is-system-running says "running", not "degraded" or
// "starting").
func (n *boxNode) checkSettled(ctx context.Context, t *testing.T) {
	t.Helper()
	assert.NilError(t, n.waitBooted(ctx, 2*time.Minute))
	out, _ := n.exec(ctx, "systemctl", "is-system-running")
	if s := strings.TrimSpace(out); s != "running" {
		failed, _ := n.exec(ctx, "systemctl", "--failed", "--no-pager")
		t.Errorf("systemctl is-system-running: %s\n%s", s, failed)
	}
	if jobs, _ := n.exec(ctx, "systemctl", "list-jobs", "--no-legend"); strings.TrimSpace(jobs) != "" {
		t.Errorf("jobs still waiting: %s", jobs)
	}
}

// checkMetadataLocked: the lockdown is loaded, and it works: root reaches the metadata service, another user
// does not.
func (n *boxNode) checkMetadataLocked(ctx context.Context, t *testing.T) {
	t.Helper()
	if out, err := n.exec(ctx, "nft", "list", "table", "inet", "dynk8s_imds_lock"); err != nil {
		t.Errorf("the metadata lockdown is not loaded: %v: %s", err, out)
		return
	}
	token := []string{"curl", "-sS", "-m", "5", "-X", "PUT", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60",
		"-o", "/dev/null", "-w", "%{http_code}", "http://169.254.169.254/latest/api/token"}
	if out, err := n.exec(ctx, token...); err != nil || out != "200" {
		t.Errorf("root does not reach the metadata service: %v: %s", err, out)
	}
	nobody := append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}, token...)
	if out, err := n.exec(ctx, nobody...); err == nil {
		t.Errorf("a non-root user reaches the metadata service: %s", out)
	}
}

// unitProp is one property of a unit in the running box (systemctl show -P).
func (n *boxNode) unitProp(ctx context.Context, t *testing.T, unit, prop string) string {
	t.Helper()
	out, err := n.exec(ctx, "systemctl", "show", "-P", prop, unit)
	if err != nil {
		t.Fatalf("systemctl show %s %s: %v: %s", prop, unit, err, out)
	}
	return strings.TrimSpace(out)
}

// checkLockBeforeKubelet: the lockdown was loaded before the kubelet of this boot started (on every path: the
// kubelet's drop-in requires it, and the agent's join starts it before kubeadm join).
func (n *boxNode) checkLockBeforeKubelet(ctx context.Context, t *testing.T) {
	t.Helper()
	lock, err1 := strconv.ParseInt(n.unitProp(ctx, t, "dynk8s-imds-lock.service", "ActiveEnterTimestampMonotonic"), 10, 64)
	kubelet, err2 := strconv.ParseInt(n.unitProp(ctx, t, "kubelet.service", "ExecMainStartTimestampMonotonic"), 10, 64)
	if err1 != nil || err2 != nil || lock == 0 || kubelet == 0 || lock > kubelet {
		t.Errorf("lock active at %d µs, kubelet started at %d µs (%v %v): the kubelet ran before the lockdown", lock,
			kubelet, err1, err2)
	}
}

// writeFile writes a file of the box's disk from the host.
func (b *box) writeFile(t *testing.T, path string, content []byte, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(b.root, path)
	assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	assert.NilError(t, os.WriteFile(p, content, mode))
}

// The gateway in a box: the dev stack's gateway instance, booted from the user data its declared instance carries
// (userDataBase64, decoded as EC2 does), under real systemd and cloud-init. cloud-init writes the files and runs
// runcmd; dynk8s-agent.service (the bootstrap) finds the agent its agent.env pins installed,
// dynk8s-gateway-packages.service (the agent's gateway-packages) finds the packages and starts wg-quick@wg0, whose
// ExecStartPre, the agent's gateway-key, reads the key from moto's SSM through the fake IMDS's region; wg-quick
// brings wg0 up with wireguard-go, and its PostUp loads the rendered nftables table. The on-prem side is a network namespace of the test's with the
// rendered on-prem config, on a fake internet link to the box (dial-in: on-prem dials the Elastic IP its config
// names).
//
// What only the box has (none of it is in the user data): the agent this machine built, bound where the bootstrap
// installs it (the plan pinned its hash: renderTunnel; the bootstrap's download is TestBoxNodeInstallsTheAgent's);
// the box root's real dnf 4 and rpm, as every box has them (installImage; the image package provides nftables, and
// the fedora repository's wireguard-tools holds Debian's wg and wg-quick); wireguard-go (bound read-only at
// /usr/local/bin, on the unit's PATH)
// and /dev/net/tun (this kernel has no WireGuard module); and drop-ins that give wg-quick@wg0 its userspace
// implementation (WG_QUICK_USERSPACE_IMPLEMENTATION, wg-quick(8)) and the agent's SSM and EC2 endpoints, the idle
// check its EC2 endpoint (on EC2 both resolve the service names; here they are moto's loopback port).

// The gateway box's instance ID.
const boxGatewayInstanceID = "i-0fedcba9876543210"

// boxGateway is the gateway instance in its box, with the on-prem side around it.
type boxGateway struct {
	*box
	tn   *tunnel
	moto *motoSSM
}

// gatewayInstance is what a gateway box may be told of the EC2 around it; the zero value is a gateway of its own
// (a made-up instance id and role key, the box's own moto for EC2, a VPC router where nothing leaves).
type gatewayInstance struct {
	// id is the instance's id; "" for boxGatewayInstanceID.
	id string
	// ec2 is the EC2 endpoint the gateway calls (its idle check); "" for the box's own moto.
	ec2 string
	// role is what the fake IMDS hands out as the instance role's credentials; nil for made-up ones.
	role *awsKey
	// router is the VPC's router (see boxSpec.router).
	router *vpcRouter
	// installed: the gateway has booted before (`pulumi up` creates it running, its idle check stopped it), so its
	// packages are installed; false: this is its first boot, which installs them.
	installed bool
}

// newBoxGateway makes the gateway's box (named name) from the rendered plan p and the on-prem namespace, and puts the
// gateway's key into moto's SSM unless withKey is false.
func newBoxGateway(ctx context.Context, t *testing.T, p tunnelPlan, name string, withKey bool, inst gatewayInstance) *boxGateway {
	t.Helper()
	if inst.id == "" {
		inst.id = boxGatewayInstanceID
	}
	for _, tool := range []string{"ip", "nft", "wg", "wg-quick", "ping", "unshare", "nsenter"} {
		requireTool(t, tool)
	}
	wgGo := requireTool(t, "wireguard-go")
	userData := gatewayInstanceUserData(t, p)

	moto := startMoto(ctx, t, requireTool(t, "moto_server"))
	if withKey {
		moto.putSecureString(t, p.region, p.keyParameter, p.keyValue)
	}
	role := awsKey{Key: "ASIAE2EFAKEGATEWAY01", Secret: "e2e/fake/gateway/secret/key/000000000",
		Token: "e2e-fake-gateway-session"}
	if inst.role != nil {
		role = *inst.role
	}
	imds := fakeaws.NewIMDS(t, fakeaws.IMDSInstance{
		ID: inst.id, Zone: p.region + "a", Region: p.region, PrivateIP: p.gatewayIP.String(),
		Type: "t4g.micro", Role: "dynk8s-homelab-gateway", AccessKeyID: role.Key,
		SecretAccessKey: role.Secret, SessionToken: role.Token,
	})
	forwards := []string{strings.TrimPrefix(moto.url, "http://")}
	if inst.ec2 == "" {
		inst.ec2 = moto.url
	} else {
		forwards = append(forwards, strings.TrimPrefix(inst.ec2, "http://"))
	}
	var preinstalled []string
	if inst.installed {
		preinstalled = []string{boxRepos + "/fedora/wireguard-tools-*.rpm"}
	}
	b := newBox(t, boxSpec{
		name: name, instanceID: inst.id,
		hostname: "ip-" + strings.ReplaceAll(p.gatewayIP.String(), ".", "-"), nodeIP: p.gatewayIP.String(),
		userData: userData, imds: strings.TrimPrefix(imds.URL, "http://"), forwards: forwards, router: inst.router,
		installed: preinstalled,
	})
	endpoints := "[Service]\nEnvironment=DYNK8S_SSM_ENDPOINT=" + moto.url + "\nEnvironment=DYNK8S_EC2_ENDPOINT=" +
		inst.ec2 + "\n"
	for _, f := range []struct {
		path, content string
		mode          os.FileMode
	}{
		{"/etc/systemd/system/wg-quick@wg0.service.d/90-box.conf",
			endpoints + "Environment=WG_QUICK_USERSPACE_IMPLEMENTATION=wireguard-go\n", 0o644},
		{"/etc/systemd/system/dynk8s-gateway-idle.service.d/90-box.conf", endpoints, 0o644},
	} {
		path := filepath.Join(b.root, f.path)
		assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		assert.NilError(t, os.WriteFile(path, []byte(f.content), f.mode))
	}
	b.binds = append(b.binds, "--bind-ro="+wgGo+":/usr/local/bin/wireguard-go", "--bind=/dev/net/tun",
		"--bind-ro="+nodetest.BuiltAgent(t)+":"+nodetest.AgentPath)

	tn := &tunnel{plan: p, gw: netns(name), gwIface: "wg0", wireguardGo: wgGo}
	tn.lanIP = nthAddr(p.onPremCIDRs[0].Masked().Addr(), 10)
	tn.outsideIP = outsideAddr(t, p.onPremCIDRs, p.vpcCIDR)
	gwPublic, _, err := splitHostPort(wgValue(p.onPremConf, "Peer", "Endpoint"))
	assert.NilError(t, err, "on-prem config's peer Endpoint")
	tn.onprem = netns("dynk8s-onprem-" + name + "-" + strconv.Itoa(os.Getpid()))
	run(t, "ip", "netns", "add", string(tn.onprem))
	t.Cleanup(func() { removeNamespace(t, tn.onprem) })
	tn.wireOnPrem(ctx, t, gwPublic)
	return &boxGateway{box: b, tn: tn, moto: moto}
}

// boxRepos is where a box finds the signed local repositories (testdata/packages/build-repos.sh).
const boxRepos = "/srv/repos"

// boxPackageRepos are the signed local repositories the boxes install from, built once per test process with the box
// root's own tools (testdata/packages/build-repos.sh): pkgs.k8s.io's and CRI-O's packages at the e2e stack's
// versions, whose kubelet and kubeadm run the box's real binaries; Fedora's, whose wireguard-tools holds Debian's wg,
// wg-quick and wg-quick@.service.
func boxPackageRepos(t *testing.T) string {
	t.Helper()
	nspawn, root := requireNspawn(t), boxRoot(t)
	v := devConfig(t).Kubernetes.Version
	packageReposOnce.Do(func() {
		packageReposDir, packageReposErr = os.MkdirTemp("", "dynk8s-e2e-repos-")
		if packageReposErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var out bytes.Buffer
		cmd := nspawnCommand(ctx, nspawn, root, buildReposArgs(t, packageReposDir, v.String(),
			fmt.Sprintf("%d.%d", v.Major, v.Minor))...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			packageReposErr = fmt.Errorf("build-repos.sh in the box root: %w\n%s", err, out.String())
		}
	})
	assert.NilError(t, packageReposErr)
	return packageReposDir
}

// The boxes' repositories, built once per test process and removed when it ends (TestMain).
var (
	packageReposOnce sync.Once
	packageReposDir  string
	packageReposErr  error
)

// removePackageRepos removes the boxes' repositories, if they were built.
func removePackageRepos() {
	if packageReposDir != "" {
		_ = os.RemoveAll(packageReposDir)
	}
}

// installImage gives the box what a Fedora Cloud image has and the box root lacks, for the real dnf and rpm: rpm's
// database where Fedora keeps it, holding the image package (what the image's packages provide that others
// require: nftables among them; testdata/packages/build-repos.sh) and the packages of installed (globs of rpm
// files under boxRepos) that an earlier life of the instance installed; and the fedora and updates repositories
// (the local ones of repos, signed, gpgcheck on). rpm runs in the box's root before its first boot, as the image
// was made before the instance.
func (b *box) installImage(t *testing.T, repos string, installed ...string) {
	t.Helper()
	repo := func(id string) string {
		return fmt.Sprintf("[%[1]s]\nname=Fedora 43 %[1]s (dynk8s e2e)\nbaseurl=file://%[2]s/%[1]s/\nenabled=1\ngpgcheck=1\n"+
			"gpgkey=file://%[2]s/key.asc\nskip_if_unavailable=False\n", id, boxRepos)
	}
	for path, content := range map[string]string{
		"/etc/rpm/macros.dynk8s-box":    "%_dbpath /usr/lib/sysimage/rpm\n",
		"/etc/yum.repos.d/fedora.repo":  repo("fedora"),
		"/etc/yum.repos.d/updates.repo": repo("updates"),
	} {
		p := filepath.Join(b.root, path)
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := nspawnIn(ctx, requireNspawn(t), b.root, "--bind-ro="+repos+":"+boxRepos,
		"/bin/sh", "-c", "rpm -i --quiet "+strings.Join(append([]string{boxRepos + "/image/*.rpm"}, installed...), " ")).
		CombinedOutput()
	assert.NilError(t, err, "rpm -i in the box's root: %s", out)
}

// The user data's upstream repositories (cloudinit's, pkgs.k8s.io's and CRI-O's: the e2e has no way out) and the
// local ones a box installs from instead (build-repos.sh's, under boxRepos).
var upstreamRepos = []struct {
	url   *regexp.Regexp
	local string
}{
	{regexp.MustCompile(`https://pkgs\.k8s\.io/core:/stable:/v1\.\d+/rpm/`), "file://" + boxRepos + "/kubernetes/"},
	{regexp.MustCompile(`https://download\.opensuse\.org/repositories/isv:/cri-o:/stable:/v\d+\.\d+/rpm/`),
		"file://" + boxRepos + "/cri-o/"},
}

// localRepositories is the user data with its upstream repositories' URLs (base URLs and keys) pointed at the box's
// local ones, and nothing else changed: cloud-init's yum_add_repo still writes the repository files, with the
// rendered ids, priorities and checks. A gzip user data (as EC2 hands over a launch template's) stays gzip; one
// without the repositories (the gateway's) is returned as it is.
func localRepositories(t *testing.T, userData []byte) []byte {
	t.Helper()
	plain, gzipped := userData, false
	if zr, err := gzip.NewReader(bytes.NewReader(userData)); err == nil {
		plain, err = io.ReadAll(zr)
		assert.NilError(t, err, "the user data's gzip")
		gzipped = true
	}
	local := plain
	for _, r := range upstreamRepos {
		local = r.url.ReplaceAll(local, []byte(r.local))
	}
	if bytes.Equal(local, plain) {
		return userData
	}
	if !gzipped {
		return local
	}
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	_, err := zw.Write(local)
	assert.NilError(t, err)
	assert.NilError(t, zw.Close())
	return out.Bytes()
}

// boxLocale is a cloud.cfg drop-in that keeps Debian's cloud-init from generating a locale at the first boot: its
// locale module runs locale-gen for the default en_US.UTF-8, which the box root lacks (2.2 s of the config stage
// here, on every new box), where Fedora's only writes /etc/locale.conf (cloud-init's rhel distro, apply_locale) for
// the image's langpack. C.UTF-8 needs no generation (cloud-init's debian distro, regenerate_locale).
const boxLocale = "locale: C.UTF-8\n"

// yumAddRepoStage is a cloud.cfg drop-in that runs yum_add_repo where Fedora's cloud.cfg has it, in the config
// stage before runcmd: Debian's cloud-init ships the module but leaves it out of its stages, and marks it for
// other distributions (so it must be listed as unverified to run). The list is the root's own with the module added.
func yumAddRepoStage(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/cloud/cloud.cfg"))
	assert.NilError(t, err)
	var cfg struct {
		Modules []any `json:"cloud_config_modules"`
	}
	assert.NilError(t, yaml.Unmarshal(b, &cfg), "the root's cloud.cfg")
	var modules []any
	for _, m := range cfg.Modules {
		if m == "runcmd" {
			modules = append(modules, "yum_add_repo")
		}
		modules = append(modules, m)
	}
	assert.Assert(t, len(modules) == len(cfg.Modules)+1, "the root's cloud.cfg has no runcmd in its config stage: %v",
		cfg.Modules)
	out, err := yaml.Marshal(map[string]any{"cloud_config_modules": modules, "unverified_modules": []string{"yum_add_repo"}})
	assert.NilError(t, err)
	return "# dynk8s e2e box: cloud-init's yum_add_repo in the config stage, as Fedora's cloud.cfg has it\n" + string(out)
}

// gatewayInstanceUserData is the gateway instance's user data as EC2 hands it over (its userDataBase64 decoded),
// checked to be the rendered cloud-config (userdata/gateway.yaml) byte for byte once decompressed.
func gatewayInstanceUserData(t *testing.T, p tunnelPlan) []byte {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(p.gatewayUserDataBase64)
	if err != nil || len(raw) == 0 {
		t.Fatalf("the gateway instance's userDataBase64 (%d characters): %v", len(p.gatewayUserDataBase64), err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	assert.NilError(t, err, "the gateway instance's user data is not gzip")
	plain, err := io.ReadAll(zr)
	assert.NilError(t, err)
	if !bytes.Equal(plain, p.gatewayUserData) {
		t.Fatal("the gateway instance's user data is not the rendered userdata/gateway.yaml")
	}
	return raw
}

// wireOnPrem links the on-prem namespace to the box: the fake internet (the on-prem peer's public address and the
// gateway's Elastic IP, point to point, as in the tunnel tests) and the on-prem LAN, with the probe that counts what
// arrives from the tunnel.
func (tn *tunnel) wireOnPrem(ctx context.Context, t *testing.T, gwPublic string) {
	t.Helper()
	run(t, "ip", "link", "add", "inet0", "netns", string(tn.onprem), "type", "veth", "peer", "name", "inet0", "netns",
		string(tn.gw))
	bits := strconv.Itoa(tn.plan.onPremCIDRs[0].Bits())
	for _, c := range []struct {
		n    netns
		args []string
	}{
		{tn.onprem, []string{"ip", "link", "set", "lo", "up"}},
		{tn.onprem, []string{"ip", "addr", "add", onPremInternetIP + "/32", "peer", gwPublic + "/32", "dev", "inet0"}},
		{tn.gw, []string{"ip", "addr", "add", gwPublic + "/32", "peer", onPremInternetIP + "/32", "dev", "inet0"}},
		{tn.onprem, []string{"ip", "link", "set", "inet0", "up"}},
		{tn.gw, []string{"ip", "link", "set", "inet0", "up"}},
		{tn.onprem, []string{"ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan1"}},
		{tn.onprem, []string{"ip", "addr", "add", tn.lanIP.String() + "/" + bits, "dev", "lan0"}},
		{tn.onprem, []string{"ip", "link", "set", "lan1", "up"}},
		{tn.onprem, []string{"ip", "link", "set", "lan0", "up"}},
	} {
		c.n.must(ctx, t, c.args...)
	}
	tn.onprem.nft(ctx, t, `table inet dynk8s_probe {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "`+onPremIface+`" ip daddr `+tn.lanIP.String()+` icmp type echo-request counter comment "echo-lan"
	}
}
`)
}

// waitTunnel waits for wg-quick@wg0 to be active in the box (the key read, wg0 up with wireguard-go, the table
// loaded); on a timeout the test fails with the unit's journal (and, at cleanup, the box's).
func (g *boxGateway) waitTunnel(ctx context.Context, t *testing.T, timeout time.Duration) {
	t.Helper()
	err := g.wait(ctx, timeout, "wg-quick@wg0 active", func(ctx context.Context) bool {
		out, _ := g.exec(ctx, "systemctl", "is-active", "wg-quick@wg0.service")
		return strings.TrimSpace(out) == "active"
	})
	if err != nil {
		out, _ := g.exec(ctx, "journalctl", "--no-pager", "-u", "wg-quick@wg0.service", "-u", "dynk8s-gateway-packages.service",
			"-u", "dynk8s-agent.service")
		t.Fatalf("%v; journal of wg-quick@wg0, the packages unit and the bootstrap:\n%s", err, out)
	}
}

// journal is the box's journal (all its boots) read from its disk, with journalctl's arguments args.
func (g *boxGateway) journal(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "journalctl", append([]string{"-D", filepath.Join(g.root, "var/log/journal"),
		"--no-pager", "-o", "short-monotonic"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("journalctl -D: %v: %s", err, out)
	}
	return string(out)
}

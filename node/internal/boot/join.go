// Package boot is the node's boot (dynk8s-node join): prepare (kernel modules, packages, CRI-O, the image
// pre-pull), then join (the join token, the API server through the tunnel, kubeadm join), as the instance's Auto
// Scaling target lifecycle state picks; and the wake-up of the stack's gateway beside it, and an image build's
// prepare.
package boot

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/cache"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
	"github.com/dynk8s/dynk8s/node/internal/image"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// The node's boot, in two phases: prepare (kernel modules, packages, CRI-O, image pre-pull: nothing that needs the
// cluster) and join (join token, API server probe, kubeadm join). dynk8s-join.service runs it at every boot until
// the node has joined; the Auto Scaling target lifecycle state in IMDS picks the phases:
//   - Warmed:*: the instance is entering a warm pool: prepare, complete the launch lifecycle action, and let the
//     group stop it (EC2 Auto Scaling user guide, "Use lifecycle hooks with a warm pool");
//   - InService: prepare unless an earlier boot did, then join, then complete the launch lifecycle action, which
//     holds the instance in Pending:Wait again when it leaves the warm pool (same guide).
//
// kops' nodeup does the same (upup/pkg/fi/nodeup/command.go, getAWSConfigurationMode, kubernetes/kops). Every
// network step retries under one deadline (nodeconfig.Deadlines.Join). On failure it logs one reason and exits 1,
// and leaves the instance to the autoscaler (see failed).

const (
	joinTimerName = "dynk8s-join.timer"
	imdsLockUnit  = "dynk8s-imds-lock.service"
)

// The runtime values go into the JoinConfiguration and requests, so each must have its strict form.
var identityForms = []struct {
	name string
	ok   func(string) bool
	get  func(j *joiner) string
}{
	{"INSTANCE_ID", names.IsInstanceID, func(j *joiner) string { return j.id.InstanceID }},
	{"ZONE", regexp.MustCompile(`^[a-z]{2}(-[a-z0-9]+)+$`).MatchString, func(j *joiner) string { return j.id.Zone }},
	{"REGION", names.IsRegion, func(j *joiner) string { return j.id.Region }},
	{"DOMAIN", regexp.MustCompile(`^[a-z0-9-]+(\.[a-z0-9-]+)+$`).MatchString, func(j *joiner) string { return j.domain }},
	{"NODE_IP", isIPv4, func(j *joiner) string { return j.localIPv4 }},
	{"INSTANCE_TYPE", regexp.MustCompile(`^[a-z0-9-]+\.[a-z0-9-]+$`).MatchString,
		func(j *joiner) string { return j.id.InstanceType }},
	{"LIFECYCLE", regexp.MustCompile(`^(InService|Standby|Detached|Terminated|Warmed:(Stopped|Running|Hibernated|Terminated))$`).MatchString,
		func(j *joiner) string { return j.lifecycle }},
}

// isIPv4 says whether s is an IPv4 address in dotted-decimal form.
func isIPv4(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is4()
}

// bootEnv is what every part of one run of the boot shares: the node's configuration, AWS, the host, the files, the
// log, the deadline and the timeline.
type bootEnv struct {
	cfg   nodeconfig.Node
	cloud *cloud.Cloud
	host  system.Host
	files system.Files
	log   *system.Logger
	clock *system.Clock
	tl    *system.Timeline
	// dryRun reads (IMDS, SSM, Auto Scaling's descriptions) but changes nothing: no command, no file, no
	// lifecycle action, no gateway start; verbose then prints the JoinConfiguration it would use, token hidden.
	dryRun, verbose bool
	// skip are the phases the operator skips (--skip).
	skip map[string]bool
}

// instance is what the boot learns of its instance from IMDS, and asks and tells its group (Auto Scaling).
type instance struct {
	*bootEnv
	id                nodeconfig.Identity
	domain, lifecycle string
	localIPv4         string // IMDS local-ipv4, as read
	group             string
}

// preparer is the prepare phases' state: what the image lacks, the pre-pull, a baked image's marker.
type preparer struct {
	*bootEnv
	missing     []string           // system packages the image lacks
	withUpdates bool               // the next package transaction adds Fedora's repositories and their updates
	prepull     chan time.Duration // the pre-pull's time, when it has ended (nil: none runs)
	stopPrepull context.CancelFunc
	pulled      []string // the images the pre-pull pulled, once it has ended
	// lockDone delivers the pins' lock's end once it has run in the background (startLock), lockTook its time, and
	// stopLock ends it early; nil when none runs, or it has been waited for.
	lockDone chan error
	lockTook time.Duration
	stopLock context.CancelFunc
	// baked is the marker of a baked image (nil: a stock image, baked.go); baking: this run bakes an image
	// (bake.go), and installs even where a marker is.
	baked  *image.Marker
	baking bool
}

// joining is the join phases' state: the token and kubeadm join's attempts, for the instance inst.
type joining struct {
	*bootEnv
	inst         *instance
	token        string
	joinAttempts int
	// keyPEM is the kubelet's bootstrap key once the kubelet-key phase has written it (kubeletkey.go): a failed
	// join's kubeadm reset removes the file, and the next attempt writes it again.
	keyPEM []byte
	// cacheDone delivers the cache phase's time once it has run in the background (startCache); nil when it runs
	// not, or has been waited for.
	cacheDone chan time.Duration
	// probeDone delivers the API server probe's end once it has run in the background (startProbe), and stopProbe
	// ends it early; nil when it runs not, or has been waited for.
	probeDone chan error
	stopProbe context.CancelFunc
}

// joiner is one run of the join: the boot that picks the phases by the instance's lifecycle state, and how it ends.
type joiner struct {
	*bootEnv
	instance
	preparer
	joining
	out        system.Outcome
	completing bool
}

// newJoiner is one run of the join with r.
func newJoiner(r *bootEnv) *joiner {
	j := &joiner{bootEnv: r, instance: instance{bootEnv: r}, preparer: preparer{bootEnv: r}, joining: joining{bootEnv: r}}
	j.inst = &j.instance
	return j
}

func (r *bootEnv) markerPrepared() string { return r.files.State("prepared") }

// markerWarm: this instance has prepared and completed its lifecycle action in the warm pool since it last started.
func (r *bootEnv) markerWarm() string { return r.files.Run("warm-ready") }
func (r *bootEnv) joinConfig() string { return r.files.Run("kubeadm-join.yaml") }

// joinTimerFile is dynk8s-join.timer's unit file, which only a warm pool's user data writes.
func (r *bootEnv) joinTimerFile() string { return r.files.Etc("systemd/system/" + joinTimerName) }

// alreadyJoined: a joined node has the kubelet's kubeconfig; the join unit's Condition checks the same file.
func alreadyJoined(f system.Files) bool { return f.Exists(f.Etc("kubernetes/kubelet.conf")) }

// Pacing of a run of the join while a Running or Hibernated warm instance waits in the warm pool (waiting):
// dynk8s-join.timer starts the next run 2 s after one ends, and each run reads the lifecycle state every
// WarmPollEvery for WarmPollWindow. The join then starts within about a second of the group putting the instance in
// service (2 s at worst, between two runs), where a run that read once every 15 s left it waiting 7.5 s on average
// and measured slower than a Stopped instance's whole boot in the box; for one IMDS read a second (IMDS throttles
// per instance, the EC2 User Guide's "Query throttling"; the termination handler on every pool node polls it every
// 2 s); and the unit starts about once a minute, so the journal has its start and finish lines once a minute.
const (
	WarmPollEvery  = time.Second
	WarmPollWindow = 55 * time.Second
)

// waiting: a Running or Hibernated warm instance that has prepared waits for the group to put it in service: the
// run reads its lifecycle state from IMDS every every for up to window (0: once), quietly, and says whether the
// instance still waits. It stops waiting as soon as the state is no longer Warmed:* (or IMDS does not answer: the
// boot then says why), or ctx ends. Its clock is monotonic: it does not advance while the instance is hibernated,
// so a run that was waiting when the instance hibernated reads the state again within every of the resume.
func (j *joiner) waiting(ctx context.Context, window, every time.Duration) bool {
	if !j.files.Exists(j.markerWarm()) {
		return false
	}
	deadline := time.Now().Add(window)
	for {
		if !j.warmed(ctx) {
			return false
		}
		if !time.Now().Before(deadline) {
			return true
		}
		select {
		case <-ctx.Done():
			return true
		case <-time.After(every):
		}
	}
}

// warmed is one read of the lifecycle state: the instance is still in the warm pool.
func (j *joiner) warmed(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	state, err := j.cloud.IMDS.Get(ctx, cloud.LifecyclePath)
	return err == nil && strings.HasPrefix(state, "Warmed:")
}

// Run is the boot; it returns the error that ended it (already handled by failed) or nil.
func (j *joiner) Run(ctx context.Context) error {
	start := j.clock.Now()
	j.out.Result = "failed"
	err := j.boot(ctx)
	if err != nil {
		j.failed(ctx, err)
	}
	j.finish()
	if err != nil {
		j.paceRetry(ctx, start)
	}
	return err
}

// FailedRunLasts is the least a failed run of the boot lasts on an instance whose dynk8s-join.timer runs it again
// (a warm-pool instance): the timer starts the next run 2 s after one ends, so a failure that comes at once (a
// refused token read, an answer the boot rejects) would repeat, with its FAILED line and its AWS calls, every few
// seconds until the autoscaler retires the instance. A failure that came after a network step's retries has lasted
// longer already, and is tried again 2 s after it ended.
const FailedRunLasts = time.Minute

// paceRetry, after a failed run that started at start, waits out the rest of FailedRunLasts when the join timer will
// run the boot again.
func (j *joiner) paceRetry(ctx context.Context, start time.Time) {
	if !j.files.Exists(j.joinTimerFile()) {
		return
	}
	if wait := FailedRunLasts - j.clock.Now().Sub(start); wait > 0 {
		j.log.Printf("%s tries again in %s", joinTimerName, wait.Round(time.Second))
		_ = j.clock.Sleep(ctx, wait)
	}
}

func (j *joiner) boot(ctx context.Context) error {
	j.log.Printf("booting pool %s of cluster %s (API server %s)", j.cfg.PoolName, j.cfg.ClusterName, j.cfg.APIServerEndpoint)
	if err := j.tl.Phase(j.log, "identity", func() error {
		return j.clock.Retry(ctx, j.log, "read instance identity from IMDS", j.identity)
	}); err != nil {
		return err
	}
	for _, f := range identityForms {
		if v := f.get(j); !f.ok(v) {
			return fmt.Errorf("IMDS returned an unexpected %s: '%s'", f.name, v)
		}
	}
	j.id.NodeIP = netip.MustParseAddr(j.localIPv4) // checked above
	j.out.InstanceID, j.out.Lifecycle = j.id.InstanceID, j.lifecycle
	j.log.Printf("instance %s (%s) in %s, node IP %s, target lifecycle state %s", j.id.InstanceID, j.id.InstanceType,
		j.id.Zone, j.id.NodeIP, j.lifecycle)
	j.cloud.Connect(j.cloud, j.id.Region, j.domain)

	switch {
	case slices.Contains([]string{"Warmed:Terminated", "Terminated", "Detached", "Standby"}, j.lifecycle):
		j.out.Result = "skipped"
		j.log.Printf("target lifecycle state %s: nothing to do", j.lifecycle)
		return nil
	case strings.HasPrefix(j.lifecycle, "Warmed:"):
		return j.warm(ctx)
	default:
		return j.inService(ctx)
	}
}

func (j *joiner) warm(ctx context.Context) error {
	j.out.Mode = "prepare"
	if j.cfg.LaunchHook == "" {
		j.log.Printf("no launch hook: the group may stop this instance before it is prepared (the next boot finishes the job)")
	}
	if err := j.prepare(ctx); err != nil {
		return err
	}
	if err := j.markPrepared(); err != nil {
		return err
	}
	j.waitPrepull()
	if err := j.lifecycleContinue(ctx); err != nil {
		return err
	}
	if err := j.touch(j.markerWarm(), ""); err != nil {
		return err
	}
	j.out.Result = "prepared"
	j.log.Printf("prepared in the warm pool; the group stops, hibernates or keeps it, and it joins when it enters service")
	return nil
}

func (j *joiner) inService(ctx context.Context) error {
	j.out.Mode = "join"
	prepared := j.files.Exists(j.markerPrepared())
	// Prepared in the warm pool: on this boot (Running, Hibernated) or an earlier one (Stopped).
	if (prepared || j.files.Exists(j.markerWarm())) && j.handBackStale(ctx) {
		return nil
	}
	// The gateway may be asleep: it boots while this node prepares. The join does not wait for it; its log says
	// why the tunnel stays down.
	if j.cfg.GatewayInstanceID != "" {
		w := &waker{cloud: j.cloud, log: j.log.With("dynk8s-wake-gateway"), dryRun: j.dryRun,
			clock:  system.NewClock(j.cfg.Deadlines.Wake.D(), j.clock.BackoffInitial, j.clock.BackoffMax),
			settle: j.cfg.Deadlines.WakeSettle.D(), interval: j.cfg.Deadlines.WakeInterval.D()}
		// A boot that ends first stops it: its settle window on a running gateway may outlast the join.
		wakeCtx, stopWake := context.WithCancelCause(ctx)
		defer stopWake(errBootEnded)
		go func() { _ = w.wake(wakeCtx, j.cfg.GatewayInstanceID) }()
	}
	j.startCache(ctx)
	j.startProbe(ctx)
	if prepared {
		j.log.Printf("prepared on an earlier boot (%s)", j.markerPrepared())
		if err := j.tl.Phase(j.log, "crio", func() error { return j.startCrio(ctx) }); err != nil {
			return err
		}
	} else if err := j.prepare(ctx); err != nil {
		return err
	}
	// The lock (prepare started it) runs beside the join's first phases, and holds before kubeadm join.
	locked := func() error { return nil }
	if !prepared {
		locked = j.markPrepared
	}
	if err := j.joinCluster(ctx, locked); err != nil {
		return err
	}
	j.waitPrepull()
	if err := j.lifecycleContinue(ctx); err != nil {
		return err
	}
	j.out.Result = "joined"
	return nil
}

// failed logs the one reason the boot stops, to the kernel log too, and completes a waiting launch lifecycle action
// with CONTINUE at once (the hook's default result is CONTINUE too, but only at the end of its heartbeat). It never
// hands the instance back to its group: why, and how the autoscaler retires it instead (its scale-up times out, and
// cluster-autoscaler's removeOldUnregisteredNodes removes it at max-node-provision-time), is in
// docs/how-it-works.md, "When a boot fails".
func (j *joiner) failed(ctx context.Context, err error) {
	j.log.Printf("FAILED: %v", err)
	j.log.Kernel(3, "FAILED: "+err.Error())
	j.out.Result, j.out.Reason = "failed", err.Error()
	j.tl.Cut()
	if j.cfg.LaunchHook == "" || j.id.InstanceID == "" || j.completing || j.cloud.ASG == nil {
		return
	}
	j.completing = true
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	noAction, cerr := j.completeLifecycle(ctx, "CONTINUE")
	switch {
	case cerr != nil:
		j.log.Printf("could not complete the lifecycle action of hook %s: %v", j.cfg.LaunchHook, cerr)
	case !noAction:
		j.log.Printf("completed the lifecycle action of hook %s with CONTINUE: the group keeps this instance, and the "+
			"autoscaler removes it at max-node-provision-time", j.cfg.LaunchHook)
	}
}

// finish runs on every end but the warm wait: it removes the rendered JoinConfiguration (it holds the token), stops
// a pre-pull still running, and writes the timeline.
func (j *joiner) finish() {
	if j.dryRun {
		return
	}
	_ = os.Remove(j.joinConfig())
	j.endProbe()
	j.endLock()
	if j.stopPrepull != nil {
		j.stopPrepull()
	}
	j.tl.Cut()
	if err := j.tl.Write(j.log, j.out, j.files.Run(""), j.files.Proc+"/uptime"); err != nil {
		j.log.Printf("could not write %s: %v", j.files.Run("timeline.json"), err)
	}
}

func (inst *instance) identity(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, inst.clock.Timeout(30*time.Second))
	defer cancel()
	for _, v := range []struct {
		into *string
		path string
	}{
		{&inst.id.InstanceID, "instance-id"}, {&inst.id.Zone, "placement/availability-zone"},
		{&inst.id.Region, "placement/region"}, {&inst.domain, "services/domain"}, {&inst.localIPv4, "local-ipv4"},
		{&inst.id.InstanceType, "instance-type"},
	} {
		s, err := inst.cloud.IMDS.Get(ctx, v.path)
		if err != nil {
			return err
		}
		*v.into = s
	}
	return inst.lifecycleState(ctx)
}

// lifecycleState: an instance outside any group has no target lifecycle state (404); without a launch hook that
// means InService. With a hook the group sets it before the instance boots, so it must be there.
func (inst *instance) lifecycleState(ctx context.Context) error {
	s, err := inst.cloud.IMDS.Get(ctx, cloud.LifecyclePath)
	if err == nil {
		inst.lifecycle = s
		return nil
	}
	if ie := (*cloud.IMDSErr)(nil); !errors.As(err, &ie) || ie.Status != http.StatusNotFound {
		return err
	}
	if inst.cfg.LaunchHook != "" {
		return fmt.Errorf("%w (a group with launch hook %s sets it)", err, inst.cfg.LaunchHook)
	}
	inst.lifecycle = "InService"
	inst.log.Printf("IMDS has no target lifecycle state; going on as InService")
	return nil
}

func (pr *preparer) prepare(ctx context.Context) error {
	if !pr.baking {
		if err := pr.loadBaked(); err != nil {
			return err
		}
	}
	packages, note := pr.packages, ""
	if pr.baked != nil {
		packages, note = pr.checkBaked, " (baked)"
	}
	if err := pr.runPhases(ctx, []phase{{name: "kernel", run: pr.kernelModules}, {name: "packages", note: note, run: packages},
		{name: "crio", run: pr.crio}}); err != nil {
		return err
	}
	if pr.baked != nil {
		// The bake locked the pins: the timeline keeps the phase on either image.
		pr.log.Printf("phase=lock took=0.0s (baked)")
		pr.lockDone = make(chan error, 1)
		pr.lockDone <- nil
	}
	pr.startPrepull(ctx)
	return nil
}

// markPrepared marks the instance prepared once the pins' lock holds (a later boot of a Stopped warm instance skips
// the preparation), after prepare.
func (pr *preparer) markPrepared() error {
	if err := pr.waitLock(); err != nil {
		return err
	}
	return pr.touch(pr.markerPrepared(), strings.Join(pr.cfg.Packages, ",")+"\n")
}

func (r *bootEnv) touch(path, content string) error {
	if r.dryRun {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// kernelModules: br_netfilter (bridge-based CNIs, kube-proxy on bridged traffic) and overlay (CRI-O's storage) may be
// missing from a cloud kernel; Fedora's kernel-modules-extra of the running kernel has the rest of the modules (it
// requires kernel-modules of the same release, kernel.spec). Only then is it installed, from the release repository
// first (a GA image runs the release's kernel), then with its updates. kubeadm join checks neither module
// (cmd/kubeadm/app/preflight/checks.go at v1.34.4, JoinNodeChecks), so a module still missing is logged, not fatal.
// The sysctls (some need br_netfilter) are applied once the modules are in: cloud-init wrote them after
// systemd-sysctl ran at this first boot. Tolerant (-e): an unknown key must not stop the boot. A baked image has
// the modules its build installed, for the kernel it runs: its boot never installs, and logs what stays missing.
func (pr *preparer) kernelModules(ctx context.Context) error {
	modprobe := func(ms []string) (missing []string) {
		for _, m := range ms {
			if pr.host.Run(ctx, time.Minute, true, "modprobe", m) != nil {
				missing = append(missing, m)
			}
		}
		return missing
	}
	missing := modprobe(pr.cfg.KernelModules)
	still := missing
	if len(missing) > 0 && pr.baked == nil {
		pkg := "kernel-modules-extra-" + kernelRelease()
		pr.log.Printf("kernel modules missing: %s; installing %s from Fedora's repositories", strings.Join(missing, " "), pkg)
		repos := repoArgs(pr.cfg.SystemRepos)
		if err := pr.dnfInstall(ctx, append(repos, pkg)...); err != nil {
			repos = append(repos, repoArgs(pr.cfg.UpdateRepos)...)
			if err := pr.dnfInstall(ctx, append(repos, pkg)...); err != nil {
				pr.log.Printf("installing kernel-modules-extra failed: %v", err)
			}
		}
		still = modprobe(missing)
	}
	if len(still) > 0 {
		pr.log.Printf("still missing kernel modules: %s (kubeadm join does not need them; bridge CNIs need "+
			"br_netfilter, CRI-O's overlay storage needs overlay)", strings.Join(still, " "))
	}
	_ = pr.host.Run(ctx, time.Minute, false, "sysctl", "-q", "-e", "--system")
	return nil
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// crio starts CRI-O. Its package ships a bridge CNI config that would give every node the same pod range; the
// cluster CNI owns that.
func (pr *preparer) crio(ctx context.Context) error {
	bridges, _ := filepath.Glob(pr.files.Etc("cni/net.d/*crio*bridge*.conflist"))
	for _, b := range bridges {
		if !pr.dryRun {
			_ = os.Remove(b)
		}
	}
	// One enable for both, for the boots to come, without the manager's reload each enable does (0.3-0.5 s on a
	// busy box, twice): this boot's start loads crio.service from disk, where the packages put it, even when a unit
	// named it before it was there (systemd src/core/transaction.c transaction_add_job_and_dependencies, since 246:
	// a not-found unit is loaded again once the unit directories changed), and kubeadm's kubelet start reloads the
	// manager itself before it starts the kubelet (kubeadm's initsystem ServiceRestart).
	if pr.host.Run(ctx, time.Minute, false, "systemctl", "enable", "--no-reload", "crio.service", "kubelet.service") != nil {
		return errors.New("could not enable crio.service and kubelet.service")
	}
	return pr.startCrio(ctx)
}

func (pr *preparer) startCrio(ctx context.Context) error {
	if pr.host.Run(ctx, 5*time.Minute, false, "systemctl", "start", "crio.service") != nil {
		return errors.New("crio.service did not start (journalctl -u crio)")
	}
	return nil
}

// startPrepull pulls the images in the background, so that the join goes on meanwhile; a failed pull is logged and
// never fails the boot (the kubelet pulls what is still missing). Each pull is bounded by the deadline.
func (pr *preparer) startPrepull(ctx context.Context) {
	images := pr.prePullImages()
	if pr.baked != nil && len(images) == 0 {
		pr.log.Printf("phase=pre-pull took=0.0s (baked)")
		pr.prepull = make(chan time.Duration, 1)
		pr.prepull <- 0
		return
	}
	if !pr.host.Has("crictl") {
		pr.log.Printf("pre-pull skipped: no crictl")
		return
	}
	ctx, pr.stopPrepull = context.WithCancel(ctx)
	pr.prepull = make(chan time.Duration, 1)
	go func() {
		start := pr.clock.Now()
		failed := 0
		for _, img := range images {
			err := pr.host.Run(ctx, pr.clock.Timeout(5*time.Minute), true, "crictl", "--runtime-endpoint", pr.cfg.CRISocket,
				"pull", img)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				failed++
				pr.log.Printf("pre-pull of %s failed (%v); the kubelet pulls it when needed", img, err)
			} else {
				pr.pulled = append(pr.pulled, img)
			}
		}
		took := pr.clock.Now().Sub(start)
		pr.log.Printf("phase=pre-pull took=%ss (%d images, %d failed)", system.Seconds(took), len(images), failed)
		pr.prepull <- took
	}()
}

func (pr *preparer) waitPrepull() {
	if pr.prepull == nil {
		return
	}
	pr.tl.Add("pre-pull", <-pr.prepull)
	pr.prepull = nil
}

// joinCluster runs the join's phases; beforeKubelet runs before kubeadm join, and its error ends the join.
func (jn *joining) joinCluster(ctx context.Context, beforeKubelet func() error) error {
	if err := jn.runPhases(ctx, []phase{
		{name: "checks", run: jn.readyToJoin},
		{name: "token", run: jn.retried("read the join token from SSM parameter "+jn.cfg.JoinTokenParameter, jn.readToken)},
		{name: "kubelet-key", run: jn.kubeletKey},
		{name: "api-server", run: jn.waitProbe},
		// Before the kubelet: its pods find the cache mounted from their start, and its Node the cache's label.
		{run: func(context.Context) error {
			if err := beforeKubelet(); err != nil {
				return err
			}
			jn.waitCache()
			return jn.render()
		}},
		{name: "kubeadm-join", run: jn.retried("kubeadm join", jn.kubeadmJoin)},
	}); err != nil {
		return err
	}
	jn.log.Printf("joined the cluster as %s", jn.inst.id.InstanceID)
	jn.stopTimer(ctx)
	return nil
}

// startCache runs the cache phase (attachCache) in the background from the boot's start, if the pool keeps a cache:
// EBS's create, attach and device (seconds each) and the file system's make or check overlap the packages, CRI-O and
// the join's own phases instead of adding to them. The join waits for it before the kubelet starts (waitCache).
func (jn *joining) startCache(ctx context.Context) {
	switch {
	case jn.cfg.Cache == nil:
		return
	case jn.skip["cache"]:
		jn.log.Printf("phase=cache skipped (--skip)")
		return
	}
	jn.cacheDone = make(chan time.Duration, 1)
	go func() {
		start := jn.clock.Now()
		_ = jn.attachCache(ctx) // never fails: a node without a cache joins
		took := jn.clock.Now().Sub(start)
		jn.log.Printf("phase=cache took=%ss", system.Seconds(took))
		jn.cacheDone <- took
	}()
}

// startProbe probes the API server (phase api-server) in the background from the boot's start: through an awake
// gateway it answers while the node prepares, and through a sleeping one the probe waits for the tunnel beside the
// preparation instead of after it. The api-server phase is the join's wait for its answer, before kubeadm join.
// Its attempts are a second apart at most, each connecting for 3 s at most: a connection into a tunnel that is not up yet
// loses its SYNs, and a fresh attempt finds the tunnel soon after it comes up, where the boot's backoff (up to
// backoffMax) and a connection's own SYN retries (1, 3 and 7 s after it starts) would find it seconds late.
func (jn *joining) startProbe(ctx context.Context) {
	if jn.skip["api-server"] {
		return
	}
	ctx, jn.stopProbe = context.WithCancel(ctx)
	jn.probeDone = make(chan error, 1)
	clock := jn.clock.Capped(time.Second)
	go func() {
		jn.probeDone <- clock.Retry(ctx, jn.log, "reach the API server at "+jn.cfg.APIServerEndpoint.String(),
			jn.probeAPIServer)
	}()
}

// waitProbe waits for the probe startProbe started.
func (jn *joining) waitProbe(ctx context.Context) error {
	if jn.probeDone == nil {
		return errors.New("the API server probe never started")
	}
	select {
	case err := <-jn.probeDone:
		jn.probeDone = nil
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endProbe stops a probe still running (the boot ended before it waited) and waits for it to end.
func (jn *joining) endProbe() {
	endBackground(jn.log, &jn.probeDone, jn.stopProbe, "the API server probe")
}

// endBackground stops a step of the boot still running in the background (stop) and waits for its end on *done, if
// one runs; an error other than the stop's is logged as what had not succeeded.
func endBackground(log *system.Logger, done *chan error, stop context.CancelFunc, what string) {
	if *done == nil {
		return
	}
	stop()
	if err := <-*done; err != nil && !errors.Is(err, context.Canceled) {
		log.Printf("%s had not succeeded when the boot ended: %v", what, err)
	}
	*done = nil
}

// waitCache waits for the cache phase started by startCache, if any.
func (jn *joining) waitCache() {
	if jn.cacheDone == nil {
		return
	}
	jn.tl.Add("cache", <-jn.cacheDone)
	jn.cacheDone = nil
}

// attachCache attaches and mounts the pool's build cache, if the pool keeps one, before the kubelet starts: a node
// that gets none (all taken, the pool at its most, the API refusing) says why in one line and joins without; the
// Node carries kube.LabelCache only with one.
func (jn *joining) attachCache(ctx context.Context) error {
	cfg := jn.cfg.Cache
	if jn.dryRun {
		jn.log.Printf("dry run: would attach a cache volume of pool %s in %s and mount it at %s", jn.cfg.PoolName,
			jn.inst.id.Zone, cfg.MountPath)
		return nil
	}
	c := &cache.Cache{EC2: jn.cloud.EC2, Host: jn.host, Files: jn.files, Log: jn.log, Now: jn.clock.Now,
		Sleep: jn.clock.Sleep, Cluster: jn.cfg.ClusterName, Pool: jn.cfg.PoolName, Instance: jn.inst.id.InstanceID,
		Zone: jn.inst.id.Zone, Config: *cfg}
	res, err := c.Attach(ctx)
	if err != nil {
		jn.log.Printf("cache: none for this node: %v; joining without one", err)
		return nil
	}
	state := "as it was"
	switch {
	case res.Created:
		state = "new"
	case res.Remade:
		state = "made anew (its file system could not be repaired)"
	case res.Repaired:
		state = "repaired"
	}
	jn.log.Printf("cache: volume %s (%s) mounted at %s, %s", res.VolumeID, res.Device, cfg.MountPath, state)
	jn.inst.id.Cache = true
	return nil
}

// phase is one step of the boot, timed in its timeline under its name (none: a step between phases, untimed); note
// follows the time in its log line ("phase=packages took=0.1s (baked)").
type phase struct {
	name, note string
	run        func(context.Context) error
}

// Phases are the boot's phases in order, the names --skip takes: prepare's, then the join's.
var Phases = []string{"kernel", "packages", "crio", "cache", "checks", "token", "kubelet-key", "api-server", "kubeadm-join"}

// runPhases runs phases in order, but those the operator skips (--skip), which it logs.
func (r *bootEnv) runPhases(ctx context.Context, phases []phase) error {
	for _, p := range phases {
		switch {
		case p.name == "":
			if err := p.run(ctx); err != nil {
				return err
			}
		case r.skip[p.name]:
			r.log.Printf("phase=%s skipped (--skip)", p.name)
		default:
			if err := r.tl.NotedPhase(r.log, p.name, p.note, func() error { return p.run(ctx) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// retried is attempt retried under the boot's deadline as desc.
func (r *bootEnv) retried(desc string, attempt func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error { return r.clock.Retry(ctx, r.log, desc, attempt) }
}

// readyToJoin is what must hold before kubeadm join starts the kubelet: what its preflight fails on
// (cmd/kubeadm/app/preflight/checks.go and checks_linux.go at v1.34.4: JoinNodeChecks, addExecChecks,
// addIPv4Checks/addIPv6Checks), checked here so that the log names it; swap off (the kubelet's failSwapOn: only
// now, not while preparing, as a warm pool instance that hibernates needs its swap); and the metadata lockdown,
// which the kubelet's drop-in requires: starting it here first makes a failure the join's, with its reason, instead
// of a kubelet that never starts.
func (jn *joining) readyToJoin(ctx context.Context) error {
	var missing []string
	for _, exe := range []string{"ip", "iptables", "mount", "nsenter"} {
		if !jn.host.Has(exe) {
			missing = append(missing, exe)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("kubeadm join needs %s on PATH (preflight InPathCheck)", strings.Join(missing, " "))
	}
	if err := jn.forwarding(ctx); err != nil {
		return err
	}
	if jn.host.Run(ctx, time.Minute, false, "swapoff", "-a") != nil {
		return errors.New("could not turn swap off (swapoff -a): the kubelet refuses to start with swap on")
	}
	if jn.host.Run(ctx, 5*time.Minute, false, "systemctl", "start", imdsLockUnit) != nil {
		return errors.New("the instance metadata lockdown did not load (journalctl -u dynk8s-imds-lock): no kubelet " +
			"may run without it")
	}
	return nil
}

// forwarding: kubeadm join's preflight needs IP forwarding of the API server address's family.
func (jn *joining) forwarding(ctx context.Context) error {
	addr, ok := jn.cfg.APIServerEndpoint.Addr()
	if !ok {
		return nil // a name: the family is the resolver's
	}
	key, file := "net.ipv4.ip_forward", "sys/net/ipv4/ip_forward"
	if addr.Is6() {
		key, file = "net.ipv6.conf.default.forwarding", "sys/net/ipv6/conf/default/forwarding"
	}
	isOne := func() bool {
		b, err := os.ReadFile(jn.files.Proc + "/" + file)
		return err == nil && strings.TrimSpace(string(b)) == "1"
	}
	if isOne() || jn.dryRun {
		return nil
	}
	_ = jn.host.Run(ctx, time.Minute, false, "sysctl", "-q", "-w", key+"=1")
	if !isOne() {
		return fmt.Errorf("kubeadm join needs %s = 1 (preflight FileContent check), and it is not", key)
	}
	return nil
}

// readToken: the token rotator in the cluster writes the parameter; until its first run (a fresh install) the
// parameter is missing or holds a placeholder, and a token it wrote may have expired if it stopped running: each is
// a reason to retry, never to join with what is there. The value is never logged.
func (jn *joining) readToken(ctx context.Context) error {
	jn.token = ""
	ctx, cancel := context.WithTimeout(ctx, jn.clock.Timeout(10*time.Second))
	defer cancel()
	out, err := jn.cloud.SSM.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(jn.cfg.JoinTokenParameter),
		WithDecryption: aws.Bool(true)})
	if err != nil {
		jn.cloud.Forget(err)
		err = cloud.APIError("SSM GetParameter "+jn.cfg.JoinTokenParameter, err)
		if cloud.ErrorCode(err) == "ParameterNotFound" {
			return fmt.Errorf("%w (not created yet)", err)
		}
		return err
	}
	if out.Parameter == nil || !names.IsBootstrapToken(aws.ToString(out.Parameter.Value)) {
		return errors.New("it holds no bootstrap token ([a-z0-9]{6}.[a-z0-9]{16}) yet: the cluster's token rotator " +
			"has not written one")
	}
	jn.token = aws.ToString(out.Parameter.Value)
	return nil
}

// probeAPIServer only proves that the tunnel and the API server answer (any HTTP status), without checking its
// certificate: kubeadm then pins the CA by hash.
func (jn *joining) probeAPIServer(ctx context.Context) error {
	client := &http.Client{Timeout: jn.clock.Timeout(10 * time.Second), Transport: &http.Transport{
		DialContext:     (&net.Dialer{Timeout: 3 * time.Second}).DialContext, // startProbe says why
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},               //nolint:gosec // a probe; kubeadm pins the CA
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+jn.cfg.APIServerEndpoint.String()+"/readyz", nil)
	if err != nil {
		return system.Permanent(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	jn.log.Printf("API server answered HTTP %d", resp.StatusCode)
	return nil
}

// render writes the JoinConfiguration, which holds the token, readable by root alone.
func (jn *joining) render() error {
	b, err := yaml.Marshal(jn.cfg.JoinConfig(jn.inst.id, jn.token, jn.files.Root))
	if err != nil {
		return fmt.Errorf("JoinConfiguration: %w", err)
	}
	if jn.dryRun {
		if jn.verbose {
			hidden, _ := yaml.Marshal(jn.cfg.JoinConfig(jn.inst.id, "<the token from SSM>", jn.files.Root))
			jn.log.Printf("dry run: the JoinConfiguration:\n%s", hidden)
		}
		return nil
	}
	if err := os.MkdirAll(jn.files.Run(""), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(jn.joinConfig(), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func (jn *joining) kubeadmJoin(ctx context.Context) error {
	if jn.joinAttempts++; jn.joinAttempts > 1 {
		// The token may have expired or been rotated since the last attempt read it: use what SSM holds now.
		if err := jn.readToken(ctx); err != nil {
			return err
		}
		if err := jn.render(); err != nil {
			return system.Permanent(err)
		}
		if err := jn.rewriteKubeletKey(); err != nil {
			return system.Permanent(err)
		}
	}
	err := jn.host.Run(ctx, jn.clock.Timeout(0), false, "kubeadm", "join", "--config", jn.joinConfig())
	if err == nil {
		return nil
	}
	if ee := (*system.ExitError)(nil); errors.As(err, &ee) {
		err = fmt.Errorf("kubeadm join exited %d (its output is above)", ee.Code)
	}
	// A failed join leaves files that fail the next attempt's preflight checks.
	if jn.host.Run(ctx, jn.clock.Timeout(time.Minute), true, "kubeadm", "reset", "--force") != nil {
		jn.log.Printf("kubeadm reset after the failed join failed too")
	}
	return err
}

// stopTimer: a joined node needs no timer; the join unit's Condition would skip its runs, but a skipped run leaves
// the timer's base where it was, so it would fire every 2 s for the node's life. --no-block: nothing may make the
// join wait on another unit's job.
func (jn *joining) stopTimer(ctx context.Context) {
	if !jn.files.Exists(jn.joinTimerFile()) {
		return
	}
	if jn.host.Run(ctx, time.Minute, false, "systemctl", "disable", "--now", "--no-block", joinTimerName) != nil {
		jn.log.Printf("could not stop %s (harmless: its runs are skipped)", joinTimerName)
	}
}

// describe is this instance's group and launch template version, from DescribeAutoScalingInstances.
func (inst *instance) describe(ctx context.Context) (group, version string, err error) {
	out, err := inst.cloud.ASG.DescribeAutoScalingInstances(ctx, &autoscaling.DescribeAutoScalingInstancesInput{
		InstanceIds: []string{inst.id.InstanceID}})
	if err != nil {
		inst.cloud.Forget(err)
		return "", "", cloud.APIError("Auto Scaling DescribeAutoScalingInstances", err)
	}
	if len(out.AutoScalingInstances) == 0 || aws.ToString(out.AutoScalingInstances[0].AutoScalingGroupName) == "" {
		return "", "", fmt.Errorf("no group has %s", inst.id.InstanceID)
	}
	in := out.AutoScalingInstances[0]
	if in.LaunchTemplate != nil {
		version = aws.ToString(in.LaunchTemplate.Version)
	}
	inst.group = aws.ToString(in.AutoScalingGroupName)
	return inst.group, version, nil
}

func (inst *instance) groupName(ctx context.Context) (string, error) {
	if inst.group != "" {
		return inst.group, nil
	}
	g, _, err := inst.describe(ctx)
	return g, err
}

var templateVersionRE = regexp.MustCompile(`^[0-9]+$`)

// stale: this instance, prepared in the warm pool, was launched from an older version of its group's launch
// template than the group launches now. A `pulumi up` since then may have changed what its user data baked in (the
// gateway to wake, the CA pin, the Kubernetes version), and a warm instance keeps the user data it was launched
// with (EC2 Auto Scaling User Guide, "Update the instances in a warm pool").
func (inst *instance) stale(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, inst.clock.Timeout(30*time.Second))
	defer cancel()
	group, mine, err := inst.describe(ctx)
	if err != nil {
		return false, err
	}
	if !templateVersionRE.MatchString(mine) {
		return false, fmt.Errorf("no launch template version in the answer ('%s')", mine)
	}
	out, err := inst.cloud.ASG.DescribeAutoScalingGroups(ctx, &autoscaling.DescribeAutoScalingGroupsInput{
		AutoScalingGroupNames: []string{group}})
	if err != nil {
		inst.cloud.Forget(err)
		return false, cloud.APIError("Auto Scaling DescribeAutoScalingGroups", err)
	}
	current := ""
	if len(out.AutoScalingGroups) > 0 && out.AutoScalingGroups[0].LaunchTemplate != nil {
		current = aws.ToString(out.AutoScalingGroups[0].LaunchTemplate.Version)
	}
	if !templateVersionRE.MatchString(current) {
		return false, fmt.Errorf("no launch template version in the answer ('%s')", current)
	}
	inst.log.Printf("launched from version %s of the launch template; the group launches version %s", mine, current)
	m, _ := strconv.Atoi(mine) // both match templateVersionRE
	c, _ := strconv.Atoi(current)
	return m < c, nil
}

// handBackStale: a stale warm instance abandons its launch hook's action (or, with none waiting, is marked
// Unhealthy), so the group terminates it and launches another (from the warm pool, or fresh with the current user
// data). One question each: an unanswered one is no reason to give up a join that may well work. It says whether
// the instance was handed back.
func (j *joiner) handBackStale(ctx context.Context) bool {
	stale, err := j.stale(ctx)
	if err != nil {
		j.log.Printf("could not compare launch template versions (%v); joining with the user data it has", err)
		return false
	}
	if !stale {
		return false
	}
	j.out.Result = "stale"
	if j.cfg.LaunchHook != "" {
		noAction, err := j.completeLifecycle(ctx, "ABANDON")
		if err == nil && !noAction {
			j.log.Printf("prepared from an older launch template: abandoned the lifecycle action of hook %s, the group "+
				"replaces this instance", j.cfg.LaunchHook)
			return true
		}
	}
	if err := j.setUnhealthy(ctx); err != nil {
		j.log.Printf("prepared from an older launch template, and could not hand it back (%v): joining with the user "+
			"data it has", err)
		j.out.Result = "failed"
		return false
	}
	j.log.Printf("prepared from an older launch template: marked this instance Unhealthy, the group replaces it")
	return true
}

func (inst *instance) setUnhealthy(ctx context.Context) error {
	if inst.dryRun {
		inst.log.Printf("dry run: would mark %s Unhealthy", inst.id.InstanceID)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, inst.clock.Timeout(10*time.Second))
	defer cancel()
	_, err := inst.cloud.ASG.SetInstanceHealth(ctx, &autoscaling.SetInstanceHealthInput{InstanceId: aws.String(inst.id.InstanceID),
		HealthStatus: aws.String("Unhealthy"), ShouldRespectGracePeriod: aws.Bool(false)})
	if err != nil {
		inst.cloud.Forget(err)
		return cloud.APIError("Auto Scaling SetInstanceHealth", err)
	}
	return nil
}

// completeLifecycle completes the launch hook's action for this instance with result (CONTINUE or ABANDON);
// noAction says that none was waiting (a reboot with no transition in progress), which is no error.
func (inst *instance) completeLifecycle(ctx context.Context, result string) (noAction bool, err error) {
	group, err := inst.groupName(ctx)
	if err != nil {
		return false, err
	}
	if inst.dryRun {
		inst.log.Printf("dry run: would complete the lifecycle action of hook %s with %s", inst.cfg.LaunchHook, result)
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, inst.clock.Timeout(10*time.Second))
	defer cancel()
	_, err = inst.cloud.ASG.CompleteLifecycleAction(ctx, &autoscaling.CompleteLifecycleActionInput{
		AutoScalingGroupName: aws.String(group), LifecycleHookName: aws.String(inst.cfg.LaunchHook),
		InstanceId: aws.String(inst.id.InstanceID), LifecycleActionResult: aws.String(result)})
	if err == nil {
		return false, nil
	}
	inst.cloud.Forget(err)
	err = cloud.APIError("Auto Scaling CompleteLifecycleAction", err)
	if strings.Contains(err.Error(), "No active Lifecycle Action") {
		inst.log.Printf("no lifecycle action of hook %s waits for this instance", inst.cfg.LaunchHook)
		return true, nil
	}
	return false, err
}

func (j *joiner) lifecycleContinue(ctx context.Context) error {
	if j.cfg.LaunchHook == "" {
		return nil
	}
	return j.tl.Phase(j.log, "lifecycle", func() error {
		return j.clock.Retry(ctx, j.log, "complete the lifecycle action of hook "+j.cfg.LaunchHook,
			func(ctx context.Context) error {
				_, err := j.completeLifecycle(ctx, "CONTINUE")
				return err
			})
	})
}

// bake runs the prepare phases to the end (the pre-pull included), leaves the kubelet to the node's join, and
// writes the marker of what it installed. configSHA256 is node.json's.
func (j *joiner) bake(ctx context.Context, configSHA256 string) error {
	j.out.Mode, j.out.Result = "bake", "failed"
	j.log.Printf("baking an image from pool %s's configuration: %s", j.cfg.PoolName, strings.Join(j.cfg.Packages, " "))
	if err := j.prepare(ctx); err != nil {
		return err
	}
	if err := j.markPrepared(); err != nil {
		return err
	}
	j.waitPrepull()
	m, err := j.bakedMarkerOf(ctx, configSHA256)
	if err != nil {
		return err
	}
	// Left enabled, the kubelet would start on every boot of the image before cloud-init has written its metadata
	// lockdown drop-in (and crash-loop until the join); the node's crio phase enables it, and kubeadm join starts it
	// after the lockdown, as on a stock boot.
	if j.host.Run(ctx, time.Minute, false, "systemctl", "disable", "kubelet.service") != nil {
		return errors.New("could not disable kubelet.service")
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := system.WriteFileAtomic(j.files.Baked(), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("could not write the marker: %w", err)
	}
	j.out.Result = "baked"
	nevras := make([]string, len(m.Installed))
	for i, p := range m.Installed {
		nevras[i] = p.NEVRA
	}
	j.log.Printf("baked: %s says %s, cri-o %s, %d of %d images pulled", j.files.Baked(), strings.Join(nevras, " "),
		m.CRIO, len(m.Images), len(j.cfg.PrePullImages))
	return nil
}

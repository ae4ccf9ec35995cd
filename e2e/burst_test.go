//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	nodeutil "k8s.io/component-helpers/node/util"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/cmd/timeline/timeline"
	"github.com/dynk8s/dynk8s/infra/addons"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The burst, end to end: a build pod that no node can run makes the real Cluster Autoscaler raise the group of the
// pool it needs, the instance moto starts boots in a box (the launcher below plays EC2), joins, registers with the
// fuse startup taint, the real fuse device plugin (deployed by the addons through the real engine) advertises
// github.com/fuse, dynk8s-controller's untaint loop lifts the taint, the real kube-scheduler binds the pod and the
// real kubelet runs it to Succeeded; the idle node is then scaled in through the group, its box powers off, the
// controller's cleanup loop deletes its Node once moto reports the instance gone, and nothing of the pool is left.
//
// Images (none can be pulled here; see rig_images_test.go), each tagged as the stack names it:
//   - the sandbox image the rendered CRI-O config names (registry.k8s.io/pause): a rebuilt stand-in,
//     testdata/images/pause, a static Go program doing what upstream's pause.c does;
//   - the fuse DaemonSet's plugin image (docker.io/soolaugust/fuse-device-plugin): the real plugin,
//     github.com/kuberenetes-learning-group/fuse-device-plugin at 014e1c4 (hack/tools.sh), its binary alone at
//     the path the DaemonSet runs, where upstream's image has it on debian:stretch-slim;
//   - the build pod's image, the test's own: testdata/images/build, a static Go program.
//
// The network is the stack's (rig_vpc_test.go): the node's box and the gateway's box hang off one VPC router, which sends
// the on-prem ranges to the gateway; the gateway instance is in moto, stopped when the burst begins, and the node's
// boot starts it (the wake-up, with the node role's policy under moto's IAM enforcement); the launcher boots the
// gateway's box, whose real wg-quick and wireguard-go bring the tunnel up to the on-prem namespace running the
// rendered on-prem config; the API server answers there, at the dev stack's own apiServerEndpoint, which
// cluster-info names as kubeadm's would. The node's join, its kubelet and its pods reach the API server only through
// that tunnel. Once the node is gone, the gateway's idle check (gateway.idleStop at its shortest, 5 minutes), with
// the gateway role's policy, finds no pool instance and nothing forwarded and powers the gateway off, and EC2 (the
// launcher) stops the instance.
//
// What stands in, besides the box's own (rig_box_test.go: the box and the gateway box): the kubernetes Service's address is
// translated to the API server's on-prem endpoint by a box-only nftables rule, where a cluster has kube-proxy or its
// CNI; the instance roles' credentials are moto's, of the roles replayed with their policies and assumed once by the
// test (moto's IAM enforcement checks actions, not resources or conditions); the node's SSM (the join token) and the
// gateway's (its key) are motos of their own; dynk8s-controller runs on this machine as its Deployment would on an
// on-prem node (none runs here): the live Deployment's args with the loops the burst needs (untaint, cleanup) and a
// shorter NotReady threshold, its ServiceAccount's token, the cleanup IAM user's key against moto.

// burstCleanupThreshold is the NotReady time after which the controller's cleanup deletes a Node whose instance is
// gone (the dev stack's cleanup.notReadyAfter: 5 minutes).
const burstCleanupThreshold = 5 * time.Second

// TestBurstScaleUpAndBackToZero runs the whole loop once, the sleeping gateway woken by the controller at the
// autoscaler's decision, and logs each phase's seconds since the build pod was created.
//
// cmd/status, as the operator runs it on the on-prem peer, reports the gateway asleep and the pool at zero before
// the burst, the pool at one with its Node Ready and the tunnel up while the build's Node still runs, and zero again
// after it.
//
// The pool keeps a build cache (the dev stack's builders-x86 does, docs/build-caches.md): the first node creates its
// volume, makes its file system and mounts it, and its build writes there; after the pool has been at zero, a
// second build raises it again, and the new node attaches and mounts the same volume, where its build finds what
// the first wrote.
func TestBurstScaleUpAndBackToZero(t *testing.T) {
	st := buildStatus(t)
	b := newBurst(t, burstOptions{timeline: true})
	if b.pool.Cache == nil {
		t.Fatalf("the dev stack's pool %s keeps no build cache", b.pool.Name)
	}
	st.checkAsleep(b.ctx, t, b, "before the burst")
	b.scaleUp(t)
	st.checkBurst(b.ctx, t, b)
	b.backToZero(t)
	st.checkAsleep(b.ctx, t, b, "after the burst")
	first := b.cacheVolume
	b.scaleUp(t)
	if b.cacheVolume != first {
		t.Errorf("the second node mounted volume %s, want the first's %s", b.cacheVolume, first)
	}
	if vols := b.aws.cacheVolumes(b.ctx, t); len(vols) != 1 || vols[first] != "in-use" {
		t.Errorf("the pool's cache volumes after the second node: %v, want %s in use alone", vols, first)
	}
}

// TestBurstNodeWakesTheGateway is the fallback: without the controller's wake-up (its loop not run, as with the
// controller down), the node's own boot starts the sleeping gateway, and the tunnel comes up for its join.
func TestBurstNodeWakesTheGateway(t *testing.T) {
	b := newBurst(t, burstOptions{nodeWakeOnly: true})
	b.scaleUp(t)
}

// TestBurstScaleUpFromWarmPool: a pool with a warm pool waiting Stopped (the default) scales up by the warm
// instance, as EC2 Auto Scaling does: the launcher plays the warm pool (prepareWarm: prepared, its launch hook's
// action completed, stopped), and the scale-up's capacity goes to it (enterService); its second boot joins without
// preparing again, completes the action the group held it in, and the build runs on its Node.
func TestBurstScaleUpFromWarmPool(t *testing.T) {
	b := newBurst(t, burstOptions{awake: true, warm: "Stopped"})
	b.scaleUp(t)
	if result, mode := b.box.timeline(b.ctx, t); result != "joined" || mode != "join" {
		t.Errorf("timeline: result %q mode %q, want joined, join", result, mode)
	}
	journal, err := b.box.exec(b.ctx, "journalctl", "-b", "-u", "dynk8s-join.service", "-o", "cat", "--no-pager")
	assert.NilError(t, err)
	if !strings.Contains(journal, "prepared on an earlier boot") {
		t.Errorf("the in-service boot prepared again:\n%s", journal)
	}
}

// burstOptions are what a burst varies.
type burstOptions struct {
	// awake: the gateway is started, and the tunnel is up, before the build pod is created.
	awake bool
	// nodeWakeOnly: the controller does not run its wake loop, so the node's boot wakes the sleeping gateway.
	nodeWakeOnly bool
	// warm: the pool has a warm pool of one instance in this state (Stopped or Running), prepared before the build
	// pod is created, which enters service for the scale-up; "": none, the scale-up's instance boots cold.
	warm string
	// baked: the pool's instances boot from an image baked for it (docs/baked-images.md), made in a box before the
	// build pod is created, as cmd/bake makes it; false: from the stock image, which installs the packages.
	baked bool
	// timeline: cmd/timeline runs beside the first build, as an operator would, with a pending pod of its own that
	// starts on the new node beside the build's (the benchmark leaves it out: a second pod start on the node).
	timeline bool
}

// String names the options as the benchmark's rows do.
func (o burstOptions) String() string {
	var s string
	switch {
	case o.awake:
		s = "gateway awake"
	case o.nodeWakeOnly:
		s = "gateway asleep, woken by the node"
	default:
		s = "gateway asleep, woken by the controller"
	}
	if o.baked {
		s += ", baked image"
	}
	if o.warm != "" {
		s += ", warm pool " + o.warm
	}
	return s
}

// burst is the loop's world: the control plane with a scheduler, the addons, moto with the stack replayed, the
// autoscaler, and the launcher that boots the group's instances.
type burst struct {
	opts     burstOptions
	ctx      context.Context
	c        cluster
	client   kubernetes.Interface
	s        stackAutoscaling
	pool     config.NodePool
	group    string
	aws      *awsEnv
	vpc      *vpcWithGateway
	ca       *autoscalerProcess
	ctl      *controllerProcess
	launcher *launcher
	phases   *phaseLog
	// box and node are the instance's box and its Node, once scaleUp has seen it register.
	box  *boxNode
	node string
	// rounds is how many scale-ups have begun; cacheVolume is the build cache the last one's node mounted.
	rounds      int
	cacheVolume string
	// nodeNames are the Nodes of the instances, by instance id.
	nodeNames map[string]string
}

func newBurst(t *testing.T, opts burstOptions) *burst {
	t.Helper()
	c := requireCluster(t)
	requireTool(t, "kube-scheduler")
	requireTool(t, "aws")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	keepEtcKubernetesClean(t)
	cfg := devConfig(t)
	pool := hostArchPool(t, cfg)
	if opts.warm != "" {
		pool.WarmPool = &config.WarmPool{Size: 1, State: opts.warm}
	}
	s := loadStackAutoscaling(t)
	b := &burst{opts: opts, ctx: ctx, c: c, client: clientFor(t, c), s: s, pool: pool,
		group: s.poolGroup(t, pool.Name), phases: &phaseLog{}}
	t.Cleanup(func() { b.phases.log(t) })

	applyAddons(ctx, t, c, cfg)
	onPremNode(ctx, t, b.client)
	startScheduler(t, c)
	s.replay.Roles, s.replay.Gateway = s.instanceRoles(t), s.gateway
	if s.cleanupWake == "" {
		t.Fatal("the dev stack's gateway sleeps, and the controller's user has no policy to start it")
	}
	b.aws = startAWS(ctx, t, s, []replayUser{{Name: s.userName, Policy: s.policy},
		{Name: s.cleanupUser, Policy: s.cleanupPolicy, More: []string{s.cleanupWake}},
		{Name: operatorUser, Policy: operatorPolicy}})
	b.vpc = newVPCWithGateway(ctx, t, c, cfg, s, b.aws)
	j := prepareBoxJoin(ctx, t, c, cfg, pool, "")
	var image string
	if opts.baked {
		// Before the join has its VPC: the bake's box needs the package repositories, not the cluster or EC2.
		image = filepath.Join(t.TempDir(), "image")
		bakeImage(t, j, cfg.Region+fakeZoneSuffix, image)
	}
	j.vpc = b.vpc
	b.vpc.serveClusterInfo(ctx, t, c)
	j.userData = b.vpc.renderNodeUserData(ctx, t, c, cfg, pool, j.param)
	b.launcher = newLauncher(t, b.aws, j, b.group, burstImages(ctx, t, c, j))
	b.launcher.image = image
	// Before the addons' destroy: the pods bound to the boxes' Nodes, which no kubelet will confirm gone once the
	// Node is. The pod GC would delete them only after its quarantine, and a DaemonSet being deleted waits for its
	// pods, so the next test's addons would meet it still there.
	// A burst that stops at the scale-up (the benchmark, the fallback test) leaves its Node too, which the next
	// test's autoscaler would count as an unready node of the pool.
	// The Node goes first, so that no DaemonSet makes a pod for it after its pods are deleted; the pods are the
	// Node's by its name (the instance id), not by the box's hostname.
	t.Cleanup(func() {
		for _, n := range b.launcher.boxes {
			name := n.id // a pool Node's name, also once the Node is gone (its pods may outlive it)
			if found, err := findNode(context.Background(), c, n.providerID()); err == nil && found != "" {
				name = found
				_, _ = c.kubectl(context.Background(), "delete", "node", name)
			}
			_, _ = c.kubectl(context.Background(), "delete", "pods", "--all-namespaces", "--force",
				"--grace-period=0", "--field-selector", "spec.nodeName="+name)
		}
	})
	// The status the test checks is this autoscaler's, not one an earlier test's left in kube-system.
	if _, err := c.kubectl(ctx, "-n", "kube-system", "delete", "configmap", "cluster-autoscaler-status",
		"--ignore-not-found"); err != nil {
		t.Fatal(err)
	}
	b.ca = startAutoscaler(ctx, t, c, s, b.aws, b.aws.users[s.userName])
	args, _ := liveController(ctx, t, c)
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "kube-system", "delete", "lease", addons.ControllerName,
			"--ignore-not-found")
	})
	// The addons the test applies declare no gateway (the whole stack does: its golden Deployment has the wake-up's
	// flags); the controller is given moto's gateway and groups.
	set := []string{"--loops=untaint,cleanup,wake", "--wake-gateway=" + b.vpc.gatewayID,
		"--wake-groups=" + strings.Join(slices.Sorted(maps.Keys(s.groups)), ",")}
	if opts.nodeWakeOnly {
		set = []string{"--loops=untaint,cleanup"}
	}
	b.ctl = startController(ctx, t, c, controllerSpec{args: args, identity: "e2e-burst",
		set: append(set, "--not-ready-after="+burstCleanupThreshold.String()),
		ec2: b.aws.url, ssm: b.aws.url, ec2Key: b.aws.users[s.cleanupUser]})
	if opts.warm != "" {
		b.launcher.prepareWarm(ctx, t, opts.warm)
	}
	return b
}

// scaleUp is the loop up to the build pod's success, phase by phase; each wait also runs the launcher and reads the
// autoscaler's status, but for the phases on the registered node, which poll the API alone and faster.
func (b *burst) scaleUp(t *testing.T) {
	t.Helper()
	ctx, c := b.ctx, b.c
	round, prev := b.rounds, b.box
	b.rounds++
	pod := "e2e-burst-build"
	var operator *operatorTimeline
	if round > 0 {
		// A scale-up after the first: its own pod and phases, without the operator's timeline.
		pod = fmt.Sprintf("%s-%d", pod, round+1)
		b.phases.log(t)
		b.phases = &phaseLog{}
	}
	if b.opts.awake {
		b.wakeGatewayFirst(t)
	}
	handshake := b.latestHandshake() // before anything wakes the gateway
	b.midLoop(t)
	createBuildPod(ctx, t, c, pod, b.pool, round)
	b.phases.start()
	warm := b.launcher.warm
	if round == 0 && b.opts.timeline {
		operator = b.startTimeline(t)
	}

	// The scheduler's verdict first: the autoscaler acts on pods the scheduler has marked unschedulable.
	b.waitFast(t, time.Minute, "pod unschedulable", func() bool { return podUnschedulable(ctx, b.client, pod) })
	b.wait(t, 2*time.Minute, "scale-up decision", func() bool {
		return b.aws.desired(ctx, t)[b.group] == 1
	})
	d := b.aws.desired(ctx, t)
	for name, n := range d {
		if name != b.group && n != 0 {
			t.Errorf("group %s raised to %d too", name, n)
		}
	}
	explainAgrees(ctx, t, c, b.s, pod, b.group)
	var box *boxNode
	b.wait(t, time.Minute, "instance booting", func() bool {
		box = b.launcher.only(prev)
		return box != nil
	})
	if !b.opts.awake {
		b.wait(t, 2*time.Minute, "gateway woken", func() bool { return b.launcher.gatewayBooted })
		// A hang's bound, not a speed target: on-prem's own handshake after a wake, where the gateway's dial
		// failed, can take over two minutes (node/internal/gateway/peer.go).
		b.wait(t, 4*time.Minute, "tunnel up", b.tunnelUp(handshake))
		b.checkWokenBy(t)
	}
	var node string
	// A hang's bound, not a speed target.
	b.wait(t, 3*time.Minute, "Node registered", func() bool {
		node, _ = findNode(ctx, c, box.providerID())
		return node != ""
	})
	b.box = box
	kn, err := getNode(ctx, c, node)
	assert.NilError(t, err)
	if !kn.hasTaint(kube.FuseStartupTaint.Key) {
		t.Errorf("Node %s registered without the startup taint %s: %+v", node, kube.FuseStartupTaint.Key, kn.Spec.Taints)
	}
	nodes, pods := b.client.CoreV1().Nodes(), b.client.CoreV1().Pods("")
	var n *corev1.Node
	getN := func() bool {
		n, err = nodes.Get(ctx, node, metav1.GetOptions{})
		return err == nil
	}
	b.waitFast(t, 2*time.Minute, "Node Ready", func() bool { return getN() && nodeReady(n) })
	b.waitFast(t, 2*time.Minute, "fuse plugin Running", func() bool {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		return err == nil && slices.ContainsFunc(list.Items, func(p corev1.Pod) bool {
			return strings.HasPrefix(p.Name, "fuse-device-plugin-") && p.Status.Phase == corev1.PodRunning
		})
	})
	b.waitFast(t, 2*time.Minute, "fuse advertised", func() bool {
		if !getN() {
			return false
		}
		q, ok := n.Status.Allocatable[fuseResource]
		return ok && !q.IsZero()
	})
	b.waitFast(t, time.Minute, "untainted", func() bool {
		return getN() && !slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool {
			return tt.Key == kube.FuseStartupTaint.Key
		})
	})
	b.ctl.waitLine(t, 10*time.Second, "removed the startup taint", map[string]string{"node": node})
	var p *corev1.Pod
	getP := func() bool {
		p, err = b.client.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		return err == nil
	}
	b.waitFast(t, 2*time.Minute, "pod scheduled", func() bool { return getP() && p.Spec.NodeName != "" })
	b.waitFast(t, 2*time.Minute, "pod Running", func() bool {
		return getP() && (p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded)
	})
	if p.Spec.NodeName != node {
		t.Errorf("pod %s ran on %q, want the new node %s", pod, p.Spec.NodeName, node)
	}
	if operator != nil {
		operator.wait(t)
	}
	b.wait(t, 2*time.Minute, "pod Succeeded", func() bool {
		if !getP() {
			return false
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %+v", pod, p.Status)
		}
		return p.Status.Phase == corev1.PodSucceeded
	})
	b.node = node
	if b.pool.Cache != nil {
		b.checkCache(t, kn, p, prev)
	}
	if warm != nil {
		if box != warm.node {
			t.Errorf("the scale-up's node is %s's, not the warm instance %s's", box.id, warm.node.id)
		}
		// The join completes the action the group held the instance in as it left the warm pool (the first was
		// the prepare's).
		if err := box.wait(ctx, time.Minute, "lifecycle action completed", func(context.Context) bool {
			return warm.asg.Completed("CONTINUE") == 2
		}); err != nil {
			t.Errorf("%v:\n%s", err, strings.Join(warm.asg.Calls(), "\n"))
		}
	}
}

// checkCache checks the node's build cache after its build: the Node says it has one, the box has the one volume
// attached, and the build found each earlier round's line, the last naming the node before.
func (b *burst) checkCache(t *testing.T, kn kubeNode, p *corev1.Pod, prev *boxNode) {
	t.Helper()
	if kn.Metadata.Labels[kube.LabelCache] != "true" {
		t.Errorf("Node %s registered without %s=true: %v", kn.Metadata.Name, kube.LabelCache, kn.Metadata.Labels)
	}
	bb := b.box.cur
	bb.volumesMu.Lock()
	vols := slices.Collect(maps.Keys(bb.volumes))
	bb.volumesMu.Unlock()
	if len(vols) != 1 {
		t.Fatalf("the box of %s has volumes %v attached, want its build cache", b.box.id, vols)
	}
	b.cacheVolume = vols[0]
	var msg string
	if st := p.Status.ContainerStatuses; len(st) == 1 && st[0].State.Terminated != nil {
		msg = st[0].State.Terminated.Message
	}
	want := fmt.Sprintf("cache: %d earlier builds", b.rounds-1)
	if !strings.HasPrefix(msg, want) || (prev != nil && !strings.Contains(msg, b.nodeNames[prev.id])) {
		t.Errorf("the build says %q, want %q and the node before", msg, want)
	}
	if b.nodeNames == nil {
		b.nodeNames = map[string]string{}
	}
	b.nodeNames[b.box.id] = kn.Metadata.Name
	// The agent's own account: the first node made the volume, the next found it as the first left it.
	journal, err := b.box.exec(b.ctx, "journalctl", "-o", "cat", "--no-pager")
	assert.NilError(t, err)
	var lines []string
	for line := range strings.Lines(journal) {
		if strings.Contains(line, "cache: ") || strings.Contains(line, "phase=cache ") {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	state := "new"
	if b.rounds > 1 {
		state = "as it was"
	}
	want = fmt.Sprintf("cache: volume %s (", b.cacheVolume)
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.Contains(l, want) && strings.HasSuffix(l, ", "+state)
	}) {
		t.Errorf("the agent's journal has no line %q...%q: %q", want, state, lines)
	}
	t.Logf("build cache: volume %s; the build says %q; the agent:\n%s", b.cacheVolume, msg, strings.Join(lines, "\n"))
}

// backToZero is the rest of the loop, after scaleUp: the idle node is scaled in, its Node deleted, and the gateway
// goes back to sleep.
func (b *burst) backToZero(t *testing.T) {
	t.Helper()
	ctx, c, box, node := b.ctx, b.c, b.box, b.node
	b.phases.mark("idle")

	b.wait(t, 3*time.Minute, "instance terminated", func() bool {
		st := b.aws.ec2Instances(ctx, t)[box.id].State
		return st == "terminated" || st == "shutting-down"
	})
	if log := b.ca.logs.String(); !strings.Contains(log, "Terminating EC2 instance: "+box.id) {
		t.Errorf("no TerminateInstanceInAutoScalingGroup activity for %s in the autoscaler log", box.id)
	}
	b.wait(t, 2*time.Minute, "box powered off", func() bool { return !box.running() })
	b.wait(t, 3*time.Minute, "Node deleted", func() bool {
		name, err := findNode(ctx, c, box.providerID())
		return err == nil && name == ""
	})
	b.ctl.waitLine(t, 10*time.Second, "delete", map[string]string{"node": node})
	if d := b.aws.desired(ctx, t); !allZero(d) {
		t.Errorf("desired capacities %v at the end, want all 0", d)
	}
	if left := poolNodes(ctx, t, c); len(left) > 0 {
		t.Errorf("Nodes of a pool left: %v", left)
	}
	b.backToSleep(t)
	for id, inst := range b.aws.ec2Instances(ctx, t) {
		if inst.State == "running" || inst.State == "pending" {
			t.Errorf("instance %s still %s in moto at the end", id, inst.State)
		}
	}
}

// operatorTimeline is cmd/timeline run beside the build, as an operator would run it during a burst: its own
// pending pod (the pause image, one fuse device, the pool's taints tolerated) aimed at the same pool, watched with
// nothing but the API, until it runs on the new node.
type operatorTimeline struct {
	out  *nodetest.SyncBuffer
	done chan struct{}
	tr   *timeline.Tracker
	err  error
}

func (b *burst) startTimeline(t *testing.T) *operatorTimeline {
	t.Helper()
	o := &operatorTimeline{out: &nodetest.SyncBuffer{}, done: make(chan struct{})}
	opts := timeline.Options{Namespace: "default", Pool: b.pool.Name, Taints: b.pool.Taints, Fuse: true,
		Image: renderedPauseImage(t, b.launcher.join.userData), Limit: 5 * time.Minute}
	client := clientFor(t, b.c)
	go func() {
		defer close(o.done)
		o.tr, o.err = timeline.Run(b.ctx, client, opts, o.out)
	}()
	return o
}

// wait waits for the timeline to end and fails the test unless its pod ran, logging what it printed.
func (o *operatorTimeline) wait(t *testing.T) {
	t.Helper()
	<-o.done
	t.Logf("cmd/timeline beside the build:\n%s", o.out.String())
	if o.err != nil || o.tr == nil || !o.tr.Done() {
		t.Errorf("cmd/timeline's pod did not run: %v", o.err)
	}
}

// backToSleep waits for the gateway's idle check to stop the gateway once the pool's instance is gone, and checks it
// did not before gateway.idleStop had passed: its window opens at the last check that saw the instance running, at
// most one timer period (OnUnitActiveSec=1min plus AccuracySec) before the instance was terminated.
func (b *burst) backToSleep(t *testing.T) {
	t.Helper()
	const checkPeriod = 80 * time.Second
	b.wait(t, config.MinIdleStop+checkPeriod+2*time.Minute, "gateway stopped", func() bool {
		return b.aws.ec2Instances(b.ctx, t)[b.vpc.gatewayID].State == "stopped"
	})
	terminated, _ := b.phases.when("instance terminated")
	stopped, _ := b.phases.when("gateway stopped")
	if after := terminated - stopped; after < config.MinIdleStop-checkPeriod {
		t.Errorf("the gateway stopped %s after the pool's instance was terminated, before gateway.idleStop (%s) "+
			"less one check could have passed", after, config.MinIdleStop)
	}
	journal := b.vpc.gateway.journal(b.ctx, t, "-u", "dynk8s-gateway-idle.service")
	// Whether a check saw the pool's instance running depends on the timer's phase (the node may be gone before the
	// first check, a minute after the gateway's boot); the node's traffic through the tunnel it saw either way.
	for _, want := range []string{"staying up: packets forwarded through wg0", "staying up: idle for",
		"stopping: idle for"} {
		if !strings.Contains(journal, want) {
			t.Errorf("the idle check never logged %q; its journal:\n%s", want, journal)
		}
	}
}

// latestHandshake is the on-prem peer's latest handshake with the gateway (wg's seconds since the epoch; 0: none).
// It outlives the gateway's boot: a sleeping gateway's last handshake is still there when it wakes.
func (b *burst) latestHandshake() int64 { return b.vpc.gateway.tn.latestHandshake(b.ctx) }

// tunnelUp is a wait's check that the on-prem peer has had a handshake after since (a latestHandshake read before
// the gateway was woken): a second scale-up's gateway wakes with the first one's handshake on record.
func (b *burst) tunnelUp(since int64) func() bool {
	return func() bool { return b.latestHandshake() > since }
}

// wakeGatewayFirst starts the gateway (as a burst shortly before would have) and waits for its box and the tunnel.
func (b *burst) wakeGatewayFirst(t *testing.T) {
	t.Helper()
	since := b.latestHandshake()
	b.aws.startInstance(b.ctx, t, b.vpc.gatewayID)
	up := b.tunnelUp(since)
	b.wait(t, 3*time.Minute, "gateway awake beforehand", func() bool { return b.launcher.gatewayBooted && up() })
	b.phases = &phaseLog{}
}

// checkWokenBy checks who started the gateway: the controller at the scale-up decision, or with its wake loop off,
// the node's boot.
func (b *burst) checkWokenBy(t *testing.T) {
	t.Helper()
	if b.opts.nodeWakeOnly {
		if strings.Contains(b.ctl.log(), "woke the gateway") {
			t.Errorf("the controller woke the gateway with its wake loop off:\n%s", tail(b.ctl.log(), 20))
		}
		return
	}
	b.ctl.waitLine(t, 10*time.Second, "woke the gateway", map[string]string{"gateway": b.vpc.gatewayID})
}

// waitFast polls cond every 100 ms, without the launcher or the autoscaler's status (nothing is launched once the
// Node has registered), until cond holds (the phase is logged) or timeout: the phases on the node are seconds
// apart, and the launcher's own round trip would blur them.
func (b *burst) waitFast(t *testing.T, timeout time.Duration, phase string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			t.Fatalf("%s: not after %s; autoscaler log:\n%s", phase, timeout, tail(b.ca.logs.String(), 60))
		}
	}
	b.phases.mark(phase)
}

// midLoop returns half a scan interval after the autoscaler's next loop has ended (it writes its status ConfigMap
// at each loop's end and waits the interval before the next). A build pod comes at any moment of the autoscaler's
// loop, so its decision waits half an interval on average: created at once, the pod met the autoscaler where the test
// before it happened to leave it (the asleep variants right after a fresh autoscaler's first loop, at the worst
// phase: 3.0 s to the decision in every run, against 0.8-2.5 s awake). A hang's bound on the wait.
func (b *burst) midLoop(t *testing.T) {
	t.Helper()
	version := func() string {
		cm, err := b.client.CoreV1().ConfigMaps("kube-system").Get(b.ctx, "cluster-autoscaler-status", metav1.GetOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) {
				t.Fatalf("the autoscaler's status: %v", err)
			}
			return ""
		}
		return cm.ResourceVersion
	}
	before := version()
	for deadline := time.Now().Add(2 * time.Minute); version() == before; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			t.Fatalf("the autoscaler ended no loop in 2 minutes; its log:\n%s", tail(b.ca.logs.String(), 40))
		}
	}
	time.Sleep(*testScanInterval / 2)
}

// podUnschedulable says whether the scheduler has marked the pod unschedulable (PodScheduled False, reason
// Unschedulable), which is what the autoscaler looks for.
func podUnschedulable(ctx context.Context, client kubernetes.Interface, name string) bool {
	p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// nodeReady says whether n's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	_, c := nodeutil.GetNodeCondition(&n.Status, corev1.NodeReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// wait polls cond every half second, running the launcher and checking the autoscaler's status each time, until
// cond holds (the phase is logged) or timeout. The launcher plays EC2's launch, so its turn bounds how late a box
// boots after moto has the instance: half a second, with the calls it makes to moto through the AWS SDK (a Python
// process importing boto3 would add half a second to each).
func (b *burst) wait(t *testing.T, timeout time.Duration, phase string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b.launcher.sync(b.ctx, t)
		b.checkStatus(t)
		if cond() {
			b.phases.mark(phase)
			return
		}
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			t.Fatalf("%s: not after %s; autoscaler log:\n%s", phase, timeout, tail(b.ca.logs.String(), 60))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// autoscalerStatus is the part of the autoscaler's status ConfigMap (kube-system/cluster-autoscaler-status, YAML
// since 1.30: clusterautoscaler/status/status.go ClusterAutoscalerStatus) the test reads.
type autoscalerStatus struct {
	NodeGroups []struct {
		Name   string `json:"name"`
		Health struct {
			Status     string `json:"status"`
			NodeCounts struct {
				Registered struct {
					Total int `json:"total"`
				} `json:"registered"`
				LongUnregistered int `json:"longUnregistered"`
				Unregistered     int `json:"unregistered"`
			} `json:"nodeCounts"`
		} `json:"health"`
		ScaleUp struct {
			Status      string `json:"status"`
			BackoffInfo struct {
				ErrorCode string `json:"errorCode"`
			} `json:"backoffInfo"`
		} `json:"scaleUp"`
	} `json:"nodeGroups"`
}

// checkStatus fails the test when the autoscaler's status shows the group backed off or an instance of it long
// unregistered, or, some scans after the instance's Node has registered, an instance of it unregistered: the
// autoscaler did not match the Node to the instance by provider ID, and would delete it after maxNodeProvisionTime.
func (b *burst) checkStatus(t *testing.T) {
	t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := b.c.getJSON(b.ctx, &cm, "configmap", "-n", "kube-system", "cluster-autoscaler-status"); err != nil {
		return // not written yet
	}
	var st autoscalerStatus
	if err := yaml.Unmarshal([]byte(cm.Data["status"]), &st); err != nil {
		t.Fatalf("autoscaler status: %v\n%s", err, cm.Data["status"])
	}
	ago, registered := b.phases.when("Node registered")
	registered = registered && ago > statusSettle
	for _, g := range st.NodeGroups {
		if g.Name != b.group {
			continue
		}
		h := g.Health.NodeCounts
		switch {
		case g.ScaleUp.Status == "Backoff" || g.ScaleUp.BackoffInfo.ErrorCode != "":
			t.Fatalf("the autoscaler backed the group off:\n%s", cm.Data["status"])
		case h.LongUnregistered > 0:
			t.Fatalf("the autoscaler counts an instance long unregistered:\n%s", cm.Data["status"])
		case registered && h.Unregistered > 0:
			t.Fatalf("the Node registered, and the autoscaler counts an instance of the group unregistered:\n%s",
				cm.Data["status"])
		}
	}
}

// statusSettle is how long after a change the test gives the autoscaler's status to show it: a few of its scans
// (--scan-interval, 2 s: startAutoscaler).
const statusSettle = 10 * time.Second

// phaseLog records when each phase was first seen, from the build pod's creation.
type phaseLog struct {
	t0    time.Time
	names []string
	at    []time.Duration
}

func (p *phaseLog) start() { p.t0 = time.Now() }

// when is how long ago the phase was first seen; false if it has not been.
func (p *phaseLog) when(name string) (time.Duration, bool) {
	i := slices.Index(p.names, name)
	if i < 0 {
		return 0, false
	}
	return time.Since(p.t0) - p.at[i], true
}

func (p *phaseLog) mark(name string) {
	p.names = append(p.names, name)
	p.at = append(p.at, time.Since(p.t0))
}

// log prints the phases as cmd/timeline does: seconds since the pod was created, and since the phase before.
func (p *phaseLog) log(t *testing.T) {
	t.Helper()
	var b strings.Builder
	var prev time.Duration
	for i, n := range p.names {
		fmt.Fprintf(&b, "%+8.1fs (%+6.1fs)  %s\n", p.at[i].Seconds(), (p.at[i] - prev).Seconds(), n)
		prev = p.at[i]
	}
	t.Logf("burst phases, from the build pod's creation:\n%s", b.String())
}

// hostArchPool is the dev stack's pool of this machine's architecture: the box runs this machine's kubelet, which
// labels the Node with its own architecture.
func hostArchPool(t *testing.T, cfg *config.Config) config.NodePool {
	t.Helper()
	for _, p := range cfg.NodePools {
		if p.Arch.Label() == runtime.GOARCH {
			return p
		}
	}
	t.Fatalf("the dev stack has no pool of this machine's architecture %s", runtime.GOARCH)
	return config.NodePool{}
}

// startScheduler runs the real kube-scheduler against the control plane for this test (hack/start-kube.sh runs none,
// so that the other tests' pods stay Pending). DYNK8S_E2E_SCHEDULER_V sets its log level (4: each pod's moves
// between its queues, and why), for a run that looks at where a pod waits; its log is kept under DYNK8S_E2E_DIR.
func startScheduler(t *testing.T, c cluster) {
	t.Helper()
	args := []string{"--kubeconfig=" + c.Kubeconfig, "--authentication-kubeconfig=" + c.Kubeconfig,
		"--authorization-kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"}
	if v := os.Getenv("DYNK8S_E2E_SCHEDULER_V"); v != "" {
		args = append(args, "--v="+v)
	}
	cmd := exec.Command("kube-scheduler", args...)
	logs := &nodetest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stopOnCleanup(t, "kube-scheduler", cmd, logs)
}

// onPremNode registers the on-prem cluster's own node for the test, as kubeadm registers a control-plane node (its
// role label and NoSchedule taint; no kubelet runs for it, so it turns unreachable), and deletes it at the end.
// Every cluster dynk8s grows has nodes of its own, and the scheduler needs one to judge a pending pod by: in a
// cluster with none it ends each attempt with "no nodes are registered to the cluster", an error that no plugin
// rejected, so no Node event requeues the pod and it is tried again only at its backoff's end (at 1, 4, 9, 18 and
// 35 s from its creation, seen with kube-scheduler --v=5), whenever the pool's node became Ready and untainted. With
// a node that rejects it, the pod waits for the events of the node it fits.
func onPremNode(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	t.Helper()
	const name = "e2e-onprem-cp-1"
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: runtime.GOARCH,
			"node-role.kubernetes.io/control-plane": ""}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane",
			Effect: corev1.TaintEffectNoSchedule}}},
	}
	// One an interrupted run left goes first.
	if err := client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	_, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	assert.NilError(t, err, "the on-prem node")
	t.Cleanup(func() {
		err := client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
		assert.Check(t, err, "deleting the on-prem node")
	})
}

// buildHold is how long the build pod stays up after its work (testdata/images/build): longer than the kubelet's
// relist period (1 s), so that the pod is reported Running as a real build's is, not Pending until it has Succeeded.
const buildHold = 3 * time.Second

// createBuildPod creates the build pod of a pool: it runs the build image, asks for one fuse device and ephemeral
// storage, and selects this machine's architecture (the dev stack's other pool is arm64); it is deleted when the test
// ends. With the pool's build cache, the pod mounts a directory of it and wants at least earlier builds' lines there
// (testdata/images/build).
func createBuildPod(ctx context.Context, t *testing.T, c cluster, name string, pool config.NodePool, earlier int) {
	t.Helper()
	requests := map[string]string{"cpu": "100m", "memory": "64Mi", ephemeralStorage: "1Gi", fuseResource: "1"}
	var tolerations []map[string]string
	for _, tt := range pool.Taints {
		tolerations = append(tolerations, map[string]string{"key": tt.Key, "operator": "Equal", "value": tt.Value,
			"effect": string(tt.Effect)})
	}
	env := []map[string]any{{"name": "BUILD_DIR", "value": "/work"}, {"name": "BUILD_HOLD", "value": buildHold.String()}}
	mounts := []map[string]string{{"name": "work", "mountPath": "/work"}}
	volumes := []map[string]any{{"name": "work", "emptyDir": map[string]any{}}}
	if pool.Cache != nil {
		// As the Jenkins kit's templates mount it (docs/jenkins): a hostPath directory under the cache's mount.
		env = append(env, map[string]any{"name": "CACHE_DIR", "value": "/cache"},
			map[string]any{"name": "CACHE_WANT", "value": fmt.Sprint(earlier)},
			map[string]any{"name": "NODE_NAME", "valueFrom": map[string]any{
				"fieldRef": map[string]string{"fieldPath": "spec.nodeName"}}})
		mounts = append(mounts, map[string]string{"name": "cache", "mountPath": "/cache"})
		volumes = append(volumes, map[string]any{"name": "cache", "hostPath": map[string]string{
			"path": pool.Cache.MountPath + "/e2e-build", "type": "DirectoryOrCreate"}})
	}
	applyJSON(ctx, t, c, map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec": map[string]any{
			"restartPolicy": "Never",
			"nodeSelector":  map[string]string{kube.LabelArch: pool.Arch.Label(), kube.LabelPool: pool.Name},
			"tolerations":   tolerations,
			"containers": []map[string]any{{
				"name": "build", "image": buildImage, "env": env,
				"resources":    map[string]any{"requests": requests, "limits": map[string]string{fuseResource: "1"}},
				"volumeMounts": mounts,
			}},
			"volumes": volumes,
		},
	})
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "default", "delete", "pod", name, "--ignore-not-found",
			"--wait=false")
	})
}

// buildImage is the build pod's image (the test's own).
const buildImage = "e2e.dynk8s.invalid/build:1"

// getNode reads a Node afresh (decoding into a used struct would keep fields the new JSON lacks).
func getNode(ctx context.Context, c cluster, name string) (kubeNode, error) {
	var n kubeNode
	err := c.getJSON(ctx, &n, "node", name)
	return n, err
}

// poolNodes are the Nodes that carry a pool label.
func poolNodes(ctx context.Context, t *testing.T, c cluster) []string {
	t.Helper()
	out, err := c.kubectl(ctx, "get", "nodes", "-l", kube.LabelPool, "-o", "name")
	assert.NilError(t, err)
	return strings.Fields(out)
}

// burstImages builds the images of the pods a node of the pool runs (see the top of this file), reading their names
// from the live fuse DaemonSet the addons made and from the rendered CRI-O config, and writes them as archives.
func burstImages(ctx context.Context, t *testing.T, c cluster, j *boxJoin) []string {
	t.Helper()
	dir := t.TempDir()
	var ds struct {
		Spec struct {
			Template struct {
				Spec templateSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	assert.NilError(t, c.getJSON(ctx, &ds, "daemonset", "-n", "kube-system", "fuse-device-plugin-"+j.pool.Arch.Label()), "the fuse DaemonSet of %s", j.pool.Arch.Label())
	images := []podImage{
		{ref: renderedPauseImage(t, j.userData), entrypoint: []string{"/pause"},
			files: map[string]string{"/pause": staticBinary(t, "./testdata/images/pause", dir)}},
		{ref: buildImage, entrypoint: []string{"/build"},
			files: map[string]string{"/build": staticBinary(t, "./testdata/images/build", dir)}},
	}
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		switch {
		case len(ctr.Command) == 1 && filepath.Base(ctr.Command[0]) == "fuse-device-plugin":
			images = append(images, podImage{ref: ctr.Image,
				files: map[string]string{ctr.Command[0]: requireTool(t, "fuse-device-plugin")}})
		default:
			t.Fatalf("the fuse DaemonSet runs a container the test has no image for: %s %q", ctr.Image, ctr.Command)
		}
	}
	var archives []string
	for i, img := range images {
		file := filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		img.archive(t, file)
		archives = append(archives, file)
	}
	return archives
}

// runsPods makes the box able to run pods from the image archives: they are imported into its runtime before its
// kubelet starts (testdata/box/dynk8s-box-images.service), the runtime's sandbox image is the one the rendered CRI-O config
// names, the host's /dev/fuse is the box's, and the kubernetes Service's address leads to the API server: through
// the tunnel in a VPC with a gateway, else through a forwarder on the instance's address (a pod cannot be sent to
// the box's loopback).
func (n *boxNode) runsPods(t *testing.T, archives []string) {
	t.Helper()
	for i, a := range archives {
		content, err := os.ReadFile(a)
		assert.NilError(t, err)
		n.writeFile(t, fmt.Sprintf("/opt/dynk8s-box/images/%02d.tar", i), content, 0o644)
	}
	conf := n.file(t, "/opt/dynk8s-box/containerd.toml")
	const anchor = "  restrict_oom_score_adj = true\n"
	if !strings.Contains(conf, anchor) {
		t.Fatalf("the box's containerd.toml has no %q", anchor)
	}
	conf = strings.Replace(conf, anchor, anchor+"  sandbox_image = \""+renderedPauseImage(t, n.userData)+"\"\n", 1)
	n.writeFile(t, "/opt/dynk8s-box/containerd.toml", []byte(conf), 0o644)
	for _, f := range []struct{ name, path string }{
		{"90-box-pods.conf", "/etc/systemd/system/crio.service.d/90-box-pods.conf"},
		{"dynk8s-box-images.service", "/etc/systemd/system/dynk8s-box-images.service"},
	} {
		content, err := os.ReadFile(filepath.Join("testdata", "box", f.name))
		assert.NilError(t, err)
		n.writeFile(t, f.path, content, 0o644)
	}
	var api string
	if n.vpc != nil {
		api = n.vpc.api.String() // on-prem, through the tunnel, as kube-proxy would send it to the endpoint
	} else {
		_, port, err := splitHostPort(strings.TrimPrefix(n.c.Server, "https://"))
		assert.NilError(t, err)
		api = fmt.Sprintf("%s:%d", n.ip, port)
		forwardIntoNetnsFile(t, n.netns, api, strings.TrimPrefix(n.c.Server, "https://"))
	}
	// The pods' traffic leaves the node masqueraded, as the stack requires of a CNI whose pod addresses the VPC and
	// on-prem do not route (README, the CNI section); the box's bridge (testdata/box/10-box-bridge.conflist) does not.
	n.writeFile(t, "/etc/dynk8s-box/services.nft", []byte(fmt.Sprintf(`table ip dynk8s_box_services {
	chain prerouting {
		type nat hook prerouting priority dstnat;
		ip daddr %s tcp dport 443 dnat to %s
	}
	chain postrouting {
		type nat hook postrouting priority srcnat;
		oifname "eth0" ip saddr %s masquerade
	}
}
`, kubernetesServiceIP, api, boxPodRange)), 0o644)
	n.binds = append(n.binds, "--bind=/dev/fuse")
}

// renderedPauseImage is the sandbox image the pool's rendered CRI-O drop-in names.
func renderedPauseImage(t *testing.T, userData []byte) string {
	t.Helper()
	var crio struct {
		Crio struct {
			Image struct {
				PauseImage string `toml:"pause_image"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	if _, err := toml.Decode(userDataFile(t, userData, "/etc/crio/crio.conf.d/90-dynk8s.conf"), &crio); err != nil {
		t.Fatal(err)
	}
	if crio.Crio.Image.PauseImage == "" {
		t.Fatal("the rendered CRI-O drop-in names no pause_image")
	}
	return crio.Crio.Image.PauseImage
}

// boxPodRange is the pod addresses of a box's bridge (testdata/box/10-box-bridge.conflist).
const boxPodRange = "10.244.0.0/24"

// kubernetesServiceIP is the kubernetes Service's address: the first of hack/start-kube.sh's service range.
const kubernetesServiceIP = "10.96.0.1"

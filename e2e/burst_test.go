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
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optdestroy"
	"github.com/pulumi/pulumi/sdk/v3/go/auto/optup"
	"sigs.k8s.io/yaml"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// The burst, end to end: a build pod that no node can run makes the real Cluster Autoscaler raise the group of the
// pool it needs, the instance moto starts boots in a box (the launcher below plays EC2), joins, registers with the
// fuse startup taint, the real fuse device plugin (deployed by the addons through the real engine) advertises
// github.com/fuse, the untaint container lifts the taint, the real kube-scheduler binds the pod and the real kubelet
// runs it to Succeeded; the idle node is then scaled in through the group, its box powers off, the rendered cleanup
// script deletes its Node once moto reports the instance gone, and nothing of the pool is left.
//
// Images (none can be pulled here; see images_test.go), each tagged as the stack names it:
//   - the sandbox image the rendered CRI-O config names (registry.k8s.io/pause): a rebuilt stand-in,
//     testdata/images/pause, a static Go program doing what upstream's pause.c does;
//   - the fuse DaemonSet's plugin image (docker.io/soolaugust/fuse-device-plugin): the real plugin,
//     github.com/kuberenetes-learning-group/fuse-device-plugin at 014e1c4 (hack/tools.sh), its binary alone at
//     the path the DaemonSet runs, where upstream's image has it on debian:stretch-slim;
//   - the untaint container's image (docker.io/alpine/k8s): a stand-in holding what untaint.sh calls, this
//     machine's /bin/sh, sed, date and sleep and the kubectl hack/tools.sh built, with their shared libraries;
//   - the build pod's image, the test's own: testdata/images/build, a static Go program.
//
// What stands in, besides the box's own (box_test.go): the box reaches the API server through the test's forwarder,
// not through the gateway's tunnel (the tunnel tests and the gateway's box prove that path, not with a node behind
// it); the kubernetes Service's address is translated to that forwarder by a box-only nftables rule, where a cluster
// has kube-proxy or its CNI; the node's SSM is a moto of its own (the join reads the token with the instance role's
// key, which the IAM-enforcing moto of the autoscaler does not know); the stale-node cleanup runs its rendered
// script from the test, as its CronJob would on an on-prem node (none runs here), with a shorter NotReady threshold.
// The gateway's wake-up and idle stop are not part of this loop (the gateway's box test proves the idle stop).

// burstCleanupThreshold is the NotReady seconds after which the test's cleanup runs delete a Node whose instance is
// gone (the dev stack's cleanup.notReadyAfter: 30 minutes).
const burstCleanupThreshold = "5"

// TestBurstScaleUpAndBackToZero runs the whole loop once and logs each phase's seconds since the build pod was
// created.
func TestBurstScaleUpAndBackToZero(t *testing.T) {
	newBurst(t).run(t)
}

// burst is the loop's world: the control plane with a scheduler, the addons, moto with the stack replayed, the
// autoscaler, and the launcher that boots the group's instances.
type burst struct {
	ctx      context.Context
	c        cluster
	s        stackAutoscaling
	pool     config.NodePool
	group    string
	aws      *awsEnv
	ca       *autoscalerProcess
	launcher *launcher
	phases   *phaseLog
}

func newBurst(t *testing.T) *burst {
	t.Helper()
	c := requireCluster(t)
	requireTool(t, "kube-scheduler")
	requireTool(t, "aws")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	keepEtcKubernetesClean(t)
	cfg := devConfig(t)
	pool := hostArchPool(t, cfg)
	s := loadStackAutoscaling(t)
	b := &burst{ctx: ctx, c: c, s: s, pool: pool, group: s.poolGroup(t, pool.Name), phases: &phaseLog{}}
	t.Cleanup(func() { b.phases.log(t) })

	applyAddons(ctx, t, c, cfg)
	startScheduler(t, c)
	b.aws = startAWS(ctx, t, s, []replayUser{{Name: s.userName, Policy: s.policy},
		{Name: s.cleanupUser, Policy: s.cleanupPolicy}})
	j := newBoxJoin(ctx, t, c, cfg, pool, "")
	b.launcher = newLauncher(t, b.aws, j, b.group, burstImages(ctx, t, c, j))
	// Before the addons' destroy: the pods bound to the boxes' Nodes, which no kubelet will confirm gone once the
	// Node is. The pod GC would delete them only after its quarantine, and a DaemonSet being deleted waits for its
	// pods, so the next test's addons would meet it still there.
	t.Cleanup(func() {
		for _, n := range b.launcher.boxes {
			_, _ = c.kubectl(context.Background(), "delete", "pods", "--all-namespaces", "--force",
				"--grace-period=0", "--field-selector", "spec.nodeName="+n.hostname())
		}
	})
	// The status the test checks is this autoscaler's, not one an earlier test's left in kube-system.
	if _, err := c.kubectl(ctx, "-n", "kube-system", "delete", "configmap", "cluster-autoscaler-status",
		"--ignore-not-found"); err != nil {
		t.Fatal(err)
	}
	b.ca = startAutoscaler(ctx, t, c, s, b.aws, b.aws.users[s.userName])
	return b
}

// run is the loop, phase by phase; each wait also runs the launcher and reads the autoscaler's status.
func (b *burst) run(t *testing.T) {
	t.Helper()
	ctx, c := b.ctx, b.c
	pod := "e2e-burst-build"
	createBuildPod(ctx, t, c, pod, b.pool)
	b.phases.start()

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
		box = b.launcher.only()
		return box != nil
	})
	var node string
	b.wait(t, 3*time.Minute, "Node registered", func() bool {
		node, _ = findNode(ctx, c, box.providerID())
		return node != ""
	})
	kn, err := getNode(ctx, c, node)
	if err != nil {
		t.Fatal(err)
	}
	if !kn.hasTaint(kube.FuseStartupTaint.Key) {
		t.Errorf("Node %s registered without the startup taint %s: %+v", node, kube.FuseStartupTaint.Key, kn.Spec.Taints)
	}
	b.wait(t, 2*time.Minute, "Node Ready", func() bool {
		kn, err = getNode(ctx, c, node)
		return err == nil && kn.ready()
	})
	b.wait(t, 2*time.Minute, "fuse advertised", func() bool {
		kn, err = getNode(ctx, c, node)
		return err == nil && kn.Status.Allocatable[fuseResource] != "" && kn.Status.Allocatable[fuseResource] != "0"
	})
	b.wait(t, time.Minute, "untainted", func() bool {
		kn, err = getNode(ctx, c, node)
		return err == nil && !kn.hasTaint(kube.FuseStartupTaint.Key)
	})
	var p podState
	b.wait(t, 2*time.Minute, "pod Running", func() bool {
		p = getPod(ctx, c, pod)
		return p.Status.Phase == "Running" || p.Status.Phase == "Succeeded"
	})
	if p.Spec.NodeName != node {
		t.Errorf("pod %s ran on %q, want the new node %s", pod, p.Spec.NodeName, node)
	}
	b.wait(t, 2*time.Minute, "pod Succeeded", func() bool {
		p = getPod(ctx, c, pod)
		if p.Status.Phase == "Failed" {
			t.Fatalf("pod %s failed: %+v", pod, p.Status)
		}
		return p.Status.Phase == "Succeeded"
	})
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
		out, err := runCleanup(ctx, t, c, b.s, burstCleanupThreshold, b.aws.users[b.s.cleanupUser], b.aws.url)
		if err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
		name, err := findNode(ctx, c, box.providerID())
		return err == nil && name == ""
	})
	for id, inst := range b.aws.ec2Instances(ctx, t) {
		if inst.State == "running" || inst.State == "pending" {
			t.Errorf("instance %s still %s in moto", id, inst.State)
		}
	}
	if d := b.aws.desired(ctx, t); !allZero(d) {
		t.Errorf("desired capacities %v at the end, want all 0", d)
	}
	if left := poolNodes(ctx, t, c); len(left) > 0 {
		t.Errorf("Nodes of a pool left: %v", left)
	}
}

// wait polls cond every second, running the launcher and checking the autoscaler's status each time, until cond
// holds (the phase is logged) or timeout.
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
		time.Sleep(time.Second)
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
// (--scan-interval=2s, startAutoscaler).
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

// poolGroup is the name of the Auto Scaling group of the pool (its node-template label dynk8s.io/pool).
func (s stackAutoscaling) poolGroup(t *testing.T, pool string) string {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(s.groups)) {
		if s.groups[name].labels[kube.LabelPool] == pool {
			return name
		}
	}
	t.Fatalf("the dev stack declares no group for pool %s", pool)
	return ""
}

// applyAddons brings the stack's addons up through the real engine, and takes them down when the test ends.
func applyAddons(ctx context.Context, t *testing.T, c cluster, cfg *config.Config) *pulumiStack {
	t.Helper()
	pools := slices.Clone(cfg.NodePools)
	st := newStack(ctx, t, c, addonsProgram(c, cfg, &pools))
	var objs []k8sObject
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := st.Destroy(dctx, optdestroy.ProgressStreams(st.log)); err != nil {
			t.Errorf("destroy the addons: %v", err)
		}
		// The engine does not wait (SkipAwait) for what the API server deletes in the background (a DaemonSet
		// waits for its pods); the next test's addons must not meet it.
		for _, o := range objs {
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
				_, err := c.kubectl(dctx, append([]string{"get"}, o.args()...)...)
				if isNotFound(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%s still there a minute after the destroy (%v)", o, err)
					break
				}
			}
		}
	})
	if _, err := st.Up(ctx, optup.ProgressStreams(st.log), optup.ErrorProgressStreams(st.log)); err != nil {
		t.Fatalf("up: %v", err)
	}
	var err error
	if objs, err = st.objects(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

// startScheduler runs the real kube-scheduler against the control plane for this test (hack/start-kube.sh runs none,
// so that the other tests' pods stay Pending).
func startScheduler(t *testing.T, c cluster) {
	t.Helper()
	cmd := exec.Command("kube-scheduler", "--kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig, "--authorization-kubeconfig="+c.Kubeconfig,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0")
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stopOnCleanup(t, "kube-scheduler", cmd, logs)
}

// createBuildPod creates the build: it runs the build image, asks for one fuse device and ephemeral storage, and
// selects this machine's architecture (the dev stack's other pool is arm64); it is deleted when the test ends.
func createBuildPod(ctx context.Context, t *testing.T, c cluster, name string, pool config.NodePool) {
	t.Helper()
	requests := map[string]string{"cpu": "100m", "memory": "64Mi", ephemeralStorage: "1Gi", fuseResource: "1"}
	var tolerations []map[string]string
	for _, tt := range pool.Taints {
		tolerations = append(tolerations, map[string]string{"key": tt.Key, "operator": "Equal", "value": tt.Value,
			"effect": string(tt.Effect)})
	}
	applyJSON(ctx, t, c, map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec": map[string]any{
			"restartPolicy": "Never",
			"nodeSelector":  map[string]string{kube.LabelArch: pool.Arch.Label(), kube.LabelPool: pool.Name},
			"tolerations":   tolerations,
			"containers": []map[string]any{{
				"name": "build", "image": buildImage,
				"env":          []map[string]string{{"name": "BUILD_DIR", "value": "/work"}},
				"resources":    map[string]any{"requests": requests, "limits": map[string]string{fuseResource: "1"}},
				"volumeMounts": []map[string]string{{"name": "work", "mountPath": "/work"}},
			}},
			"volumes": []map[string]any{{"name": "work", "emptyDir": map[string]any{}}},
		},
	})
	t.Cleanup(func() {
		_, _ = c.kubectl(context.Background(), "-n", "default", "delete", "pod", name, "--ignore-not-found",
			"--wait=false")
	})
}

// buildImage is the build pod's image (the test's own).
const buildImage = "e2e.dynk8s.invalid/build:1"

// podState is the part of a Pod the test reads.
type podState struct {
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase             string `json:"phase"`
		ContainerStatuses []struct {
			State map[string]any `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

// getNode reads a Node afresh (decoding into a used struct would keep fields the new JSON lacks).
func getNode(ctx context.Context, c cluster, name string) (kubeNode, error) {
	var n kubeNode
	err := c.getJSON(ctx, &n, "node", name)
	return n, err
}

func getPod(ctx context.Context, c cluster, name string) podState {
	var p podState
	_ = c.getJSON(ctx, &p, "pod", "-n", "default", name)
	return p
}

// poolNodes are the Nodes that carry a pool label.
func poolNodes(ctx context.Context, t *testing.T, c cluster) []string {
	t.Helper()
	out, err := c.kubectl(ctx, "get", "nodes", "-l", kube.LabelPool, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
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
	if err := c.getJSON(ctx, &ds, "daemonset", "-n", "kube-system", "fuse-device-plugin-"+j.pool.Arch.Label()); err != nil {
		t.Fatalf("the fuse DaemonSet of %s: %v", j.pool.Arch.Label(), err)
	}
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
		case len(ctr.Command) == 3 && ctr.Command[0] == "/bin/sh":
			// What untaint.sh calls besides the shell's builtins.
			files := map[string]string{"/bin/sh": "/bin/sh"}
			for _, tool := range []string{"sed", "date", "sleep", "kubectl"} {
				p, err := exec.LookPath(tool)
				if err != nil {
					t.Fatal(err)
				}
				files["/usr/bin/"+tool] = p
			}
			images = append(images, podImage{ref: ctr.Image, files: withSharedLibs(t, files)})
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
// kubelet starts (testdata/box/90-box-pods.conf), the runtime's sandbox image is the one the rendered CRI-O config
// names, the host's /dev/fuse is the box's, and the kubernetes Service's address leads to the API server (through a
// forwarder on the instance's address: a pod cannot be sent to the box's loopback).
func (n *boxNode) runsPods(t *testing.T, archives []string) {
	t.Helper()
	for i, a := range archives {
		content, err := os.ReadFile(a)
		if err != nil {
			t.Fatal(err)
		}
		n.writeFile(t, fmt.Sprintf("/opt/dynk8s-box/images/%02d.tar", i), content, 0o644)
	}
	conf := n.file(t, "/opt/dynk8s-box/containerd.toml")
	const anchor = "  restrict_oom_score_adj = true\n"
	if !strings.Contains(conf, anchor) {
		t.Fatalf("the box's containerd.toml has no %q", anchor)
	}
	conf = strings.Replace(conf, anchor, anchor+"  sandbox_image = \""+renderedPauseImage(t, n.userData)+"\"\n", 1)
	n.writeFile(t, "/opt/dynk8s-box/containerd.toml", []byte(conf), 0o644)
	dropIn, err := os.ReadFile(filepath.Join("testdata", "box", "90-box-pods.conf"))
	if err != nil {
		t.Fatal(err)
	}
	n.writeFile(t, "/etc/systemd/system/crio.service.d/90-box-pods.conf", dropIn, 0o644)
	_, port, err := splitHostPort(strings.TrimPrefix(n.c.Server, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	api := fmt.Sprintf("%s:%d", n.ip, port)
	n.writeFile(t, "/etc/dynk8s-box/services.nft", []byte(fmt.Sprintf(`table ip dynk8s_box_services {
	chain prerouting {
		type nat hook prerouting priority dstnat;
		ip daddr %s tcp dport 443 dnat to %s
	}
}
`, kubernetesServiceIP, api)), 0o644)
	n.binds = append(n.binds, "--bind=/dev/fuse")
	forwardIntoNetnsFile(t, n.netns, api, strings.TrimPrefix(n.c.Server, "https://"))
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

// kubernetesServiceIP is the kubernetes Service's address: the first of hack/start-kube.sh's service range.
const kubernetesServiceIP = "10.96.0.1"

// writeFile writes a file of the box's disk from the host.
func (b *box) writeFile(t *testing.T, path string, content []byte, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(b.root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, content, mode); err != nil {
		t.Fatal(err)
	}
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

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

// hostname is the instance's name as EC2's resource naming by IP gives it, and its Node's.
func (i boxInstance) hostname() string { return "ip-" + strings.ReplaceAll(i.ip, ".", "-") }

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
	ec2 := j.moto.url
	var router *vpcRouter
	if j.vpc != nil {
		// The API server only through the tunnel; EC2 (the gateway's wake-up) is the VPC's.
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
	if err != nil {
		t.Fatal(err)
	}
	return kn
}

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
	if err != nil {
		t.Fatal(err)
	}
}

// checkRegisteredSince: the Node is this join's, not one an earlier test left behind (API times have seconds).
func checkRegisteredSince(t *testing.T, node kubeNode, since time.Time) {
	t.Helper()
	if node.Metadata.CreationTimestamp.Before(since.Truncate(time.Second)) {
		t.Errorf("the Node was created at %s, before this join began (%s)", node.Metadata.CreationTimestamp, since)
	}
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
	if err := json.Unmarshal([]byte(n.file(t, "/var/lib/cloud/data/result.json")), &result); err != nil {
		t.Fatalf("cloud-init result.json: %v", err)
	}
	if len(result.V1.Errors) > 0 {
		t.Errorf("cloud-init errors: %v", result.V1.Errors)
	}
	var status struct {
		V1 map[string]json.RawMessage `json:"v1"`
	}
	if err := json.Unmarshal([]byte(n.file(t, "/var/lib/cloud/data/status.json")), &status); err != nil {
		t.Fatalf("cloud-init status.json: %v", err)
	}
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
	if err := n.waitBooted(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
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

// TestBoxNodeColdThenReboot boots a pool of the dev stack from its rendered user data in a box: a cold boot (no
// warm pool) joins and becomes Ready with the pool's labels and taints, with cloud-init and systemd clean and the
// metadata locked; then a stop and start of the same instance joins nothing again, and the kubelet comes back
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
	})
	if t.Failed() {
		return
	}
	t.Run("reboot", func(t *testing.T) {
		if err := n.poweroff(time.Minute); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		n.boot(t)
		if err := n.waitBooted(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
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
		if err := n.poweroff(time.Minute); err != nil {
			t.Fatal(err)
		}
		nft := "#!/bin/sh\necho 'nft: Error: Could not process rule: Operation not supported (box stand-in)' >&2\nexit 1\n"
		if err := os.WriteFile(filepath.Join(n.root, "/usr/sbin/nft"), []byte(nft), 0o755); err != nil {
			t.Fatal(err)
		}
		n.boot(t)
		if err := n.waitBooted(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
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
	if err != nil {
		t.Fatal(err)
	}
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
// the kubelet (review finding N1).
func TestBoxNodeWarmStopped(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)
	cfg, pool, asg := warmPool(t, "Stopped")
	n := newBoxNode(ctx, t, c, cfg, pool, "box-warm-stopped", "Warmed:Stopped", asg.URL)

	t.Run("prepare", func(t *testing.T) {
		n.prepareInWarmPool(ctx, t, asg)
		if err := n.poweroff(time.Minute); err != nil {
			t.Fatal(err)
		}
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
// in service, the join timer joins it on the same boot, and the metadata lockdown is loaded after that join too
// (review finding N3).
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
	if err != nil {
		t.Error(err)
	}
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
	if err := os.WriteFile(dropIn, []byte("[Service]\nEnvironment=DYNK8S_DEADLINE_SECONDS=20\n"), 0o644); err != nil {
		t.Fatal(err)
	}
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

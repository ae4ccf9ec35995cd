package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	astypes "github.com/aws/aws-sdk-go-v2/service/autoscaling/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Fake clients for the agent's table tests: each answers as its AWS service does, in the SDK's types, and records
// what it was asked. The wire-level fakes (cloudinit's fakes_test.go) check the same calls against the built binary.

const (
	testInstanceID = "i-0123456789abcdef0"
	testGroup      = "homelab-spot-arm64-asg-1a2b3c"
	testHook       = "dynk8s-launch"
	testParameter  = "/dynk8s/test/join-token"
	testToken      = "k7x2qa.0f9e8d7c6b5a4z3y"
	testGateway    = "i-0feedfacecafe0001"
	testCAHash     = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// apiErr is an AWS error answer as the SDK returns it: the HTTP status and the service's code and message.
func apiErr(status int, code, msg string) error {
	return &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
		Err:      &smithy.GenericAPIError{Code: code, Message: msg},
	}
}

type fakeIMDS struct {
	mu            sync.Mutex
	values        map[string]string
	tokenFailures int
	requests      int
}

func newFakeIMDS(lifecycle, domain string) *fakeIMDS {
	f := &fakeIMDS{values: map[string]string{
		"instance-id": testInstanceID, "placement/availability-zone": "eu-central-1a",
		"placement/region": "eu-central-1", "services/domain": "amazonaws.com", "local-ipv4": "10.100.1.23",
		"instance-type": "m7g.large",
	}}
	if domain != "" {
		f.values["services/domain"] = domain
	}
	f.setLifecycle(lifecycle)
	return f
}

func (f *fakeIMDS) setLifecycle(state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if state == "" {
		delete(f.values, lifecyclePath)
	} else {
		f.values[lifecyclePath] = state
	}
}

func (f *fakeIMDS) Get(_ context.Context, path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	if f.tokenFailures > 0 {
		f.tokenFailures--
		return "", &imdsErr{What: "IMDSv2 token", Status: 503}
	}
	v, ok := f.values[path]
	if !ok {
		return "", &imdsErr{What: "IMDS meta-data/" + path, Status: 404}
	}
	return v, nil
}

type fakeSSM struct {
	mu sync.Mutex
	// failures answers that many calls with AccessDeniedException first; negative: every call.
	failures int
	value    string
	// queued values are served one per call before value; "" answers ParameterNotFound.
	queued   []string
	requests int
}

func (f *fakeSSM) GetParameter(_ context.Context, in *ssm.GetParameterInput, _ ...func(*ssm.Options)) (*ssm.GetParameterOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	if aws.ToString(in.Name) != testParameter || !aws.ToBool(in.WithDecryption) {
		return nil, fmt.Errorf("fake SSM: unexpected request %s (decrypt %v)", aws.ToString(in.Name), aws.ToBool(in.WithDecryption))
	}
	if f.failures != 0 {
		f.failures--
		return nil, apiErr(400, "AccessDeniedException", "fake SSM says no")
	}
	v := f.value
	if len(f.queued) > 0 {
		v, f.queued = f.queued[0], f.queued[1:]
	}
	if v == "" {
		return nil, apiErr(400, "ParameterNotFound", "")
	}
	return &ssm.GetParameterOutput{Parameter: &ssmtypes.Parameter{Name: in.Name, Value: aws.String(v)}}, nil
}

type fakeASG struct {
	mu sync.Mutex
	// pendingAction: a lifecycle action waits for the instance (Pending:Wait, Warmed:Pending:Wait).
	pendingAction bool
	// instanceVersion and groupVersion are the launch template versions ("": none given).
	instanceVersion, groupVersion string
	calls                         []string
}

func (f *fakeASG) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func template(version string) *astypes.LaunchTemplateSpecification {
	if version == "" {
		return nil
	}
	return &astypes.LaunchTemplateSpecification{LaunchTemplateId: aws.String("lt-0123456789abcdef0"), Version: aws.String(version)}
}

func (f *fakeASG) DescribeAutoScalingInstances(_ context.Context, in *autoscaling.DescribeAutoScalingInstancesInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("DescribeAutoScalingInstances %s", strings.Join(in.InstanceIds, ","))
	out := &autoscaling.DescribeAutoScalingInstancesOutput{}
	if slices.Equal(in.InstanceIds, []string{testInstanceID}) {
		out.AutoScalingInstances = []astypes.AutoScalingInstanceDetails{{InstanceId: aws.String(testInstanceID),
			AutoScalingGroupName: aws.String(testGroup), LaunchTemplate: template(f.instanceVersion)}}
	}
	return out, nil
}

func (f *fakeASG) DescribeAutoScalingGroups(_ context.Context, in *autoscaling.DescribeAutoScalingGroupsInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("DescribeAutoScalingGroups %s", strings.Join(in.AutoScalingGroupNames, ","))
	if f.groupVersion == "" || !slices.Equal(in.AutoScalingGroupNames, []string{testGroup}) {
		return nil, apiErr(400, "ValidationError", "fake autoscaling knows no such group")
	}
	return &autoscaling.DescribeAutoScalingGroupsOutput{AutoScalingGroups: []astypes.AutoScalingGroup{{
		AutoScalingGroupName: aws.String(testGroup), LaunchTemplate: template(f.groupVersion)}}}, nil
}

func (f *fakeASG) CompleteLifecycleAction(_ context.Context, in *autoscaling.CompleteLifecycleActionInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.CompleteLifecycleActionOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("CompleteLifecycleAction %s %s %s %s", aws.ToString(in.AutoScalingGroupName), aws.ToString(in.LifecycleHookName),
		aws.ToString(in.InstanceId), aws.ToString(in.LifecycleActionResult))
	if !f.pendingAction || aws.ToString(in.AutoScalingGroupName) != testGroup {
		return nil, apiErr(400, "ValidationError", "No active Lifecycle Action found with instance ID "+aws.ToString(in.InstanceId))
	}
	f.pendingAction = false
	return &autoscaling.CompleteLifecycleActionOutput{}, nil
}

func (f *fakeASG) SetInstanceHealth(_ context.Context, in *autoscaling.SetInstanceHealthInput,
	_ ...func(*autoscaling.Options)) (*autoscaling.SetInstanceHealthOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("SetInstanceHealth %s %s", aws.ToString(in.InstanceId), aws.ToString(in.HealthStatus))
	return &autoscaling.SetInstanceHealthOutput{}, nil
}

func (f *fakeASG) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// fakeEC2 is StartInstances of the one gateway, through its states: idempotent on a running instance, refused while
// it is stopping.
type fakeEC2 struct {
	mu    sync.Mutex
	state string
	// stoppingCalls: starts refused (IncorrectInstanceState) while stopping; haltingCalls: starts a running gateway
	// still answers "running" while its OS powers off, after which it is stopping.
	stoppingCalls, haltingCalls int
	// failures answers that many calls with failCode (failStatus) first; negative: every call.
	failures   int
	failCode   string
	failStatus int
	calls      int
}

func (f *fakeEC2) StartInstances(_ context.Context, in *ec2.StartInstancesInput, _ ...func(*ec2.Options)) (*ec2.StartInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failures != 0 {
		f.failures--
		return nil, apiErr(f.failStatus, f.failCode, "fake EC2 says no")
	}
	if !slices.Equal(in.InstanceIds, []string{testGateway}) {
		return nil, apiErr(400, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", in.InstanceIds[0]))
	}
	halting := false
	if f.state == "running" && f.haltingCalls > 0 {
		f.haltingCalls--
		halting = f.haltingCalls == 0
	}
	if f.state == "stopping" {
		if f.stoppingCalls > 0 {
			f.stoppingCalls--
			return nil, apiErr(400, "IncorrectInstanceState", "The instance is not in a state from which it can be started.")
		}
		f.state = "stopped"
	}
	previous, current := f.state, ec2types.InstanceStateNameRunning
	if previous == "stopped" {
		current = ec2types.InstanceStateNamePending
	}
	f.state = "running"
	if halting {
		f.state = "stopping"
	}
	return &ec2.StartInstancesOutput{StartingInstances: []ec2types.InstanceStateChange{{InstanceId: aws.String(testGateway),
		CurrentState:  &ec2types.InstanceState{Name: current},
		PreviousState: &ec2types.InstanceState{Name: ec2types.InstanceStateName(previous)}}}}, nil
}

func (f *fakeEC2) started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// fakeHost records every command line, fails those listed, and plays kubeadm, crictl and the tools' presence.
type fakeHost struct {
	mu    sync.Mutex
	root  string
	calls []string
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
	// rpmDB: the pinned packages installed, by name (dnf installs them at the repository's versions, repoVersions).
	rpmDB map[string]rpmPackage
	// awaitJoin makes a pull last until kubeadm join has run, as a big image would.
	awaitJoin chan struct{}
	joined    bool
	// joinConfigs are the JoinConfigurations kubeadm join got, with their modes.
	joinConfigs []string
	joinModes   []os.FileMode
}

func (h *fakeHost) has(name string) bool { return !slices.Contains(h.missing, name) }

func (h *fakeHost) run(ctx context.Context, _ time.Duration, _ bool, name string, args ...string) error {
	line := strings.TrimSpace(name + " " + strings.Join(args, " "))
	h.mu.Lock()
	h.calls = append(h.calls, line)
	failed := h.fail[line]
	if h.failN[name] > 0 {
		h.failN[name]--
		failed = true
	}
	h.mu.Unlock()
	if name == "kubeadm" && args[0] == "join" {
		return h.kubeadmJoin(args[2], failed)
	}
	if failed {
		return &exitError{name: name, code: 1}
	}
	switch name {
	case "modprobe":
		h.mu.Lock()
		defer h.mu.Unlock()
		if slices.Contains(h.modulesMissing, args[0]) && !h.modulesExtra {
			return &exitError{name: name, code: 1}
		}
	case "rpm":
		if slices.Contains(h.rpmMissing, args[2]) {
			return &exitError{name: name, code: 1}
		}
	case "dnf":
		if h.dnfNeedsRepo != "" && !slices.Contains(args, "--repo="+h.dnfNeedsRepo) {
			return &exitError{name: name, code: 1}
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
			return &exitError{name: name, code: 1}
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

// output plays rpm -q --qf rpmQueryFormat: the pinned packages from rpmDB, the system packages unless rpmMissing.
func (h *fakeHost) output(_ context.Context, _ time.Duration, name string, args ...string) (string, error) {
	line := strings.TrimSpace(name + " " + strings.Join(args, " "))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, line)
	n := len(args)
	if name != "rpm" || args[0] != "-q" || n < 4 || args[n-3] != "--qf" || args[n-2] != rpmQueryFormat {
		return "", fmt.Errorf("fake host: no output for %s", line)
	}
	pkg := args[n-1]
	p, ok := h.rpmDB[pkg]
	if slices.Contains(args, "--whatprovides") && !ok && !slices.Contains(h.rpmMissing, pkg) {
		p, ok = fakeRPM(pkg, "1.0", "1.fc43", "noarch"), true
	}
	if !ok {
		return "package " + pkg + " is not installed\n", &exitError{name: name, code: 1}
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
	h.mu.Lock()
	defer h.mu.Unlock()
	h.joinConfigs = append(h.joinConfigs, string(b))
	h.joinModes = append(h.joinModes, st.Mode().Perm())
	if fail {
		return &exitError{name: "kubeadm", code: 1}
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

func (h *fakeHost) recorded() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// rig is one instance for the agent: its root, its config, the fakes, and what the last run logged.
type rig struct {
	t    *testing.T
	root string
	cfg  nodeconfig.Node
	imds *fakeIMDS
	ssm  *fakeSSM
	asg  *fakeASG
	ec2  *fakeEC2
	host *fakeHost
	log  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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
	api := newAPIServer(t, 0)
	r := &rig{t: t, root: root, imds: newFakeIMDS(lifecycle, ""), ssm: &fakeSSM{value: testToken}, asg: &fakeASG{},
		ec2: &fakeEC2{state: "stopped"}, host: &fakeHost{root: root, fail: map[string]bool{}, failN: map[string]int{}}}
	r.cfg = nodeconfig.Node{
		ClusterName: "homelab", PoolName: "spot-arm64", APIServerEndpoint: strings.TrimPrefix(api.URL, "https://"),
		JoinTokenParameter: testParameter, LaunchHook: hook, CRISocket: "unix:///var/run/crio/crio.sock",
		KernelModules: []string{"overlay", "br_netfilter"},
		Packages:      []string{"kubelet-1.34.4", "kubeadm-1.34.4", "cri-tools-1.34.*", "cri-o-1.34.*"},
		Repos:         []string{"dynk8s-kubernetes", "dynk8s-cri-o"}, SystemPackages: []string{"container-selinux", "iptables", "nftables"},
		SystemRepos: []string{"fedora"}, UpdateRepos: []string{"updates"},
		PrePullImages: []string{"registry.k8s.io/pause:3.10.1", "registry.k8s.io/kube-proxy:v1.34.4"},
		Join: nodeconfig.Join{CACertHashes: []string{testCAHash}, PatchesDirectory: "/etc/kubernetes/patches",
			Labels: map[string]string{"dynk8s.io/pool": "spot-arm64", "dynk8s.io/capacity-type": "spot"},
			Taints: []nodeconfig.Taint{{Key: "dynk8s.io/capacity-type", Value: "spot", Effect: "NoSchedule"}}},
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

func (r *rig) cloud() *cloud {
	return &cloud{imds: r.imds, connect: func(c *cloud, region, domain string) {
		if region != "eu-central-1" || domain == "" {
			r.t.Errorf("connect(%q, %q)", region, domain)
		}
		c.ssm, c.asg, c.ec2 = r.ssm, r.asg, r.ec2
	}}
}

// joinRun is what one run of the join did.
type joinRun struct {
	err      error
	waited   bool // the warm pool's quiet tick
	log      string
	calls    []string
	elapsed  time.Duration
	timeline *timelineDoc
}

// join runs the agent's join as main does (already joined, waiting, then the boot) and reads its timeline.
func (r *rig) join() joinRun {
	r.t.Helper()
	r.log = &syncBuffer{}
	f := files{root: r.root, proc: filepath.Join(r.root, "proc")}
	log := newLogger("dynk8s-join", r.log, r.root)
	log.journal = false
	before := len(r.host.recorded())
	start := time.Now()
	run := joinRun{}
	if alreadyJoined(f) {
		log.Printf("already joined; nothing to do")
	} else {
		j := &joiner{cfg: r.cfg, cloud: r.cloud(), host: r.host, files: f, log: log,
			clock: newClock(r.cfg.Deadlines.Join.D(), r.cfg.Deadlines.BackoffInitial.D(), r.cfg.Deadlines.BackoffMax.D()),
			tl:    newTimeline(time.Now)}
		if j.waiting(context.Background()) {
			run.waited = true
		} else {
			run.err = j.run(context.Background())
		}
	}
	run.elapsed = time.Since(start)
	run.log = r.log.String()
	run.calls = r.host.recorded()[before:]
	if b, err := os.ReadFile(filepath.Join(r.root, "run/dynk8s/timeline.json")); err == nil {
		var tl timelineDoc
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

func (run joinRun) failedLines() []string {
	var out []string
	for _, l := range strings.Split(run.log, "\n") {
		if strings.Contains(l, "FAILED") {
			out = append(out, l)
		}
	}
	return out
}

// index is the position of the first call that starts with prefix, -1 for none.
func (run joinRun) index(prefix string) int {
	return slices.IndexFunc(run.calls, func(c string) bool { return strings.HasPrefix(c, prefix) })
}

// newAPIServer answers /readyz over TLS after dropping the first drops connections.
func newAPIServer(t *testing.T, drops int) *httptest.Server {
	var mu sync.Mutex
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		drop := drops > 0
		drops--
		mu.Unlock()
		if drop {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

package cloudinit

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Acceptance of the node agent: the built node/cmd/dynk8s-node, with the node's configuration as NodeConfig renders it,
// against the wire-level fakes (fakes_test.go: IMDSv2, SSM's JSON API, Auto Scaling's and EC2's Query APIs, each
// checking the SigV4 signature with the role's credentials) through the endpoint overrides, with the host's
// commands recorded by the same stand-ins the boot scripts ran with. The agent's own table tests
// (node/cmd/dynk8s-node) cover every scenario with fake clients; these prove the real clients speak the wire protocols.

const agentPath = "/usr/local/bin/dynk8s-node"

var agentBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// builtAgent builds node/cmd/dynk8s-node once per test binary (the Go build cache makes it quick after the first).
func builtAgent(t *testing.T) string {
	t.Helper()
	agentBuild.once.Do(func() {
		agentBuild.dir, agentBuild.err = os.MkdirTemp("", "dynk8s-agent-")
		if agentBuild.err != nil {
			return
		}
		agentBuild.path = filepath.Join(agentBuild.dir, "dynk8s-node")
		cmd := exec.Command("go", "build", "-trimpath", "-o", agentBuild.path, "github.com/dynk8s/dynk8s/node/cmd/dynk8s-node")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBuild.err = &buildError{err: err, out: string(out)}
		}
	})
	assert.NilError(t, agentBuild.err)
	return agentBuild.path
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string {
	return "go build ./node/cmd/dynk8s-node: " + e.err.Error() + "\n" + e.out
}

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBuild.dir != "" {
		_ = os.RemoveAll(agentBuild.dir)
	}
	os.Exit(code)
}

// agentFixture renders the spot pool (changed by modify) for a fake API server that first drops apiDrops
// connections, and returns its user data and a fake AWS serving the join token.
func agentFixture(t *testing.T, apiDrops int, modify func(*NodeInput), inst fakeaws.IMDSInstance) ([]byte, *fakeAWS) {
	t.Helper()
	api := newFakeAPIServer(t, apiDrops)
	u, err := url.Parse(api.URL)
	assert.NilError(t, err)
	in := spotPool()
	in.APIServerEndpoint, err = endpoint.Parse(u.Host)
	assert.NilError(t, err)
	in.JoinTokenParameter = testTokenParameter
	if modify != nil {
		modify(&in)
	}
	ud, err := Node(in)
	assert.NilError(t, err)
	return ud, newFakeAWSIn(t, map[string]string{testTokenParameter: testToken}, inst)
}

// newAgentEnv is newScriptEnv with the agent installed where the bootstrap puts it.
func newAgentEnv(t *testing.T, ud []byte, aws *fakeAWS, env map[string]string, prepare func(root string)) *scriptEnv {
	t.Helper()
	bin := builtAgent(t)
	return newScriptEnv(t, ud, aws, env, func(root string) {
		// A link, not a copy: a file written here while a parallel test forks could be busy (ETXTBSY) when it runs.
		assert.NilError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(agentPath)), 0o755))
		assert.NilError(t, os.Symlink(bin, filepath.Join(root, agentPath)))
		if prepare != nil {
			prepare(root)
		}
	})
}

// The agent joins through every wire protocol: IMDSv2 (its token failing twice), SSM (refusing once), the API
// server (dropping twice) and kubeadm (failing once), each signed AWS request checked by the fakes; the
// JoinConfiguration has the token and the identity; no secret reaches a command line, the log or the journal; the
// timeline is what cmd/timeline and the runbook read.
func TestAgentJoins(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 2, nil, fakeaws.IMDSInstance{})
	aws.imds.FailTokens(2)
	aws.ssmFailures = 1
	env := newAgentEnv(t, ud, aws, map[string]string{"STUB_KUBEADM_FAILURES": "1"}, nil)
	run := env.run(t, agentPath, "join")
	assert.Equal(t, run.exitCode, 0)
	sum, err := os.ReadFile(builtAgent(t))
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(run.stderr, fmt.Sprintf("dynk8s-join: dynk8s-node devel (sha256 %x, ", sha256.Sum256(sum))),
		"the first line names the version and the binary's hash")
	for _, step := range []string{"read instance identity from IMDS: succeeded on attempt 3",
		"read the join token from SSM parameter " + testTokenParameter + ": succeeded on attempt 2",
		"reach the API server at ", "kubeadm join: succeeded on attempt 2"} {
		assert.Check(t, is.Contains(run.stderr, step))
	}
	assert.Check(t, is.Contains(run.stderr, "IMDSv2 token: HTTP 503"))
	assert.Check(t, is.Contains(run.stderr, "HTTP 400 AccessDeniedException: fake SSM says no"))
	assert.Check(t, is.Len(failedLines(run.stderr), 0))
	jc := parseJoinConfig(t, run.file("join-config.yaml"))
	assert.Check(t, is.Equal(jc.Discovery.BootstrapToken.Token, testToken))
	assert.Check(t, is.DeepEqual(jc.Discovery.BootstrapToken.CACertHashes, []string{testCAHash}))
	assert.Check(t, is.Equal(jc.NodeRegistration.Name, fakeInstanceID))
	assert.Check(t, is.Equal(strings.TrimSpace(run.file("join-config.mode")), "600"))
	calls := run.file("calls")
	assert.Check(t, is.Contains(calls, "dnf install -y "+dnfOptions+" --repo=dynk8s-kubernetes --repo=dynk8s-cri-o "+
		"kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*\n"))
	checkLocksBeforeJoin(t, calls)
	for _, secret := range []string{testToken, fakeSecretKey, fakeSession, fakeaws.IMDSSessionToken} {
		assert.Check(t, !strings.Contains(calls, secret), "a secret is in some command's argv")
		assert.Check(t, !strings.Contains(run.stderr, secret), "a secret is in the log")
		assert.Check(t, !strings.Contains(run.file("journal"), secret), "a secret is in the journal")
	}
	assert.Check(t, is.Contains(run.file("journal"), "joined the cluster as "+fakeInstanceID), "outside systemd the log also goes to logger")
	tl := readTimeline(t, run)
	assert.Check(t, is.Equal(tl.Result, "joined"))
	assert.Check(t, is.DeepEqual(tl.phaseNames(), []string{"identity", "kernel", "packages", "crio", "checks", "token",
		"api-server", "kubeadm-join", "pre-pull"}))
	assert.Check(t, is.Contains(run.stderr, "timeline: result=joined mode=join total="))

	again := env.run(t, agentPath, "join")
	assert.Equal(t, again.exitCode, 0)
	assert.Check(t, is.Contains(again.stderr, "already joined"))
}

// SSM keeps refusing: the agent stops at its deadline with one reason (to the kernel log too), runs no kubeadm and
// calls no Auto Scaling.
func TestAgentGivesUpAtDeadline(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, nil, fakeaws.IMDSInstance{})
	aws.ssmFailures = -1
	env := newAgentEnv(t, ud, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, func(root string) {
		assert.NilError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, "dev/kmsg"), nil, 0o644))
	})
	run := env.run(t, agentPath, "join")
	assert.Check(t, is.Equal(run.exitCode, 1))
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "read the join token from SSM parameter "+testTokenParameter+": gave up after"))
	assert.Check(t, is.Contains(failed[0], "(deadline 2s)"))
	assert.Check(t, !strings.Contains(run.file("calls"), "kubeadm "), "kubeadm ran")
	assert.Check(t, is.Len(aws.autoscalingCalls(), 0), "the instance was handed back to its group")
	kmsg, err := os.ReadFile(filepath.Join(run.root, "dev/kmsg"))
	assert.NilError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(kmsg), "\n"), "\n")
	assert.Assert(t, is.Len(lines, 2), "%s", kmsg)
	assert.Check(t, strings.HasPrefix(lines[0], "<3>dynk8s-join: FAILED: read the join token"), lines[0])
	assert.Check(t, strings.HasPrefix(lines[1], "<3>dynk8s-join: timeline: result=failed mode=join "), lines[1])
	assert.Check(t, is.Equal(readTimeline(t, run).Result, "failed"))
}

// A warm pool through Auto Scaling's Query API: the Warmed:Stopped boot prepares and completes the launch hook's
// action; the boot into service compares launch template versions (DescribeAutoScalingInstances,
// DescribeAutoScalingGroups) and, stale, abandons the action; current, joins and completes it. A Running warm
// instance's timer runs are silent.
func TestAgentWarmPool(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ instance, group, result, action string }{
		"stale":   {"3", "4", "stale", "ABANDON"},
		"current": {"4", "4", "joined", "CONTINUE"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ud, aws := agentFixture(t, 0, withHook, fakeaws.IMDSInstance{LifecycleState: "Warmed:Stopped"})
			aws.pendingAction = true
			aws.instanceVersion, aws.groupVersion = c.instance, c.group
			env := newAgentEnv(t, ud, aws, nil, nil)
			warm := env.run(t, agentPath, "join")
			assert.Equal(t, warm.exitCode, 0)
			assert.Check(t, is.Equal(readTimeline(t, warm).Result, "prepared"))
			complete := "CompleteLifecycleAction AutoScalingGroupName=" + fakeGroup + " InstanceId=" + fakeInstanceID +
				" LifecycleActionResult=%s LifecycleHookName=" + testHook
			assert.Check(t, is.DeepEqual(aws.autoscalingCalls(), []string{
				"DescribeAutoScalingInstances InstanceIds.member.1=" + fakeInstanceID,
				strings.Replace(complete, "%s", "CONTINUE", 1),
			}))
			assert.Check(t, !strings.Contains(warm.file("calls"), "\nkubeadm "), "kubeadm ran in the warm pool")

			reboot(t, env.root)
			aws.imds.SetLifecycleState("InService")
			aws.mu.Lock()
			aws.pendingAction = true
			aws.mu.Unlock()
			assert.NilError(t, os.Remove(filepath.Join(env.stubDir, "calls")))
			start := env.run(t, agentPath, "join")
			assert.Equal(t, start.exitCode, 0)
			assert.Check(t, is.Equal(readTimeline(t, start).Result, c.result))
			asg := aws.autoscalingCalls()
			assert.Check(t, is.Contains(asg, "DescribeAutoScalingGroups AutoScalingGroupNames.member.1="+fakeGroup))
			assert.Check(t, is.Equal(asg[len(asg)-1], strings.Replace(complete, "%s", c.action, 1)))
			assert.Check(t, is.Equal(strings.Contains(start.file("calls"), "kubeadm join"), c.result == "joined"))
		})
	}
	t.Run("running", func(t *testing.T) {
		t.Parallel()
		ud, aws := agentFixture(t, 0, withHook, fakeaws.IMDSInstance{LifecycleState: "Warmed:Running"})
		aws.pendingAction = true
		env := newAgentEnv(t, ud, aws, nil, nil)
		assert.Equal(t, env.run(t, agentPath, "join").exitCode, 0)
		tick := env.run(t, agentPath, "join")
		assert.Equal(t, tick.exitCode, 0)
		assert.Check(t, is.Equal(tick.stderr, ""), "a waiting run logs nothing")
	})
}

// The gateway through EC2's Query API: the join wakes a stopped gateway beside it; the wake-up alone retries a
// gateway still stopping and fails at once, with the reason, when refused.
func TestAgentWakesTheGateway(t *testing.T) {
	t.Parallel()
	withGateway := func(in *NodeInput) { in.GatewayInstanceID = testGatewayID }
	ud, aws := agentFixture(t, 0, withGateway, fakeaws.IMDSInstance{})
	aws.ec2.gatewayID, aws.ec2.gatewayState = testGatewayID, "stopped"
	run := newAgentEnv(t, ud, aws, nil, nil).run(t, agentPath, "join")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "dynk8s-wake-gateway: gateway "+testGatewayID+" was stopped, now pending"))
	assert.Check(t, is.DeepEqual(aws.ec2Actions(), []string{"StartInstances"}))

	ud, aws = agentFixture(t, 0, withGateway, fakeaws.IMDSInstance{})
	aws.ec2.gatewayID, aws.ec2.gatewayState, aws.ec2.stoppingCalls = testGatewayID, "stopping", 2
	run = newAgentEnv(t, ud, aws, nil, nil).run(t, agentPath, "wake-gateway")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "(stopping): EC2 StartInstances: HTTP 400 IncorrectInstanceState"))
	assert.Check(t, is.Contains(run.stderr, "was stopped, now pending"))
	assert.Check(t, is.Len(aws.ec2Actions(), 3))

	ud, aws = agentFixture(t, 0, withGateway, fakeaws.IMDSInstance{})
	aws.ec2.gatewayID = testGatewayID
	aws.ec2.failures, aws.ec2.failStatus, aws.ec2.failCode = -1, 403, "UnauthorizedOperation"
	run = newAgentEnv(t, ud, aws, nil, nil).run(t, agentPath, "wake-gateway")
	assert.Check(t, is.Equal(run.exitCode, 1))
	assert.Check(t, is.DeepEqual(failedLines(run.stderr), []string{"dynk8s-wake-gateway: FAILED: cannot start gateway " +
		testGatewayID + ": EC2 StartInstances: HTTP 403 UnauthorizedOperation: fake EC2 says no"}))
	assert.Check(t, is.Len(aws.ec2Actions(), 1))
}

// A configuration the agent does not understand (here a key it does not know) stops the boot with that reason
// before it asks anything of IMDS.
func TestAgentRefusesAnUnknownConfigKey(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, nil, fakeaws.IMDSInstance{})
	run := newAgentEnv(t, ud, aws, nil, func(root string) {
		path := filepath.Join(root, nodeconfig.Path)
		cfg, err := os.ReadFile(path)
		assert.NilError(t, err)
		assert.NilError(t, os.WriteFile(path, []byte(strings.Replace(string(cfg), `"poolName"`, `"poolNmae"`, 1)), 0o644))
	}).run(t, agentPath, "join")
	assert.Check(t, is.Equal(run.exitCode, 1))
	assert.Check(t, is.Len(failedLines(run.stderr), 1), run.stderr)
	assert.Check(t, is.Contains(run.stderr, `unknown key "poolNmae"`))
	assert.Check(t, is.Equal(aws.imds.Requests(), 0))
}

// --dry-run -v, for an operator on a node: it reads IMDS and the token, prints the JoinConfiguration with the token
// hidden, and changes nothing: no command runs, no lifecycle action is completed, no file is written.
func TestAgentDryRun(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, withHook, fakeaws.IMDSInstance{LifecycleState: "InService"})
	aws.pendingAction = true
	run := newAgentEnv(t, ud, aws, nil, nil).run(t, agentPath, "join", "--dry-run", "-v")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Equal(run.file("calls"), ""), "a command ran")
	assert.Check(t, aws.pendingAction, "the lifecycle action was completed")
	assert.Check(t, is.Contains(run.stderr, "dry run: would run dnf install -y"))
	assert.Check(t, is.Contains(run.stderr, "dry run: would run kubeadm join --config"))
	assert.Check(t, is.Contains(run.stderr, "token: <the token from SSM>"))
	assert.Check(t, is.Contains(run.stderr, "dry run: would complete the lifecycle action of hook "+testHook+" with CONTINUE"))
	assert.Check(t, !strings.Contains(run.stderr, testToken), "the token is in the log")
	_, err := os.Stat(filepath.Join(run.root, "run/dynk8s"))
	assert.Check(t, os.IsNotExist(err), "the dry run wrote under /run/dynk8s")
}

const (
	testTokenParameter = "/dynk8s/test/join-token"
	testToken          = "k7x2qa.0f9e8d7c6b5a4z3y"
	testGatewayID      = "i-0feedfacecafe0001"
	testHook           = "dynk8s-launch"
	// dnfOptions are the options of every dnf transaction of the boot.
	dnfOptions = "--setopt=install_weak_deps=False --setopt=tsflags=nodocs --setopt=max_parallel_downloads=10"
)

func withHook(in *NodeInput) { in.LaunchHook = testHook }

func failedLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "FAILED") {
			out = append(out, l)
		}
	}
	return out
}

// reboot is what a stop and start leaves of the node's files: /run is a tmpfs.
func reboot(t *testing.T, root string) {
	t.Helper()
	assert.NilError(t, os.RemoveAll(filepath.Join(root, "run")))
}

// timeline is /run/dynk8s/timeline.json as the runbook and cmd/timeline's readers take it.
type timeline struct {
	InstanceID              string   `json:"instanceId"`
	LifecycleState          string   `json:"lifecycleState"`
	Mode                    string   `json:"mode"`
	Result                  string   `json:"result"`
	Reason                  string   `json:"reason"`
	TotalSeconds            float64  `json:"totalSeconds"`
	StartedSecondsAfterBoot *float64 `json:"startedSecondsAfterBoot"`
	Phases                  []struct {
		Name    string  `json:"name"`
		Seconds float64 `json:"seconds"`
	} `json:"phases"`
}

func (tl timeline) phaseNames() []string {
	var out []string
	for _, p := range tl.Phases {
		out = append(out, p.Name)
	}
	return out
}

// readTimeline reads the run's timeline strictly and checks that its phases fit its total and the fake
// /proc/uptime (42.5 s).
func readTimeline(t *testing.T, run scriptRun) timeline {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(run.root, "run/dynk8s/timeline.json"))
	assert.NilError(t, err)
	var tl timeline
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	assert.NilError(t, dec.Decode(&tl), string(b))
	sum := 0.0
	for _, p := range tl.Phases {
		assert.Check(t, p.Seconds >= 0 && p.Seconds <= tl.TotalSeconds+0.01, "phase %+v of %.3f s", p, tl.TotalSeconds)
		if p.Name != "pre-pull" { // runs beside the others
			sum += p.Seconds
		}
	}
	assert.Check(t, sum <= tl.TotalSeconds+0.01, "phases sum to %.3f s, more than the %.3f s total", sum, tl.TotalSeconds)
	assert.Check(t, tl.TotalSeconds <= run.elapsed.Seconds(), "total %.3f s, but the agent ran %s", tl.TotalSeconds, run.elapsed)
	if assert.Check(t, tl.StartedSecondsAfterBoot != nil) {
		assert.Check(t, *tl.StartedSecondsAfterBoot > 0 && *tl.StartedSecondsAfterBoot <= 42.5)
	}
	return tl
}

// checkLocksBeforeJoin: the join loads the metadata lockdown and turns swap off before kubeadm join starts the
// kubelet.
func checkLocksBeforeJoin(t *testing.T, calls string) {
	t.Helper()
	join := strings.Index(calls, "kubeadm join")
	lock := strings.Index(calls, "systemctl start "+imdsUnitName+"\n")
	swap := strings.Index(calls, "swapoff -a\n")
	assert.Check(t, lock >= 0 && join > lock, "%s is not started before kubeadm join:\n%s", imdsUnitName, calls)
	assert.Check(t, swap >= 0 && join > swap, "swap is not off before kubeadm join:\n%s", calls)
}

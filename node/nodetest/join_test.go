package nodetest

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/cloudinit"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
)

// Acceptance of the node agent: the built node/cmd/dynk8s-node, with the node's configuration as NodeConfig renders it,
// against the wire-level fakes (internal/fakeaws: IMDSv2, SSM's JSON API, Auto Scaling's and EC2's Query APIs,
// each checking the SigV4 signature with the role's credentials) through the endpoint overrides, with the host's
// commands recorded by the same stand-ins the boot scripts ran with. The agent's own table tests
// (node/cmd/dynk8s-node) cover every scenario with fake clients; these prove the real clients speak the wire protocols.

// agentFixture renders the test pool (changed by modify) for a fake API server that first drops apiDrops
// connections, and returns its user data and the fakes, SSM serving the join token.
func agentFixture(t *testing.T, apiDrops int, modify func(*nodeconfig.Node), inst fakeaws.IMDSInstance) ([]byte, *cloud) {
	t.Helper()
	aws := newCloud(t, map[string]string{testTokenParameter: testToken}, inst, apiDrops)
	node, render := testPool(aws.apiEndpoint(t))
	if modify != nil {
		modify(&node)
	}
	ud, err := cloudinit.Node(node, render)
	assert.NilError(t, err)
	return ud, aws
}

// newAgentEnv is newScriptEnv with the agent installed where the bootstrap puts it.
func newAgentEnv(t *testing.T, ud []byte, aws *cloud, env map[string]string, prepare func(root string)) *scriptEnv {
	t.Helper()
	bin := BuiltAgent(t)
	return newScriptEnv(t, ud, aws, env, func(root string) {
		// A link, not a copy: a file written here while a parallel test forks could be busy (ETXTBSY) when it runs.
		assert.NilError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(AgentPath)), 0o755))
		assert.NilError(t, os.Symlink(bin, filepath.Join(root, AgentPath)))
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
	aws.ssm.Fail(1, "AccessDeniedException")
	env := newAgentEnv(t, ud, aws, map[string]string{"STUB_KUBEADM_FAILURES": "1"}, nil)
	run := env.run(t, AgentPath, "join")
	assert.Equal(t, run.exitCode, 0)
	sum, err := os.ReadFile(BuiltAgent(t))
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
	assert.Check(t, is.Len(FailedLines(run.stderr), 0))
	jc := ParseJoinConfig(t, run.file("join-config.yaml"))
	assert.Check(t, is.Equal(jc.Discovery.BootstrapToken.Token, testToken))
	assert.Check(t, is.DeepEqual(jc.Discovery.BootstrapToken.CACertHashes, []string{testCAHash}))
	assert.Check(t, is.Equal(jc.NodeRegistration.Name, testInstanceID))
	assert.Check(t, is.Equal(strings.TrimSpace(run.file("join-config.mode")), "600"))
	calls := run.file("calls")
	assert.Check(t, is.Contains(calls, "dnf install -y "+dnfOptions+" --repo=dynk8s-kubernetes --repo=dynk8s-cri-o "+
		"kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*\n"))
	checkLocksBeforeJoin(t, calls)
	for _, secret := range []string{testToken, aws.inst.SecretAccessKey, aws.inst.SessionToken, fakeaws.IMDSSessionToken} {
		assert.Check(t, !strings.Contains(calls, secret), "a secret is in some command's argv")
		assert.Check(t, !strings.Contains(run.stderr, secret), "a secret is in the log")
		assert.Check(t, !strings.Contains(run.file("journal"), secret), "a secret is in the journal")
	}
	assert.Check(t, is.Contains(run.file("journal"), "joined the cluster as "+testInstanceID), "outside systemd the log also goes to logger")
	tl := readTimeline(t, run)
	assert.Check(t, is.Equal(tl.Result, "joined"))
	assert.Check(t, is.DeepEqual(tl.PhaseNames(), []string{"identity", "kernel", "packages", "crio", "checks", "token",
		"kubelet-key", "api-server", "lock", "kubeadm-join", "pre-pull"}))
	assert.Check(t, is.Contains(run.stderr, "timeline: result=joined mode=join total="))

	again := env.run(t, AgentPath, "join")
	assert.Equal(t, again.exitCode, 0)
	assert.Check(t, is.Contains(again.stderr, "already joined"))
}

// SSM keeps refusing: the agent stops at its deadline with one reason (to the kernel log too), runs no kubeadm and
// calls no Auto Scaling.
func TestAgentGivesUpAtDeadline(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, nil, fakeaws.IMDSInstance{})
	aws.ssm.Fail(-1, "AccessDeniedException")
	env := newAgentEnv(t, ud, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, func(root string) {
		assert.NilError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, "dev/kmsg"), nil, 0o644))
	})
	run := env.run(t, AgentPath, "join")
	assert.Check(t, is.Equal(run.exitCode, 1))
	failed := FailedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "read the join token from SSM parameter "+testTokenParameter+": gave up after"))
	assert.Check(t, is.Contains(failed[0], "(deadline 2s)"))
	assert.Check(t, !strings.Contains("\n"+run.file("calls"), "\nkubeadm "), "kubeadm ran")
	assert.Check(t, is.Len(aws.asg.Calls(), 0), "the instance was handed back to its group")
	lines := KernelLog(t, run.root)
	assert.Assert(t, is.Len(lines, 2), "%q", lines)
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
			aws.asg.Hold()
			aws.asg.SetLaunchTemplateVersions(c.instance, c.group)
			env := newAgentEnv(t, ud, aws, nil, nil)
			warm := env.run(t, AgentPath, "join")
			assert.Equal(t, warm.exitCode, 0)
			assert.Check(t, is.Equal(readTimeline(t, warm).Result, "prepared"))
			complete := "CompleteLifecycleAction AutoScalingGroupName=" + testGroup + " InstanceId=" + testInstanceID +
				" LifecycleActionResult=%s LifecycleHookName=" + testHook
			assert.Check(t, is.DeepEqual(aws.asg.Calls(), []string{
				"DescribeAutoScalingInstances InstanceIds.member.1=" + testInstanceID,
				strings.Replace(complete, "%s", "CONTINUE", 1),
			}))
			assert.Check(t, !strings.Contains(warm.file("calls"), "\nkubeadm "), "kubeadm ran in the warm pool")

			reboot(t, env.root)
			aws.imds.SetLifecycleState("InService")
			aws.asg.Hold()
			assert.NilError(t, os.Remove(filepath.Join(env.stubDir, "calls")))
			start := env.run(t, AgentPath, "join")
			assert.Equal(t, start.exitCode, 0)
			assert.Check(t, is.Equal(readTimeline(t, start).Result, c.result))
			asg := aws.asg.Calls()
			assert.Check(t, is.Contains(asg, "DescribeAutoScalingGroups AutoScalingGroupNames.member.1="+testGroup))
			assert.Check(t, is.Equal(asg[len(asg)-1], strings.Replace(complete, "%s", c.action, 1)))
			assert.Check(t, is.Equal(strings.Contains(start.file("calls"), "kubeadm join"), c.result == "joined"))
		})
	}
	t.Run("running", func(t *testing.T) {
		t.Parallel()
		ud, aws := agentFixture(t, 0, withHook, fakeaws.IMDSInstance{LifecycleState: "Warmed:Running"})
		aws.asg.Hold()
		env := newAgentEnv(t, ud, aws, nil, nil)
		assert.Equal(t, env.run(t, AgentPath, "join").exitCode, 0)
		tick := env.run(t, AgentPath, "join")
		assert.Equal(t, tick.exitCode, 0)
		assert.Check(t, is.Equal(tick.stderr, ""), "a waiting run logs nothing")
	})
}

// The gateway through EC2's Query API: the join wakes a stopped gateway beside it; the wake-up alone retries a
// gateway still stopping and fails at once, with the reason, when refused.
func TestAgentWakesTheGateway(t *testing.T) {
	t.Parallel()
	withGateway := func(in *nodeconfig.Node) { in.GatewayInstanceID = testGatewayID }
	ud, aws := agentFixture(t, 0, withGateway, fakeaws.IMDSInstance{})
	aws.ec2.AddInstances(fakeaws.EC2Instance{ID: testGatewayID, State: "stopped"})
	run := newAgentEnv(t, ud, aws, nil, nil).run(t, AgentPath, "join")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "dynk8s-wake-gateway: gateway "+testGatewayID+" was stopped, now pending"))
	assert.Check(t, is.DeepEqual(slices.DeleteFunc(aws.ec2.Actions(), func(a string) bool { return a == "CreateTags" }),
		[]string{"StartInstances"}))
	assert.Check(t, is.Equal(aws.ec2.State(testGatewayID), "running"))

	ud, aws = agentFixture(t, 0, withGateway, fakeaws.IMDSInstance{})
	aws.ec2.AddInstances(fakeaws.EC2Instance{ID: testGatewayID, State: "stopping", StartsRefused: 2})
	run = newAgentEnv(t, ud, aws, nil, nil).run(t, AgentPath, "wake-gateway")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "(stopping): EC2 StartInstances: HTTP 400 IncorrectInstanceState"))
	assert.Check(t, is.Contains(run.stderr, "was stopped, now pending"))
	assert.Check(t, is.Len(aws.ec2.Actions(), 3))
	assert.Check(t, is.Equal(aws.ec2.State(testGatewayID), "running"))

	ud, aws = agentFixture(t, 0, withGateway, fakeaws.IMDSInstance{})
	aws.ec2.AddInstances(fakeaws.EC2Instance{ID: testGatewayID, State: "running"})
	aws.ec2.Fail(-1, 403, "UnauthorizedOperation")
	run = newAgentEnv(t, ud, aws, nil, nil).run(t, AgentPath, "wake-gateway")
	assert.Check(t, is.Equal(run.exitCode, 1))
	assert.Check(t, is.DeepEqual(FailedLines(run.stderr), []string{"dynk8s-wake-gateway: FAILED: cannot start gateway " +
		testGatewayID + ": EC2 StartInstances: HTTP 403 UnauthorizedOperation: fake EC2 says no"}))
	assert.Check(t, is.Len(aws.ec2.Actions(), 1))
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
	}).run(t, AgentPath, "join")
	assert.Check(t, is.Equal(run.exitCode, 1))
	assert.Check(t, is.Len(FailedLines(run.stderr), 1), run.stderr)
	assert.Check(t, is.Contains(run.stderr, `unknown key "poolNmae"`))
	assert.Check(t, is.Equal(aws.imds.Requests(), 0))
}

// --dry-run -v, for an operator on a node: it reads IMDS and the token, prints the JoinConfiguration with the token
// hidden, and changes nothing: no command runs, no lifecycle action is completed, no file is written.
func TestAgentDryRun(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, withHook, fakeaws.IMDSInstance{LifecycleState: "InService"})
	aws.asg.Hold()
	run := newAgentEnv(t, ud, aws, nil, nil).run(t, AgentPath, "join", "--dry-run", "-v")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Equal(run.file("calls"), ""), "a command ran")
	assert.Check(t, aws.asg.Pending(), "the lifecycle action was completed")
	assert.Check(t, is.Contains(run.stderr, "dry run: would run dnf install -y"))
	assert.Check(t, is.Contains(run.stderr, "dry run: would run kubeadm join --config"))
	assert.Check(t, is.Contains(run.stderr, "token: <the token from SSM>"))
	assert.Check(t, is.Contains(run.stderr, "dry run: would complete the lifecycle action of hook "+testHook+" with CONTINUE"))
	assert.Check(t, !strings.Contains(run.stderr, testToken), "the token is in the log")
	_, err := os.Stat(filepath.Join(run.root, "run/dynk8s"))
	assert.Check(t, os.IsNotExist(err), "the dry run wrote under /run/dynk8s")
	_, err = os.Stat(filepath.Join(run.root, "var/lib/kubelet"))
	assert.Check(t, os.IsNotExist(err), "the dry run wrote the kubelet's key")
	assert.Check(t, is.Len(aws.ec2.TagCalls(), 0), "the dry run tagged the instance")
}

func withHook(in *nodeconfig.Node) { in.LaunchHook = testHook }

// reboot is what a stop and start leaves of the node's files: /run is a tmpfs.
func reboot(t *testing.T, root string) {
	t.Helper()
	assert.NilError(t, os.RemoveAll(filepath.Join(root, "run")))
}

// readTimeline is ReadTimeline of the run, on a node whose /proc/uptime says 42.5 s.
func readTimeline(t *testing.T, run scriptRun) Timeline {
	t.Helper()
	return ReadTimeline(t, run.root, run.elapsed, testUptime)
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

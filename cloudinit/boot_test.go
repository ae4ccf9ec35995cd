package cloudinit

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/fakeimds"
)

// The boot's two phases, its hand-back to the group, its AWS endpoints and signing, the kernel checks and the
// timeline: join.sh run against the fakes (fakes_test.go).

const testHook = "dynk8s-launch"

// timeline is /run/dynk8s/timeline.json as join.sh writes it.
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

func readTimeline(t *testing.T, run scriptRun) timeline {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(run.root, "run/dynk8s/timeline.json"))
	assert.NilError(t, err)
	var tl timeline
	dec := json.NewDecoder(strings.NewReader(string(b)))
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
	assert.Check(t, tl.TotalSeconds <= run.elapsed.Seconds(), "total %.3f s, but the script ran %s", tl.TotalSeconds, run.elapsed)
	// The fake /proc/uptime says 42.5 s when the script ends.
	if assert.Check(t, tl.StartedSecondsAfterBoot != nil) {
		assert.Check(t, *tl.StartedSecondsAfterBoot > 0 && *tl.StartedSecondsAfterBoot <= 42.5)
	}
	return tl
}

func withHook(in *NodeInput) { in.LaunchHook = testHook }

// reboot is what a stop and start leaves of the node's files: /run is a tmpfs.
func reboot(t *testing.T, root string) {
	t.Helper()
	assert.NilError(t, os.RemoveAll(filepath.Join(root, "run")))
}

// A warm pool: the first boot (Warmed:Stopped) prepares, pre-pulls and completes the launch hook's action, and
// neither reads the token nor joins; the group stops the instance. When the group moves it into service it starts
// again: that boot skips the preparation and joins, then completes the action the hook holds it in once more. A
// third boot does nothing.
func TestBootPreparesInTheWarmPoolThenJoins(t *testing.T) {
	t.Parallel()
	ud, aws := bootFixture(t, 0, withHook, fakeimds.Instance{LifecycleState: "Warmed:Stopped"})
	aws.pendingAction = true
	env := newScriptEnv(t, ud, aws, nil, nil)

	warm := env.run(t, joinScript)
	assert.Equal(t, warm.exitCode, 0)
	calls := warm.file("calls")
	assert.Check(t, is.Contains(calls, "dnf install"))
	assert.Check(t, is.Contains(calls, "systemctl enable --now crio.service"))
	assert.Check(t, is.Contains(calls, "crictl --runtime-endpoint unix:///var/run/crio/crio.sock pull registry.k8s.io/pause:3.10.1"))
	assert.Check(t, !strings.Contains(calls, "\nkubeadm "), "kubeadm ran in the warm pool")
	assert.Check(t, !strings.Contains(calls, imdsUnitName), "the metadata lock was started before the join")
	assert.Check(t, !strings.Contains(calls, "swapoff"), "swap turned off while preparing (a hibernating warm pool needs it)")
	assert.Check(t, is.Contains(calls, "sysctl -q -e --system\n"), "the sysctls cloud-init wrote were not applied")
	assert.Check(t, is.Equal(aws.ssmRequests, 0), "the token was read in the warm pool")
	assert.Check(t, is.DeepEqual(aws.autoscalingCalls(), []string{
		"DescribeAutoScalingInstances InstanceIds.member.1=" + fakeInstanceID,
		"CompleteLifecycleAction AutoScalingGroupName=" + fakeGroup + " InstanceId=" + fakeInstanceID +
			" LifecycleActionResult=CONTINUE LifecycleHookName=" + testHook,
	}))
	assert.Check(t, !aws.pendingAction, "the launch hook still holds the instance")
	assert.Check(t, is.Contains(warm.stderr, "prepared in the warm pool"))
	tl := readTimeline(t, warm)
	assert.Check(t, is.Equal(tl.Result, "prepared"))
	assert.Check(t, is.Equal(tl.Mode, "prepare"))
	assert.Check(t, is.DeepEqual(tl.phaseNames(), []string{"identity", "kernel", "packages", "crio", "pre-pull", "lifecycle"}))
	_, err := os.Stat(filepath.Join(env.root, "var/lib/dynk8s/prepared"))
	assert.Check(t, err, "no marker of the preparation")

	start := startFromTheWarmPool(t, env, aws)
	assert.Equal(t, start.exitCode, 0)
	calls = start.file("calls")
	assert.Check(t, !strings.Contains(calls, "dnf "), "packages installed again")
	assert.Check(t, !strings.Contains(calls, "crictl"), "images pulled again")
	assert.Check(t, is.Contains(calls, "systemctl start crio.service\n"))
	assert.Check(t, is.Contains(calls, "kubeadm join"))
	checkLocksBeforeJoin(t, calls)
	assert.Check(t, is.Contains(start.stderr, "prepared on an earlier boot"))
	asg := aws.autoscalingCalls()
	assert.Check(t, is.Equal(asg[len(asg)-1], "CompleteLifecycleAction AutoScalingGroupName="+fakeGroup+" InstanceId="+
		fakeInstanceID+" LifecycleActionResult=CONTINUE LifecycleHookName="+testHook))
	assert.Check(t, !aws.pendingAction)
	tl = readTimeline(t, start)
	assert.Check(t, is.Equal(tl.Result, "joined"))
	assert.Check(t, is.DeepEqual(tl.phaseNames(), []string{"identity", "crio", "checks", "token", "api-server",
		"kubeadm-join", "lifecycle"}))

	reboot(t, env.root)
	assert.NilError(t, os.Remove(filepath.Join(env.stubDir, "calls")))
	again := env.run(t, joinScript)
	assert.Equal(t, again.exitCode, 0)
	assert.Check(t, is.Contains(again.stderr, "already joined"))
	assert.Check(t, is.Equal(again.file("calls"), ""))
}

// A warm instance keeps the user data it was launched with: when the group launches a newer launch template version
// by the time the instance enters service (a `pulumi up` replaced the gateway, or changed the CA pin or the
// version), its boot abandons the launch hook's action instead of joining with stale values, and the group replaces
// it (AWS N2). One of the current version joins; an answer without versions lets it join too.
func TestBootHandsBackAStaleWarmInstance(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		instance, group, result string
	}{
		"stale":   {"3", "4", "stale"},
		"current": {"4", "4", "joined"},
		"unknown": {"", "", "joined"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ud, aws := bootFixture(t, 0, withHook, fakeimds.Instance{LifecycleState: "Warmed:Stopped"})
			aws.pendingAction = true
			aws.instanceVersion, aws.groupVersion = c.instance, c.group
			env := newScriptEnv(t, ud, aws, nil, nil)
			assert.Equal(t, env.run(t, joinScript).exitCode, 0)

			start := startFromTheWarmPool(t, env, aws)
			assert.Equal(t, start.exitCode, 0)
			assert.Check(t, is.Equal(readTimeline(t, start).Result, c.result))
			asg := aws.autoscalingCalls()
			last := asg[len(asg)-1]
			if c.result == "stale" {
				assert.Check(t, is.Contains(start.stderr, "launched from version 3 of the launch template; the group launches version 4"))
				assert.Check(t, is.Equal(last, "CompleteLifecycleAction AutoScalingGroupName="+fakeGroup+" InstanceId="+
					fakeInstanceID+" LifecycleActionResult=ABANDON LifecycleHookName="+testHook))
				assert.Check(t, !strings.Contains(start.file("calls"), "kubeadm"), "a stale instance joined")
				assert.Check(t, is.Equal(aws.ssmRequests, 0), "a stale instance read the token")
				return
			}
			assert.Check(t, is.Contains(start.file("calls"), "kubeadm join"))
			assert.Check(t, is.Equal(last, "CompleteLifecycleAction AutoScalingGroupName="+fakeGroup+" InstanceId="+
				fakeInstanceID+" LifecycleActionResult=CONTINUE LifecycleHookName="+testHook))
		})
	}
}

// A warm pool that waits Running (or Hibernated): the instance prepares once and then waits without a boot while
// dynk8s-join.timer runs the join every 15 s; those runs return at once, quietly, touching nothing. When the group
// puts the instance in service, the next run joins, on the same boot.
func TestBootWaitsRunningInTheWarmPoolThenJoins(t *testing.T) {
	t.Parallel()
	ud, aws := bootFixture(t, 0, withHook, fakeimds.Instance{LifecycleState: "Warmed:Running"})
	aws.pendingAction = true
	env := newScriptEnv(t, ud, aws, nil, nil)
	warm := env.run(t, joinScript)
	assert.Equal(t, warm.exitCode, 0)
	assert.Check(t, is.Equal(readTimeline(t, warm).Result, "prepared"))
	timeline, err := os.ReadFile(filepath.Join(env.root, "run/dynk8s/timeline.json"))
	assert.NilError(t, err)
	asgCalls := len(aws.autoscalingCalls())

	assert.NilError(t, os.Remove(filepath.Join(env.stubDir, "calls")))
	for range 3 {
		tick := env.run(t, joinScript)
		assert.Equal(t, tick.exitCode, 0)
		assert.Check(t, is.Equal(tick.stderr, ""), "a waiting run logs nothing")
	}
	if calls, err := os.ReadFile(filepath.Join(env.stubDir, "calls")); err == nil {
		for _, cmd := range []string{"dnf", "systemctl", "crictl", "kubeadm", "sysctl", "modprobe", "swapoff"} {
			assert.Check(t, !strings.Contains(string(calls), cmd), "a waiting run ran %s:\n%s", cmd, calls)
		}
	}
	assert.Check(t, is.Len(aws.autoscalingCalls(), asgCalls), "a waiting run called Auto Scaling")
	again, err := os.ReadFile(filepath.Join(env.root, "run/dynk8s/timeline.json"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(again), string(timeline)), "a waiting run rewrote the timeline")

	aws.imds.SetLifecycleState("InService")
	aws.mu.Lock()
	aws.pendingAction = true
	aws.mu.Unlock()
	join := env.run(t, joinScript)
	assert.Equal(t, join.exitCode, 0)
	assert.Check(t, is.Contains(join.file("calls"), "kubeadm join"))
	checkLocksBeforeJoin(t, join.file("calls"))
	stop := strings.Index(join.file("calls"), "systemctl disable --now --no-block "+joinTimerName+"\n")
	assert.Check(t, stop > strings.Index(join.file("calls"), "kubeadm join"), "the joined node's timer was not stopped "+
		"after the join:\n%s", join.file("calls"))
	assert.Check(t, is.Equal(readTimeline(t, join).Result, "joined"))
}

// checkLocksBeforeJoin: every join (a boot's, or the timer's on a Running or Hibernated warm instance, which has no
// boot) loads the metadata lockdown before kubeadm join starts the kubelet, and waits for it: a lockdown that fails
// stops the join with its reason (TestJoinStopsWhenTheLockdownFails). Swap goes off there too, not while preparing.
// After the join, the warm pool's timer is stopped and disabled (it would fire every 15 s for the node's life).
func checkLocksBeforeJoin(t *testing.T, calls string) {
	t.Helper()
	join := strings.Index(calls, "kubeadm join")
	lock := strings.Index(calls, "systemctl start "+imdsUnitName+"\n")
	swap := strings.Index(calls, "swapoff -a\n")
	assert.Check(t, lock >= 0, "join.sh did not start %s:\n%s", imdsUnitName, calls)
	assert.Check(t, join > lock, "join.sh did not start %s before kubeadm join:\n%s", imdsUnitName, calls)
	assert.Check(t, swap >= 0 && join > swap, "join.sh did not turn swap off before kubeadm join:\n%s", calls)
}

// The phase decision for every target lifecycle state IMDS can return ("" is an instance whose IMDS has none).
func TestBootFollowsTheLifecycleState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		state, hook string
		result      string // the timeline's; "" when the script fails
		failure     string
	}{
		{state: "InService", result: "joined"},
		{state: "InService", hook: testHook, result: "joined"},
		{state: "", result: "joined"},
		{state: "Warmed:Stopped", hook: testHook, result: "prepared"},
		{state: "Warmed:Running", hook: testHook, result: "prepared"},
		{state: "Warmed:Hibernated", hook: testHook, result: "prepared"},
		{state: "Warmed:Stopped", result: "prepared"},
		{state: "Warmed:Terminated", result: "skipped"},
		{state: "Terminated", result: "skipped"},
		{state: "Detached", result: "skipped"},
		{state: "Standby", result: "skipped"},
		{state: "", hook: testHook, failure: "target-lifecycle-state: HTTP 404 (a group with launch hook " + testHook + " sets it)"},
		{state: "Pending:Wait", failure: "IMDS returned an unexpected LIFECYCLE: 'Pending:Wait'"},
	} {
		t.Run(tc.state+"/"+tc.hook, func(t *testing.T) {
			t.Parallel()
			modify := func(in *NodeInput) { in.LaunchHook = tc.hook }
			ud, aws := bootFixture(t, 0, modify, fakeimds.Instance{LifecycleState: tc.state})
			aws.pendingAction = tc.hook != ""
			run := runScript(t, ud, joinScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "3"}, nil)
			calls := run.file("calls")
			if tc.failure != "" {
				assert.Check(t, run.exitCode != 0)
				failed := failedLines(run.stderr)
				assert.Assert(t, is.Len(failed, 1), run.stderr)
				assert.Check(t, is.Contains(failed[0], tc.failure))
				assert.Check(t, !strings.Contains(calls, "dnf "), "prepared without knowing the state")
				return
			}
			assert.Equal(t, run.exitCode, 0)
			assert.Check(t, is.Equal(readTimeline(t, run).Result, tc.result))
			assert.Check(t, is.Equal(strings.Contains(calls, "dnf install"), tc.result != "skipped"), "dnf: %s", calls)
			assert.Check(t, is.Equal(strings.Contains(calls, "kubeadm join"), tc.result == "joined"), "kubeadm: %s", calls)
			completed := false
			for _, c := range aws.autoscalingCalls() {
				completed = completed || strings.HasPrefix(c, "CompleteLifecycleAction")
			}
			assert.Check(t, is.Equal(completed, tc.hook != "" && tc.result != "skipped"))
		})
	}
}

// A reboot of an InService node that has not joined: no lifecycle action waits any more; that is not an error.
func TestBootWithNoPendingLifecycleAction(t *testing.T) {
	t.Parallel()
	ud, aws := bootFixture(t, 0, withHook, fakeimds.Instance{LifecycleState: "InService"})
	run := runScript(t, ud, joinScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "no lifecycle action of hook "+testHook+" waits for this instance"))
	assert.Check(t, is.Len(failedLines(run.stderr), 0))
}

// A boot that runs out of time when no lifecycle action waits (a reboot of an instance already in service) does
// not hand the instance back either: no SetInstanceHealth.
func TestBootNeverMarksItselfUnhealthy(t *testing.T) {
	t.Parallel()
	ud, aws := bootFixture(t, 0, withHook, fakeimds.Instance{LifecycleState: "InService"})
	aws.ssmFailures = -1
	run := runScript(t, ud, joinScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, nil)
	assert.Check(t, run.exitCode != 0)
	for _, call := range aws.autoscalingCalls() {
		assert.Check(t, !strings.HasPrefix(call, "SetInstanceHealth"), "the instance was handed back: %s", call)
	}
	assert.Check(t, is.Contains(run.stderr, "no lifecycle action of hook "+testHook+" waits for this instance"))
}

// A boot that runs out of time in a group with a launch hook completes the hook's action with CONTINUE, not
// ABANDON: the group keeps the instance, and the hook's own timeout (default result ABANDON) cannot replace it
// either, so a fault every instance meets (here the package repositories) does not become an endless replace loop;
// the autoscaler's max-node-provision-time decides, in service as in the warm pool.
func TestBootCompletesTheLifecycleActionOnGivingUp(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"Warmed:Stopped", "InService"} {
		ud, aws := bootFixture(t, 0, withHook, fakeimds.Instance{LifecycleState: state})
		aws.pendingAction = true
		run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_DNF_NEEDS_REPO": "no-such-repo",
			"DYNK8S_DEADLINE_SECONDS": "2"}, nil)
		assert.Check(t, run.exitCode != 0, state)
		assert.Assert(t, is.Len(failedLines(run.stderr), 1), run.stderr)
		assert.Check(t, is.DeepEqual(aws.autoscalingCalls(), []string{
			"DescribeAutoScalingInstances InstanceIds.member.1=" + fakeInstanceID,
			"CompleteLifecycleAction AutoScalingGroupName=" + fakeGroup + " InstanceId=" + fakeInstanceID +
				" LifecycleActionResult=CONTINUE LifecycleHookName=" + testHook,
		}), state)
		assert.Check(t, !aws.pendingAction, "%s: the hook still holds the instance (its timeout would abandon it)", state)
		assert.Check(t, is.Contains(run.stderr, "completed the lifecycle action of hook "+testHook+" with CONTINUE"), state)
		assert.Check(t, is.Equal(readTimeline(t, run).Result, "failed"), state)
	}
}

// The endpoints follow the partition's DNS suffix from IMDS: in China, ssm.<region>.amazonaws.com.cn and
// autoscaling.<region>.amazonaws.com.cn. (The stub curl routes those names to the fakes, as DNS would.)
func TestBootDerivesEndpointsFromTheDomain(t *testing.T) {
	t.Parallel()
	ud, aws := bootFixture(t, 0, withHook, fakeimds.Instance{Domain: "amazonaws.com.cn", LifecycleState: "InService"})
	aws.pendingAction = true
	run := runScript(t, ud, joinScript, aws, map[string]string{
		"DYNK8S_SSM_ENDPOINT": "", "DYNK8S_AUTOSCALING_ENDPOINT": "",
		"STUB_ROUTE_SSM": aws.ssm.URL + "/", "STUB_ROUTE_AUTOSCALING": aws.asg.URL + "/",
	}, nil)
	assert.Equal(t, run.exitCode, 0)
	endpoints := strings.Split(strings.TrimSpace(run.file("endpoints")), "\n")
	assert.Check(t, is.DeepEqual(endpoints, []string{
		"https://ssm.eu-central-1.amazonaws.com.cn/",
		"https://autoscaling.eu-central-1.amazonaws.com.cn/",
		"https://autoscaling.eu-central-1.amazonaws.com.cn/",
	}))
	assert.Check(t, !aws.pendingAction)
}

// A curl older than 7.75 (or built without AWS support) cannot sign: the aws CLI reads the token instead, with the
// instance role it finds itself, so no credential is on its command line.
func TestBootFallsBackToTheAWSCLI(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_CURL_NO_SIGV4": "1",
		"STUB_AWS_PARAMETER_VALUE": testToken}, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "curl cannot sign AWS requests (no --aws-sigv4: curl older than 7.75 or built without it); using aws"))
	assert.Check(t, is.Contains(run.file("calls"), "aws ssm get-parameter --name "+testTokenParameter+
		" --with-decryption --query Parameter.Value --region eu-central-1 --output text --endpoint-url "+aws.ssm.URL+"\n"))
	assert.Check(t, is.Equal(aws.ssmRequests, 0))
	assert.Check(t, is.Equal(parseJoinConfig(t, run.file("join-config.yaml")).Discovery.BootstrapToken.Token, testToken))
	for _, secret := range []string{testToken, fakeSecretKey, fakeSession} {
		assert.Check(t, !strings.Contains(run.file("calls"), secret), "a secret is in some command's argv")
	}
}

// Neither a signing curl nor the aws CLI: one reason, at once.
func TestBootFailsWithoutAnyWayToSign(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_CURL_NO_SIGV4": "1",
		"DYNK8S_AWS_CLI": "dynk8s-no-such-aws"}, nil)
	assert.Check(t, run.exitCode != 0)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "curl cannot sign AWS requests (no --aws-sigv4: curl older than 7.75 or "+
		"built without it) and there is no dynk8s-no-such-aws CLI to fall back to"))
	assert.Check(t, is.Len(aws.autoscalingCalls(), 0), "a hard error is not handed back")

	// In a group with a launch hook, completing the action cannot be signed either: still one reason, the first.
	ud, aws = bootFixture(t, 0, withHook, fakeimds.Instance{LifecycleState: "InService"})
	run = runScript(t, ud, joinScript, aws, map[string]string{"STUB_CURL_NO_SIGV4": "1",
		"DYNK8S_AWS_CLI": "dynk8s-no-such-aws"}, nil)
	assert.Check(t, run.exitCode != 0)
	assert.Check(t, is.Len(failedLines(run.stderr), 1), run.stderr)
	assert.Check(t, is.Contains(run.stderr, "while failing: curl cannot sign AWS requests"))
}

// A kernel without br_netfilter: the boot says so, installs kernel-modules-extra of the running kernel from Fedora's
// release repository (only then; a GA image runs the release's kernel), loads the module and applies the sysctls.
func TestBootInstallsMissingKernelModules(t *testing.T) {
	t.Parallel()
	uname, err := exec.Command("uname", "-r").Output()
	assert.NilError(t, err)
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_MODULES_MISSING": "br_netfilter"}, nil)
	assert.Equal(t, run.exitCode, 0)
	calls := run.file("calls")
	assert.Check(t, is.Contains(run.stderr, "kernel modules missing: br_netfilter; installing kernel-modules-extra-"))
	assert.Check(t, is.Contains(calls, "modprobe br_netfilter\ndnf install -y "+dnfOptions+
		" --repo=fedora kernel-modules-extra-"+strings.TrimSpace(string(uname))+"\nmodprobe br_netfilter\n"+
		"sysctl -q -e --system\n"))
	assert.Check(t, !strings.Contains(run.stderr, "still missing"))
}

// A module that stays missing (say, a kernel the repositories no longer carry) is logged; the join goes on, since
// kubeadm join does not check it.
func TestBootJoinsWithoutAModuleKubeadmDoesNotNeed(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_MODULES_MISSING": "br_netfilter",
		"STUB_DNF_NEEDS_REPO": "dynk8s-kubernetes"}, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "installing kernel-modules-extra failed: dnf install exited 1"))
	// The release repository first, then its updates (a kernel newer than the GA image's), then the join goes on.
	assert.Check(t, is.Contains(run.file("calls"), " --repo=fedora kernel-modules-extra-"))
	assert.Check(t, is.Contains(run.file("calls"), " --repo=fedora --repo=updates kernel-modules-extra-"))
	assert.Check(t, is.Contains(run.stderr, "still missing kernel modules: br_netfilter (kubeadm join does not need them"))
	assert.Check(t, is.Contains(run.file("calls"), "kubeadm join"))
}

// kubeadm join's preflight fails without IPv4 forwarding (for an IPv4 API endpoint); the boot names it first.
func TestBootNeedsIPForwarding(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, nil, func(root string) {
		assert.NilError(t, os.WriteFile(filepath.Join(root, "proc/sys/net/ipv4/ip_forward"), []byte("0\n"), 0o644))
	})
	assert.Check(t, run.exitCode != 0)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "kubeadm join needs net.ipv4.ip_forward = 1 (preflight FileContent check)"))
	calls := run.file("calls")
	assert.Check(t, is.Contains(calls, "sysctl -q -w net.ipv4.ip_forward=1"), "no attempt to set it")
	assert.Check(t, !strings.Contains(calls, "\nkubeadm "), "kubeadm ran")
}

// The pool's images, then pause and kube-proxy, are pulled in the background once CRI-O runs: the token, the probe
// and the join go on meanwhile, and a failed pull does not fail the boot.
func TestBootPrePullsWhileJoining(t *testing.T) {
	t.Parallel()
	ud, aws := bootFixture(t, 0, func(in *NodeInput) {
		in.PrePullImages = []string{"quay.io/example/agent:2.1", "busybox", "registry.k8s.io/pause:3.10.1"}
	}, fakeimds.Instance{})
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_CRICTL_AWAIT_JOIN": "1",
		"STUB_CRICTL_FAILS": "docker.io/library/busybox:latest"}, nil)
	assert.Equal(t, run.exitCode, 0)
	var pulls []string
	join, lastPull := -1, -1
	for i, c := range strings.Split(run.file("calls"), "\n") {
		if img, ok := strings.CutPrefix(c, "crictl --runtime-endpoint unix:///var/run/crio/crio.sock pull "); ok {
			pulls = append(pulls, img)
			lastPull = i
		}
		if strings.HasPrefix(c, "kubeadm join") && join < 0 {
			join = i
		}
	}
	assert.Check(t, is.DeepEqual(pulls, []string{"registry.k8s.io/pause:3.10.1", "registry.k8s.io/kube-proxy:v1.34.4",
		"quay.io/example/agent:2.1", "docker.io/library/busybox:latest"}))
	assert.Check(t, join >= 0 && join < lastPull, "kubeadm join (call %d) waited for the pulls (last at call %d)", join, lastPull)
	assert.Check(t, is.Contains(run.stderr, "pre-pull of docker.io/library/busybox:latest failed (exit 1)"))
	assert.Check(t, is.Contains(run.stderr, "(4 images, 1 failed)"))
	tl := readTimeline(t, run)
	assert.Check(t, is.Equal(tl.Result, "joined"))
	assert.Check(t, is.Equal(tl.Phases[len(tl.Phases)-1].Name, "pre-pull"), "%+v", tl.Phases)
}

// startFromTheWarmPool is the prepared instance's start into service: a new boot (run markers gone), IMDS saying
// InService, a launch lifecycle action pending, and the join run again from a fresh record of calls.
func startFromTheWarmPool(t *testing.T, env *scriptEnv, aws *fakeAWS) scriptRun {
	t.Helper()
	reboot(t, env.root)
	aws.imds.SetLifecycleState("InService")
	aws.mu.Lock()
	aws.pendingAction = true
	aws.mu.Unlock()
	assert.NilError(t, os.Remove(filepath.Join(env.stubDir, "calls")))
	return env.run(t, joinScript)
}

package cloudinit

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/fakeimds"
	"github.com/dynk8s/dynk8s/internal/nodeconfig"
)

const (
	testTokenParameter = "/dynk8s/test/join-token"
	testToken          = "k7x2qa.0f9e8d7c6b5a4z3y"
	joinScript         = libexecDir + "/join.sh"
	// dnfOptions are the options of every dnf transaction of the boot.
	dnfOptions = "--setopt=install_weak_deps=False --setopt=tsflags=nodocs --setopt=max_parallel_downloads=10"
)

// joinFixture renders the spot pool's user data pointing at a fake API server (which first drops apiDrops
// connections) and returns it with a fake AWS serving the join token.
func joinFixture(t *testing.T, apiDrops int) ([]byte, *fakeAWS) {
	t.Helper()
	return bootFixture(t, apiDrops, nil, fakeimds.Instance{})
}

// bootFixture is joinFixture with the pool changed by modify (when set) and the instance's domain and lifecycle
// state from inst.
func bootFixture(t *testing.T, apiDrops int, modify func(*NodeInput), inst fakeimds.Instance) ([]byte, *fakeAWS) {
	t.Helper()
	api := newFakeAPIServer(t, apiDrops)
	u, err := url.Parse(api.URL)
	assert.NilError(t, err)
	in := spotPool()
	in.APIServerEndpoint = u.Host
	in.JoinTokenParameter = testTokenParameter
	if modify != nil {
		modify(&in)
	}
	ud, err := Node(in)
	assert.NilError(t, err)
	return ud, newFakeAWSIn(t, map[string]string{testTokenParameter: testToken}, inst)
}

func failedLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "FAILED") {
			out = append(out, l)
		}
	}
	return out
}

// Every network step fails at first; the script retries each and joins, and kubeadm gets the JoinConfiguration
// with the token from SSM and the identity from IMDS.
func TestJoinRetriesThenJoins(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 2)
	aws.imds.FailTokens(2)
	aws.ssmFailures = 1
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_KUBEADM_FAILURES": "1"}, func(root string) {
		dir := filepath.Join(root, "etc/cni/net.d")
		assert.NilError(t, os.MkdirAll(dir, 0o755))
		for _, f := range []string{"11-crio-ipv4-bridge.conflist", "10-calico.conflist"} {
			assert.NilError(t, os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644))
		}
	})
	assert.Equal(t, run.exitCode, 0)
	jc := parseJoinConfig(t, run.file("join-config.yaml"))
	for step, attempts := range map[string]int{
		"read instance identity from IMDS":                                         3,
		"read the join token from SSM parameter " + testTokenParameter:             2,
		"reach the API server at " + jc.Discovery.BootstrapToken.APIServerEndpoint: 3,
		"kubeadm join": 2,
	} {
		assert.Check(t, is.Contains(run.stderr, step+": attempt 1 failed"))
		assert.Check(t, is.Contains(run.stderr, fmt.Sprintf("%s: succeeded on attempt %d\n", step, attempts)))
	}
	assert.Check(t, is.Contains(run.stderr, "IMDSv2 token: HTTP 503"))
	assert.Check(t, is.Contains(run.stderr, "HTTP 400 AccessDeniedException"))
	assert.Check(t, is.Contains(run.stderr, "API server answered HTTP 200"))
	assert.Check(t, is.Len(failedLines(run.stderr), 0))

	calls := run.file("calls")
	// One transaction, from the pinned repos only: the image has the system packages, so no Fedora metadata.
	assert.Check(t, is.Contains(calls, "dnf install -y "+dnfOptions+" --repo=dynk8s-kubernetes --repo=dynk8s-cri-o "+
		"kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*\n"))
	assert.Check(t, is.Equal(strings.Count(calls, "dnf install"), 1), "one package transaction")
	assert.Check(t, is.Contains(run.stderr, "the image has container-selinux iptables nftables (rpm -q): no Fedora "+
		"repository metadata needed"))
	assert.Check(t, !strings.Contains(calls, "kernel-modules-extra"), "the kernel has its modules: nothing to install")
	// umask 077 is for the token's file only: dnf (and its scriptlets) run with the unit's umask.
	assert.Check(t, !strings.Contains(run.file("dnf-umask"), "0077"), "dnf ran under umask %s", run.file("dnf-umask"))
	assert.Check(t, is.Contains(calls, "systemctl enable --now crio.service\n"))
	assert.Check(t, is.Contains(calls, "systemctl enable kubelet.service\n"))
	joinCmd := "kubeadm join --config " + filepath.Join(run.root, "run/dynk8s/kubeadm-join.yaml") + "\n"
	assert.Check(t, is.Contains(calls, joinCmd+"kubeadm reset --force\n"), "a failed join is reset before the next")
	assert.Check(t, is.Equal(strings.Count(calls, joinCmd), 2))
	checkLocksBeforeJoin(t, calls)

	bt := jc.Discovery.BootstrapToken
	assert.Check(t, is.Equal(bt.Token, testToken))
	assert.Check(t, is.DeepEqual(bt.CACertHashes, []string{testCAHash}))
	assert.Check(t, strings.HasPrefix(bt.APIServerEndpoint, "127.0.0.1:"))
	assert.Check(t, is.Equal(jc.NodeRegistration.CRISocket, "unix:///var/run/crio/crio.sock"))
	assert.Check(t, is.DeepEqual(jc.NodeRegistration.KubeletExtraArgs, []kubeletArg{
		{Name: "node-ip", Value: fakeNodeIP},
		{Name: "node-labels", Value: "dynk8s.io/capacity-type=spot,dynk8s.io/pool=spot-arm64,node.kubernetes.io/instance-type=m7g.large," +
			"node.kubernetes.io/lifecycle=spot,topology.kubernetes.io/region=eu-central-1,topology.kubernetes.io/zone=eu-central-1a"},
		{Name: "provider-id", Value: "aws:///eu-central-1a/i-0123456789abcdef0"},
	}))
	assert.Check(t, is.DeepEqual(jc.NodeRegistration.Taints, []nodeconfig.Taint{{Key: "dynk8s.io/capacity-type", Value: "spot", Effect: "NoSchedule"}}))
	assert.Check(t, is.Equal(strings.TrimSpace(run.file("join-config.mode")), "600"))
	_, err := os.Stat(filepath.Join(run.root, "run/dynk8s/kubeadm-join.yaml"))
	assert.Check(t, os.IsNotExist(err), "the rendered JoinConfiguration (with the token) is left in /run: %v", err)

	_, err = os.Stat(filepath.Join(run.root, "etc/cni/net.d/11-crio-ipv4-bridge.conflist"))
	assert.Check(t, os.IsNotExist(err), "CRI-O's default bridge conflist survived")
	_, err = os.Stat(filepath.Join(run.root, "etc/cni/net.d/10-calico.conflist"))
	assert.Check(t, err, "the cluster CNI's conflist was removed")

	// The secrets never appear on a command line or in the log.
	for _, secret := range []string{testToken, fakeSecretKey, fakeSession} {
		assert.Check(t, !strings.Contains(calls, secret), "a secret is in some command's argv")
		assert.Check(t, !strings.Contains(run.stderr, secret), "a secret is in the log")
		assert.Check(t, !strings.Contains(run.file("journal"), secret), "a secret is in the journal")
	}
	assert.Check(t, is.Contains(run.file("journal"), "joined the cluster as "+fakeInstanceID), "outside systemd the log also goes to logger")

	// The timeline: each phase in the log and, with the result, in /run/dynk8s/timeline.json.
	tl := readTimeline(t, run)
	assert.Check(t, is.Equal(tl.Result, "joined"))
	assert.Check(t, is.Equal(tl.Mode, "join"))
	assert.Check(t, is.Equal(tl.LifecycleState, "InService"))
	assert.Check(t, is.Equal(tl.InstanceID, fakeInstanceID))
	assert.Check(t, is.DeepEqual(tl.phaseNames(), []string{"identity", "kernel", "packages", "crio", "checks", "token",
		"api-server", "kubeadm-join", "pre-pull"}))
	for _, p := range tl.Phases {
		assert.Check(t, is.Contains(run.stderr, "phase="+p.Name+" took="))
	}
	assert.Check(t, is.Contains(run.stderr, "timeline: result=joined mode=join total="))

	// The node joined: running the script again does nothing at all.
	aws.mu.Lock()
	before := aws.imds.Requests()
	aws.mu.Unlock()
	again := run.env.run(t, joinScript)
	assert.Equal(t, again.exitCode, 0)
	assert.Check(t, is.Contains(again.stderr, "already joined"))
	aws.mu.Lock()
	assert.Check(t, is.Equal(aws.imds.Requests(), before))
	aws.mu.Unlock()
}

// The image lacks system dependencies (a stock Fedora Cloud image has neither container-selinux nor nftables): they
// join the upstream packages' one transaction, from Fedora's release repository alone, which matches the GA image
// the stack boots (no updates metadata, no selinux-policy upgrade). The lockdown's nft is among them.
func TestJoinInstallsMissingSystemPackagesFromTheRelease(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_RPM_MISSING": "container-selinux nftables"}, nil)
	assert.Equal(t, run.exitCode, 0)
	calls := run.file("calls")
	assert.Check(t, is.Contains(calls, "dnf install -y "+dnfOptions+" --repo=dynk8s-kubernetes --repo=dynk8s-cri-o "+
		"--repo=fedora kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.* container-selinux nftables\n"))
	assert.Check(t, is.Equal(strings.Count(calls, "dnf install"), 1), "one package transaction")
	assert.Check(t, !strings.Contains(calls, "--repo=updates"), "updates' metadata read on a GA image")
	assert.Check(t, is.Contains(run.stderr, "the image lacks container-selinux nftables (rpm -q): Fedora's release "+
		"repository joins the transaction"))
}

// A transaction that fails (a dependency none foresaw, or an image newer than GA) is retried with Fedora's
// repositories and their updates; the upstream repos' priority still keeps Fedora's cri-o out
// (TestNodeRoundTrip checks the priority).
func TestJoinFallsBackToFedoraUpdates(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_DNF_NEEDS_REPO": "updates"}, nil)
	assert.Equal(t, run.exitCode, 0)
	calls := run.file("calls")
	upstream := "dnf install -y " + dnfOptions + " --repo=dynk8s-kubernetes --repo=dynk8s-cri-o"
	assert.Check(t, is.Contains(calls, upstream+" kubelet-1.34.4"))
	assert.Check(t, is.Contains(calls, upstream+" --repo=fedora --repo=updates kubelet-1.34.4"))
	assert.Check(t, is.Equal(strings.Count(calls, "dnf install"), 2))
	assert.Check(t, is.Contains(run.stderr, "the next attempt adds Fedora's repositories and their updates"))
}

// The join trusts only the pinned cluster CA: kubeadm gets the pin in the JoinConfiguration, which does not skip
// the check (unsafeSkipCAVerification), and no flag on its command line that skips or replaces the pin. A
// rotator-key holder who writes a token can then point no node at an API server of its own.
func TestJoinPinsTheClusterCA(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0, run.stderr)
	jc := parseJoinConfig(t, run.file("join-config.yaml"))
	assert.Check(t, is.DeepEqual(jc.Discovery.BootstrapToken.CACertHashes, []string{testCAHash}),
		"the JoinConfiguration pins the cluster CA")
	assert.Check(t, !strings.Contains(run.file("join-config.yaml"), "unsafeSkipCAVerification"),
		"the JoinConfiguration skips the CA check:\n%s", run.file("join-config.yaml"))
	joins := 0
	for _, call := range strings.Split(run.file("calls"), "\n") {
		if !strings.HasPrefix(call, "kubeadm join") {
			continue
		}
		joins++
		assert.Check(t, is.Equal(call, "kubeadm join --config "+filepath.Join(run.root, "run/dynk8s/kubeadm-join.yaml")),
			"kubeadm join takes the pinned JoinConfiguration and nothing else")
		for _, flag := range []string{"--discovery-token-unsafe-skip-ca-verification", "--discovery-token-ca-cert-hash",
			"--discovery-file", "--token"} {
			assert.Check(t, !strings.Contains(call, flag), "kubeadm join runs with %s: %s", flag, call)
		}
	}
	assert.Check(t, is.Equal(joins, 1))
}

// When SSM keeps refusing, the script stops at its deadline with one reason, never runs kubeadm, and does not hand
// the instance back to its group (no SetInstanceHealth): every replacement would meet the same fault, so the
// autoscaler's max-node-provision-time, which times the scale-up out and backs the group off, decides.
func TestJoinGivesUpAtDeadline(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	aws.ssmFailures = -1
	run := runScript(t, ud, joinScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "3"}, nil)
	assert.Check(t, run.exitCode != 0)
	assert.Check(t, run.elapsed < 20*time.Second, "took %s past a 3 s deadline", run.elapsed)
	// And it kept trying until then: the retry gives up only when no pause (at most 200 ms here) fits before the
	// deadline, which bash's whole-second clock reaches 2 to 3 s after the start.
	assert.Check(t, run.elapsed >= 2*time.Second, "gave up after %s, before its 3 s deadline", run.elapsed)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), "want exactly one reason:\n%s", run.stderr)
	m := regexp.MustCompile(`gave up after (\d+) attempts`).FindStringSubmatch(failed[0])
	assert.Assert(t, m != nil, failed[0])
	attempts, err := strconv.Atoi(m[1])
	assert.NilError(t, err)
	assert.Check(t, attempts >= 2, "gave up after %d attempt(s): it never retried", attempts)
	assert.Check(t, is.Contains(failed[0], "read the join token from SSM parameter "+testTokenParameter+": gave up after"))
	assert.Check(t, is.Contains(failed[0], "(deadline 3s)"))
	assert.Check(t, is.Contains(failed[0], "HTTP 400 AccessDeniedException fake SSM says no"))
	assert.Check(t, is.Contains(run.file("journal"), "FAILED: read the join token"), "the reason also reaches the journal")
	for _, call := range strings.Split(run.file("calls"), "\n") {
		assert.Check(t, !strings.HasPrefix(call, "kubeadm "), "kubeadm ran: %s", call)
	}
	assert.Check(t, is.Len(aws.autoscalingCalls(), 0), "the instance was handed back to its group")
	tl := readTimeline(t, run)
	assert.Check(t, is.Equal(tl.Result, "failed"))
	assert.Check(t, is.Contains(tl.Reason, "read the join token from SSM parameter"))
	assert.Check(t, is.Equal(tl.Phases[len(tl.Phases)-1].Name, "token"), "the phase it failed in is the last: %+v", tl.Phases)
}

// The API server never answers (nothing listens): the deadline ends the wait.
func TestJoinGivesUpWhenAPIServerIsUnreachable(t *testing.T) {
	t.Parallel()
	api := newFakeAPIServer(t, 0)
	u, err := url.Parse(api.URL)
	assert.NilError(t, err)
	api.Close()
	in := generalPool()
	in.APIServerEndpoint = u.Host
	in.JoinTokenParameter = testTokenParameter
	ud, err := Node(in)
	assert.NilError(t, err)
	aws := newFakeAWS(t, map[string]string{testTokenParameter: testToken})
	run := runScript(t, ud, joinScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, nil)
	assert.Check(t, run.exitCode != 0)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "reach the API server at "+u.Host+": gave up after"))
	assert.Check(t, is.Contains(failed[0], "curl: (7)"))
}

// A parameter that does not hold a bootstrap token is not joined with: the script retries, and at its deadline gives
// up with that reason, never echoing the value.
func TestJoinRefusesMalformedToken(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	aws.params[testTokenParameter] = "Not-A-Token-but-a-secret"
	run := runScript(t, ud, joinScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, nil)
	assert.Check(t, run.exitCode != 0)
	failed := failedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "read the join token from SSM parameter "+testTokenParameter+": gave up after"))
	assert.Check(t, is.Contains(failed[0], "it holds no bootstrap token"))
	assert.Check(t, !strings.Contains(run.stderr, "Not-A-Token-but-a-secret"))
	assert.Check(t, !strings.Contains(run.file("calls"), "kubeadm join"), "kubeadm ran without a token")
}

// A fresh install: the node boots before the stack has created the parameter, then finds the placeholder the stack
// declares it with, and only then the first token the cluster's rotator writes. It waits, says why at each attempt,
// and joins with that token.
func TestJoinWaitsForTheFirstToken(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	aws.queued = map[string][]string{testTokenParameter: {"", "", "none: the dynk8s join token rotator has not written a token yet"}}
	run := runScript(t, ud, joinScript, aws, nil, nil)
	assert.Equal(t, run.exitCode, 0)
	step := "read the join token from SSM parameter " + testTokenParameter
	assert.Check(t, is.Contains(run.stderr, step+": attempt 1 failed: SSM GetParameter "+testTokenParameter+
		": HTTP 400 ParameterNotFound (not created yet)"))
	assert.Check(t, is.Contains(run.stderr, step+": attempt 3 failed: it holds no bootstrap token"))
	assert.Check(t, is.Contains(run.stderr, step+": succeeded on attempt 4\n"))
	assert.Check(t, !strings.Contains(run.stderr, "rotator has not written a token yet"), "the value is in the log")
	assert.Equal(t, parseJoinConfig(t, run.file("join-config.yaml")).Discovery.BootstrapToken.Token, testToken)
}

// A join that fails (here: kubeadm refuses, as it does a token that expired since it was read) is retried with the
// token SSM holds by then, not with the one the failed attempt used.
func TestJoinRereadsTheTokenAfterAFailedJoin(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	const old = "oldtok.0123456789abcdef"
	aws.queued = map[string][]string{testTokenParameter: {old}}
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_KUBEADM_FAILURES": "1"}, nil)
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "kubeadm join: succeeded on attempt 2"))
	assert.Equal(t, parseJoinConfig(t, run.file("join-config.yaml")).Discovery.BootstrapToken.Token, testToken)
	aws.mu.Lock()
	defer aws.mu.Unlock()
	assert.Equal(t, aws.ssmRequests, 2, "one read before each join attempt")
}

// A node that already joined: the script does nothing and touches nothing.
func TestJoinDoesNothingWhenAlreadyJoined(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, nil, func(root string) {
		assert.NilError(t, os.MkdirAll(filepath.Join(root, "etc/kubernetes"), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, "etc/kubernetes/kubelet.conf"), nil, 0o600))
	})
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Contains(run.stderr, "already joined"))
	assert.Check(t, is.Equal(run.file("calls"), ""), "no command ran")
	assert.Check(t, is.Equal(aws.imds.Requests()+aws.ssmRequests, 0))
}

// The lockdown fails closed: when dynk8s-imds-lock.service does not start (no nft, a ruleset nft refuses), the join
// stops with that reason before it reads the token or runs kubeadm join, which would start a kubelet (the kubelet's
// drop-in would refuse to start it anyway: TestNodeHostStepsAroundTheJoin).
func TestJoinStopsWhenTheLockdownFails(t *testing.T) {
	t.Parallel()
	ud, aws := joinFixture(t, 0)
	run := runScript(t, ud, joinScript, aws, map[string]string{"STUB_SYSTEMCTL_FAILS": "start " + imdsUnitName}, nil)
	assert.Equal(t, run.exitCode, 1)
	assert.Check(t, is.DeepEqual(failedLines(run.stderr), []string{"dynk8s-join: FAILED: the instance metadata " +
		"lockdown did not load (journalctl -u dynk8s-imds-lock): no kubelet may run without it"}))
	assert.Check(t, !strings.Contains(run.file("calls"), "\nkubeadm "), "kubeadm ran without the lockdown")
	assert.Check(t, is.Equal(aws.ssmRequests, 0), "the token was read without the lockdown")
}

// The failure and the timeline also go to the kernel log, which reaches every console the kernel registered: on
// Fedora 43's aarch64 EC2 images /dev/console (the unit's journal+console) names a UART Graviton does not have, while
// the kernel's SPCR console is the one `aws ec2 get-console-output` shows. Errors at printk level 3, a success's
// timeline at 5.
func TestJoinWritesTheOutcomeToTheKernelLog(t *testing.T) {
	t.Parallel()
	withKmsg := func(root string) {
		assert.NilError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, "dev/kmsg"), nil, 0o644))
	}
	ud, aws := joinFixture(t, 0)
	aws.ssmFailures = -1
	run := runScript(t, ud, joinScript, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, withKmsg)
	assert.Check(t, run.exitCode != 0)
	kmsg, err := os.ReadFile(filepath.Join(run.root, "dev/kmsg"))
	assert.NilError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(kmsg), "\n"), "\n")
	assert.Assert(t, is.Len(lines, 2), "%s", kmsg)
	assert.Check(t, strings.HasPrefix(lines[0], "<3>dynk8s-join: FAILED: read the join token from SSM parameter "), lines[0])
	assert.Check(t, strings.HasPrefix(lines[1], "<3>dynk8s-join: timeline: result=failed mode=join "), lines[1])

	ud, aws = joinFixture(t, 0)
	run = runScript(t, ud, joinScript, aws, nil, withKmsg)
	assert.Equal(t, run.exitCode, 0)
	kmsg, err = os.ReadFile(filepath.Join(run.root, "dev/kmsg"))
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(string(kmsg), "<5>dynk8s-join: timeline: result=joined mode=join "), "%s", kmsg)
	assert.Check(t, is.Equal(strings.Count(string(kmsg), "\n"), 1), "%s", kmsg)
}

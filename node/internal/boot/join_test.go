package boot

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/endpoint"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/node/internal/cloud/cloudfake"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodeconfig"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

// The join's scenarios, against the fake clients.

const (
	// enableRuntime enables CRI-O and the kubelet for the boots to come, in one call, without a reload.
	enableRuntime = "systemctl enable --no-reload crio.service kubelet.service"
	dnfInstall    = "dnf install -y --setopt=install_weak_deps=False --setopt=tsflags=nodocs --setopt=max_parallel_downloads=10"
	// pinned: node.json's packages by name, which every Fedora repository in the transaction excludes and the boot
	// locks after it.
	pinned = "kubelet,kubeadm,cri-tools,cri-o"
	// dnfLock reads only the pinned repositories, as the install does.
	dnfLock    = "dnf --repo=dynk8s-kubernetes --repo=dynk8s-cri-o versionlock add kubelet kubeadm cri-tools cri-o"
	fedoraRepo = " --repo=fedora --setopt=fedora.excludepkgs=" + pinned
	withUpdate = " --repo=fedora --repo=updates --setopt=fedora.excludepkgs=" + pinned + " --setopt=updates.excludepkgs=" + pinned
)

// Every network step fails at first; the join retries each and joins, and kubeadm gets the JoinConfiguration with
// the token from SSM and the identity from IMDS, in a file only root reads, removed after the join.
func TestJoinRetriesThenJoins(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	api := fakeaws.NewAPIServer(t, 2)
	r.cfg.APIServerEndpoint = endpoint.MustParse(strings.TrimPrefix(api.URL, "https://"))
	r.imds.TokenFailures = 2
	r.ssm.Failures = 1
	r.host.failN["kubeadm"] = 1
	cni := filepath.Join(r.root, "etc/cni/net.d")
	assert.NilError(t, os.MkdirAll(cni, 0o755))
	for _, f := range []string{"11-crio-ipv4-bridge.conflist", "10-calico.conflist"} {
		assert.NilError(t, os.WriteFile(filepath.Join(cni, f), []byte("{}"), 0o644))
	}
	run := r.join()
	assert.NilError(t, run.err)
	for step, attempts := range map[string]int{
		"read instance identity from IMDS":                                   3,
		"read the join token from SSM parameter " + cloudfake.TokenParameter: 2,
		"reach the API server at " + r.cfg.APIServerEndpoint.String():        3,
		"kubeadm join": 2,
	} {
		assert.Check(t, is.Contains(run.log, step+": attempt 1 failed"))
		assert.Check(t, is.Contains(run.log, step+": succeeded on attempt "+strconv.Itoa(attempts)+"\n"))
	}
	assert.Check(t, is.Contains(run.log, "IMDSv2 token: HTTP 503"))
	assert.Check(t, is.Contains(run.log, "HTTP 400 AccessDeniedException: fake SSM says no"))
	assert.Check(t, is.Contains(run.log, "API server answered HTTP 200"))
	assert.Check(t, is.Contains(run.log, "kubeadm join exited 1 (its output is above)"))
	assert.Check(t, is.Len(nodetest.FailedLines(run.log), 0))
	assert.Check(t, strings.HasPrefix(run.log, "dynk8s-join: dynk8s-node "+system.Version+" ("), "the first line names the version")

	// One transaction, from the pinned repos only: the image has the system packages, so no Fedora metadata.
	assert.Check(t, is.Contains(run.calls, dnfInstall+" --repo=dynk8s-kubernetes --repo=dynk8s-cri-o "+
		"kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*"))
	assert.Check(t, is.Contains(run.log, "the image has container-selinux iptables nftables (rpm -q): no Fedora "+
		"repository metadata needed"))
	assert.Check(t, is.Contains(run.calls, enableRuntime))
	assert.Check(t, run.index(enableRuntime) < run.index("systemctl start crio.service"), "crio started before it was enabled")
	join := "kubeadm join --config " + filepath.Join(r.root, "run/dynk8s/kubeadm-join.yaml")
	assert.Check(t, run.index("kubeadm reset --force") == run.index(join)+1, "a failed join is reset before the next: %v", run.calls)
	checkLocksBeforeJoin(t, run)

	assert.Assert(t, is.Len(r.host.joinConfigs, 2))
	jc := nodetest.ParseJoinConfig(t, r.host.joinConfigs[1])
	assert.Check(t, is.DeepEqual(jc, nodeconfig.JoinConfiguration{
		APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "JoinConfiguration",
		Discovery: nodeconfig.Discovery{BootstrapToken: nodeconfig.BootstrapTokenDiscovery{
			APIServerEndpoint: r.cfg.APIServerEndpoint.String(), CACertHashes: []string{cloudfake.CAHash}, Token: cloudfake.Token}},
		NodeRegistration: nodeconfig.NodeRegistration{Name: cloudfake.InstanceID, CRISocket: "unix:///var/run/crio/crio.sock",
			KubeletExtraArgs: []nodeconfig.KubeletArg{
				{Name: "node-ip", Value: "10.100.1.23"},
				{Name: "node-labels", Value: "dynk8s.io/capacity-type=spot,dynk8s.io/pool=spot-arm64," +
					"node.kubernetes.io/instance-type=m7g.large,topology.kubernetes.io/region=eu-central-1," +
					"topology.kubernetes.io/zone=eu-central-1a"},
				{Name: "provider-id", Value: "aws:///eu-central-1a/" + cloudfake.InstanceID},
			},
			Taints: []kube.Taint{{Key: "dynk8s.io/capacity-type", Value: "spot", Effect: "NoSchedule"}}},
		Patches: nodeconfig.Patches{Directory: r.root + "/etc/kubernetes/patches"},
	}))
	assert.Check(t, is.Equal(r.host.joinModes[0], os.FileMode(0o600)))
	_, err := os.Stat(filepath.Join(r.root, "run/dynk8s/kubeadm-join.yaml"))
	assert.Check(t, os.IsNotExist(err), "the rendered JoinConfiguration (with the token) is left in /run: %v", err)

	_, err = os.Stat(filepath.Join(cni, "11-crio-ipv4-bridge.conflist"))
	assert.Check(t, os.IsNotExist(err), "CRI-O's default bridge conflist survived")
	_, err = os.Stat(filepath.Join(cni, "10-calico.conflist"))
	assert.Check(t, err, "the cluster CNI's conflist was removed")
	assert.Check(t, !strings.Contains(run.log, cloudfake.Token), "the token is in the log")
	assert.Check(t, !strings.Contains(strings.Join(run.calls, "\n"), cloudfake.Token), "the token is on a command line")

	assert.Assert(t, run.timeline != nil)
	assert.Check(t, is.Equal(run.timeline.Result, "joined"))
	assert.Check(t, is.Equal(run.timeline.Mode, "join"))
	assert.Check(t, is.Equal(run.timeline.LifecycleState, "InService"))
	assert.Check(t, is.Equal(run.timeline.InstanceID, cloudfake.InstanceID))
	assert.Check(t, is.DeepEqual(run.phases(), []string{"identity", "kernel", "packages", "crio", "checks", "token",
		"kubelet-key", "api-server", "lock", "kubeadm-join", "pre-pull"}))
	checkTimeline(t, run)
	for _, p := range run.timeline.Phases {
		assert.Check(t, is.Contains(run.log, "phase="+p.Name+" took="))
	}
	assert.Check(t, is.Contains(run.log, "timeline: result=joined mode=join total="))

	// The node joined: running the join again does nothing at all.
	requests := r.imds.Requests
	again := r.join()
	assert.Check(t, is.Contains(again.log, "already joined"))
	assert.Check(t, is.Len(again.calls, 0))
	assert.Check(t, is.Equal(r.imds.Requests, requests))
}

// checkTimeline: the timeline this run wrote is one the runbook reads, its phases fit in its total and in the run,
// and the start's seconds after boot follow from /proc/uptime (42.5 s).
func checkTimeline(t *testing.T, run joinRun) {
	t.Helper()
	nodetest.ReadTimeline(t, run.root, run.elapsed, 42500*time.Millisecond)
}

// checkLocksBeforeJoin: every join loads the metadata lockdown and turns swap off before kubeadm join starts the
// kubelet.
func checkLocksBeforeJoin(t *testing.T, run joinRun) {
	t.Helper()
	join, lock, swap := run.index("kubeadm join"), run.index("systemctl start "+imdsLockUnit), run.index("swapoff -a")
	assert.Check(t, lock >= 0 && join > lock, "the lockdown is not started before kubeadm join: %v", run.calls)
	assert.Check(t, swap >= 0 && join > swap, "swap is not off before kubeadm join: %v", run.calls)
}

// The package transaction: system packages the image lacks join from Fedora's release repository alone; a failed
// transaction is retried with Fedora's repositories and their updates.
func TestJoinPackages(t *testing.T) {
	t.Parallel()
	upstream := dnfInstall + " --repo=dynk8s-kubernetes --repo=dynk8s-cri-o"
	for name, c := range map[string]struct {
		rpmMissing []string
		needsRepo  string
		want       []string
		log        string
	}{
		"image lacks system packages": {rpmMissing: []string{"container-selinux", "nftables"},
			want: []string{upstream + fedoraRepo + " kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.* container-selinux nftables",
				dnfLock},
			log: "the image lacks container-selinux nftables (rpm -q): Fedora's release repository joins the transaction"},
		"falls back to updates": {needsRepo: "updates",
			want: []string{upstream + " kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*",
				upstream + withUpdate + " kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*", dnfLock},
			log: "the next attempt adds Fedora's repositories and their updates"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			r.host.rpmMissing, r.host.dnfNeedsRepo = c.rpmMissing, c.needsRepo
			run := r.join()
			assert.NilError(t, run.err)
			var dnf []string
			for _, call := range run.calls {
				if strings.HasPrefix(call, "dnf ") {
					dnf = append(dnf, call)
				}
			}
			assert.Check(t, is.DeepEqual(dnf, c.want))
			assert.Check(t, is.Contains(run.log, c.log))
		})
	}
}

// A transaction that fails says dnf's own reason on its one FAILED line, and is retried only where a retry can
// change it: a repository not reached until the deadline; a pin no repository matches once Fedora's updates have
// been asked too; a package that fails its signature check never. The join never runs kubeadm after it.
func TestJoinPackagesFail(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		tail     string
		attempts func(int) bool
		reason   string
	}{
		"a pin no repository matches": {
			tail:     "Failed to resolve the transaction:\nNo match for argument: cri-o-1.34.*\nYou can try to add to command line:\n",
			attempts: func(n int) bool { return n == 2 },
			reason:   "dnf install exited 1: No match for argument: cri-o-1.34.* (no repository the boot may take it from has it"},
		"a pin only Fedora's build matches (dnf5)": {
			tail:     "Failed to resolve the transaction:\nArgument 'cri-o-1.34.*' matches only excluded packages.\n",
			attempts: func(n int) bool { return n == 2 },
			reason:   "dnf install exited 1: Argument 'cri-o-1.34.*' matches only excluded packages."},
		"unsigned": {
			tail: "Package kubelet-1.34.4-150500.1.1.x86_64.rpm is not signed\n" +
				"The downloaded packages were saved in cache until the next successful transaction.\nError: GPG check FAILED\n",
			attempts: func(n int) bool { return n == 1 },
			reason:   "dnf install exited 1: Package kubelet-1.34.4-150500.1.1.x86_64.rpm is not signed; Error: GPG check FAILED"},
		"a repository not reached": {
			tail: ">>> Curl error (37): Could not read a file:// file\n" +
				"Failed to download metadata (baseurl: \"file:///srv/repos/missing/\") for repository \"dynk8s-cri-o\": Usable URL not found\n",
			attempts: func(n int) bool { return n > 2 },
			reason:   "gave up after", // the deadline's
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			r.host.dnfNeedsRepo, r.host.dnfTail = "none-has-it", c.tail
			run := r.join()
			assert.Assert(t, run.err != nil)
			failed := nodetest.FailedLines(run.log)
			assert.Assert(t, is.Len(failed, 1), run.log)
			assert.Check(t, is.Contains(failed[0], c.reason))
			assert.Check(t, is.Contains(failed[0], strings.TrimSpace(system.DNFReason(c.tail))))
			installs := 0
			for _, call := range run.calls {
				if strings.HasPrefix(call, dnfInstall+" --repo=dynk8s-kubernetes") {
					installs++
				}
			}
			assert.Check(t, c.attempts(installs), "%d attempts", installs)
			assert.Check(t, run.index("kubeadm join") < 0)
			assert.Check(t, run.index(dnfLock) < 0)
		})
	}
}

// dnf4 without its versionlock plugin: the plugin comes from Fedora's repositories, then the lock is asked again.
func TestJoinLocksPinsOnDnf4(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.host.dnf4 = true
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, is.DeepEqual(dnfCalls(run.calls), []string{
		dnfInstall + " --repo=dynk8s-kubernetes --repo=dynk8s-cri-o kubelet-1.34.4 kubeadm-1.34.4 cri-tools-1.34.* cri-o-1.34.*",
		dnfLock,
		dnfInstall + " --repo=fedora --repo=updates dnf-command(versionlock)",
		dnfLock,
	}))
	assert.Check(t, is.Contains(run.log, "this dnf has no versionlock command (dnf4 without its plugin)"))
}

// The join trusts only the pinned cluster CA: kubeadm gets the pin in the JoinConfiguration, which does not skip the
// check, and nothing else on its command line.
func TestJoinPinsTheClusterCA(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	run := r.join()
	assert.NilError(t, run.err)
	assert.Assert(t, is.Len(r.host.joinConfigs, 1))
	assert.Check(t, is.DeepEqual(nodetest.ParseJoinConfig(t, r.host.joinConfigs[0]).Discovery.BootstrapToken.CACertHashes, []string{cloudfake.CAHash}))
	assert.Check(t, !strings.Contains(r.host.joinConfigs[0], "unsafeSkipCAVerification"))
	for _, c := range run.calls {
		if strings.HasPrefix(c, "kubeadm join") {
			assert.Check(t, is.Equal(c, "kubeadm join --config "+filepath.Join(r.root, "run/dynk8s/kubeadm-join.yaml")))
		}
	}
}

// A boot that cannot finish stops at its deadline with one reason, which reaches the kernel log and the timeline,
// never runs kubeadm after a failed step, and does not hand the instance back to its group.
func TestJoinGivesUp(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		modify    func(r *rig)
		failure   []string
		lastPhase string
	}{
		"SSM refuses": {modify: func(r *rig) { r.ssm.Failures = -1 },
			failure: []string{"read the join token from SSM parameter " + cloudfake.TokenParameter + ": gave up after",
				"(deadline 2s)", "HTTP 400 AccessDeniedException: fake SSM says no"}, lastPhase: "token"},
		"API server unreachable": {modify: func(r *rig) {
			api := fakeaws.NewAPIServer(t, 0)
			r.cfg.APIServerEndpoint = endpoint.MustParse(strings.TrimPrefix(api.URL, "https://"))
			api.Close()
		}, failure: []string{"reach the API server at ", ": gave up after", "connection refused"}, lastPhase: "api-server"},
		"malformed token": {modify: func(r *rig) { r.ssm.Value = "Not-A-Token-but-a-secret" },
			failure: []string{"read the join token from SSM parameter " + cloudfake.TokenParameter + ": gave up after",
				"it holds no bootstrap token"}, lastPhase: "token"},
		"lockdown fails": {modify: func(r *rig) { r.host.fail["systemctl start "+imdsLockUnit] = true },
			failure: []string{"the instance metadata lockdown did not load (journalctl -u dynk8s-imds-lock): no " +
				"kubelet may run without it"}, lastPhase: "checks"},
		"no IP forwarding": {modify: func(r *rig) {
			assert.NilError(t, os.WriteFile(filepath.Join(r.root, "proc/sys/net/ipv4/ip_forward"), []byte("0\n"), 0o644))
		}, failure: []string{"kubeadm join needs net.ipv4.ip_forward = 1 (preflight FileContent check)"}, lastPhase: "checks"},
		"a tool kubeadm needs is missing": {modify: func(r *rig) { r.host.missing = []string{"nsenter"} },
			failure: []string{"kubeadm join needs nsenter on PATH (preflight InPathCheck)"}, lastPhase: "checks"},
		"crio does not start": {modify: func(r *rig) { r.host.fail["systemctl start crio.service"] = true },
			failure: []string{"crio.service did not start (journalctl -u crio)"}, lastPhase: "crio"},
		// The lock runs beside the join's first phases; its failure stops the boot before kubeadm join all the same.
		"the pins' lock fails": {modify: func(r *rig) { r.host.fail[dnfLock] = true },
			failure: []string{"lock kubelet kubeadm cri-tools cri-o at their installed versions (dnf versionlock): " +
				"gave up after"}, lastPhase: "lock"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			r.cfg.Deadlines.Join = nodeconfig.Duration(2 * time.Second)
			assert.NilError(t, os.MkdirAll(filepath.Join(r.root, "dev"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(r.root, "dev/kmsg"), nil, 0o644))
			c.modify(r)
			run := r.join()
			assert.Check(t, run.err != nil)
			assert.Check(t, run.elapsed < 10*time.Second, "took %s past a 2 s deadline", run.elapsed)
			failed := nodetest.FailedLines(run.log)
			assert.Assert(t, is.Len(failed, 1), "want exactly one reason:\n%s", run.log)
			assert.Check(t, strings.HasPrefix(failed[0], "dynk8s-join: FAILED: "+c.failure[0]), failed[0])
			for _, want := range c.failure {
				assert.Check(t, is.Contains(failed[0], want))
			}
			if m := regexp.MustCompile(`gave up after (\d+) attempts`).FindStringSubmatch(failed[0]); m != nil {
				n, _ := strconv.Atoi(m[1])
				assert.Check(t, n >= 2, "gave up after %d attempt(s): it never retried", n)
				assert.Check(t, run.elapsed >= 1500*time.Millisecond, "gave up after %s, before its 2 s deadline", run.elapsed)
			}
			assert.Check(t, !strings.Contains(run.log, "Not-A-Token-but-a-secret"), "the parameter's value is in the log")
			assert.Check(t, run.index("kubeadm join") < 0, "kubeadm ran: %v", run.calls)
			if c.lastPhase == "lock" {
				_, err := os.Stat(filepath.Join(r.root, "var/lib/dynk8s/prepared"))
				assert.Check(t, os.IsNotExist(err), "marked prepared without the lock: %v", err)
			}
			assert.Check(t, is.Len(r.asg.Recorded(), 0), "the instance was handed back to its group")
			assert.Assert(t, run.timeline != nil)
			assert.Check(t, is.Equal(run.timeline.Result, "failed"))
			assert.Check(t, is.Contains(run.timeline.Reason, c.failure[0]))
			assert.Check(t, is.Equal(run.phases()[len(run.phases())-1], c.lastPhase))
			kmsg, err := os.ReadFile(filepath.Join(r.root, "dev/kmsg"))
			assert.NilError(t, err)
			lines := strings.Split(strings.TrimSuffix(string(kmsg), "\n"), "\n")
			assert.Assert(t, is.Len(lines, 2), "%s", kmsg)
			assert.Check(t, strings.HasPrefix(lines[0], "<3>dynk8s-join: FAILED: "), lines[0])
			assert.Check(t, strings.HasPrefix(lines[1], "<3>dynk8s-join: timeline: result=failed mode=join "), lines[1])
		})
	}
}

// A fresh install: the parameter does not exist yet, then holds the stack's placeholder, then the rotator's first
// token. The join waits, says why at each attempt, never logs the value, and joins with that token.
func TestJoinWaitsForTheFirstToken(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.ssm.Queued = []string{"", "", "none: the dynk8s join token rotator has not written a token yet"}
	run := r.join()
	assert.NilError(t, run.err)
	step := "read the join token from SSM parameter " + cloudfake.TokenParameter
	assert.Check(t, is.Contains(run.log, step+": attempt 1 failed: SSM GetParameter "+cloudfake.TokenParameter+
		": HTTP 400 ParameterNotFound (not created yet)"))
	assert.Check(t, is.Contains(run.log, step+": attempt 3 failed: it holds no bootstrap token"))
	assert.Check(t, is.Contains(run.log, step+": succeeded on attempt 4\n"))
	assert.Check(t, !strings.Contains(run.log, "rotator has not written a token yet"), "the value is in the log")
	assert.Check(t, is.Equal(nodetest.ParseJoinConfig(t, r.host.joinConfigs[0]).Discovery.BootstrapToken.Token, cloudfake.Token))
}

// A join that fails (kubeadm refuses, as it does a token that expired since it was read) is retried with the token
// SSM holds by then.
func TestJoinRereadsTheTokenAfterAFailedJoin(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.ssm.Queued = []string{"oldtok.0123456789abcdef"}
	r.host.failN["kubeadm"] = 1
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, is.Contains(run.log, "kubeadm join: succeeded on attempt 2"))
	assert.Check(t, is.Equal(nodetest.ParseJoinConfig(t, r.host.joinConfigs[len(r.host.joinConfigs)-1]).Discovery.BootstrapToken.Token, cloudfake.Token))
	assert.Check(t, is.Equal(r.ssm.Requests, 2), "one read before each join attempt")
}

// The phase decision for every target lifecycle state IMDS can return ("" is an instance whose IMDS has none).
func TestJoinFollowsTheLifecycleState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		state, hook string
		result      string // the timeline's; "" when the boot fails
		failure     string
	}{
		{state: "InService", result: "joined"},
		{state: "InService", hook: cloudfake.Hook, result: "joined"},
		{state: "", result: "joined"},
		{state: "Warmed:Stopped", hook: cloudfake.Hook, result: "prepared"},
		{state: "Warmed:Running", hook: cloudfake.Hook, result: "prepared"},
		{state: "Warmed:Hibernated", hook: cloudfake.Hook, result: "prepared"},
		{state: "Warmed:Stopped", result: "prepared"},
		{state: "Warmed:Terminated", result: "skipped"},
		{state: "Terminated", result: "skipped"},
		{state: "Detached", result: "skipped"},
		{state: "Standby", result: "skipped"},
		{state: "", hook: cloudfake.Hook, failure: "target-lifecycle-state: HTTP 404 (a group with launch hook " + cloudfake.Hook + " sets it)"},
		{state: "Pending:Wait", failure: "IMDS returned an unexpected LIFECYCLE: 'Pending:Wait'"},
	} {
		t.Run(tc.state+"/"+tc.hook, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, tc.state, tc.hook)
			if tc.failure != "" {
				// Only a failing case waits its deadline out; one that joins keeps the rig's, for a busy machine.
				r.cfg.Deadlines.Join = nodeconfig.Duration(time.Second)
			}
			r.asg.PendingAction = tc.hook != ""
			run := r.join()
			dnf := run.index("dnf install") >= 0
			if tc.failure != "" {
				assert.Check(t, run.err != nil)
				failed := nodetest.FailedLines(run.log)
				assert.Assert(t, is.Len(failed, 1), run.log)
				assert.Check(t, is.Contains(failed[0], tc.failure))
				assert.Check(t, !dnf, "prepared without knowing the state")
				return
			}
			assert.NilError(t, run.err)
			assert.Check(t, is.Equal(run.timeline.Result, tc.result))
			assert.Check(t, is.Equal(dnf, tc.result != "skipped"), "dnf: %v", run.calls)
			assert.Check(t, is.Equal(run.index("kubeadm join") >= 0, tc.result == "joined"), "kubeadm: %v", run.calls)
			completed := false
			for _, c := range r.asg.Recorded() {
				completed = completed || strings.HasPrefix(c, "CompleteLifecycleAction")
			}
			assert.Check(t, is.Equal(completed, tc.hook != "" && tc.result != "skipped"))
			if tc.result == "skipped" {
				assert.Check(t, is.Contains(run.log, "timeline: result=skipped mode=none "))
			}
		})
	}
}

// A warm pool: the first boot (Warmed:Stopped) prepares, pre-pulls and completes the launch hook's action, and
// neither reads the token nor joins; when the group moves the instance into service it starts again: that boot
// skips the preparation and joins, then completes the action once more. A third boot does nothing.
func TestJoinPreparesInTheWarmPoolThenJoins(t *testing.T) {
	t.Parallel()
	r := newRig(t, "Warmed:Stopped", cloudfake.Hook)
	r.asg.PendingAction = true
	warm := r.join()
	assert.NilError(t, warm.err)
	assert.Check(t, warm.index("dnf install") >= 0)
	assert.Check(t, is.Contains(warm.calls, enableRuntime))
	assert.Check(t, is.Contains(warm.calls, "systemctl start crio.service"))
	assert.Check(t, is.Contains(warm.calls, "crictl --runtime-endpoint unix:///var/run/crio/crio.sock pull registry.k8s.io/pause:3.10.1"))
	assert.Check(t, warm.index("kubeadm") < 0, "kubeadm ran in the warm pool")
	assert.Check(t, warm.index("systemctl start "+imdsLockUnit) < 0, "the metadata lock was started before the join")
	assert.Check(t, warm.index("swapoff") < 0, "swap turned off while preparing (a hibernating warm pool needs it)")
	assert.Check(t, is.Contains(warm.calls, "sysctl -q -e --system"), "the sysctls cloud-init wrote were not applied")
	assert.Check(t, is.Equal(r.ssm.Requests, 0), "the token was read in the warm pool")
	assert.Check(t, is.DeepEqual(r.asg.Recorded(), []string{
		"DescribeAutoScalingInstances " + cloudfake.InstanceID,
		"CompleteLifecycleAction " + cloudfake.Group + " " + cloudfake.Hook + " " + cloudfake.InstanceID + " CONTINUE",
	}))
	assert.Check(t, !r.asg.PendingAction, "the launch hook still holds the instance")
	assert.Check(t, is.Contains(warm.log, "prepared in the warm pool"))
	assert.Check(t, is.Equal(warm.timeline.Result, "prepared"))
	assert.Check(t, is.Equal(warm.timeline.Mode, "prepare"))
	assert.Check(t, is.DeepEqual(warm.phases(), []string{"identity", "kernel", "packages", "crio", "lock", "pre-pull", "lifecycle"}))
	checkTimeline(t, warm)

	start := r.startFromTheWarmPool()
	assert.NilError(t, start.err)
	assert.Check(t, start.index("dnf ") < 0, "packages installed again")
	assert.Check(t, start.index("crictl") < 0, "images pulled again")
	assert.Check(t, is.Contains(start.calls, "systemctl start crio.service"))
	checkLocksBeforeJoin(t, start)
	assert.Check(t, is.Contains(start.log, "prepared on an earlier boot"))
	asg := r.asg.Recorded()
	assert.Check(t, is.Equal(asg[len(asg)-1], "CompleteLifecycleAction "+cloudfake.Group+" "+cloudfake.Hook+" "+cloudfake.InstanceID+" CONTINUE"))
	assert.Check(t, is.Equal(start.timeline.Result, "joined"))
	assert.Check(t, is.DeepEqual(start.phases(), []string{"identity", "crio", "checks", "token", "kubelet-key",
		"api-server", "kubeadm-join", "lifecycle"}))

	r.reboot()
	again := r.join()
	assert.Check(t, is.Contains(again.log, "already joined"))
	assert.Check(t, is.Len(again.calls, 0))
}

// startFromTheWarmPool is the prepared instance's start into service: a new boot, IMDS saying InService, a launch
// lifecycle action pending.
func (r *rig) startFromTheWarmPool() joinRun {
	r.reboot()
	r.imds.SetLifecycle("InService")
	r.asg.Mu.Lock()
	r.asg.PendingAction = true
	r.asg.Mu.Unlock()
	return r.join()
}

// A warm instance keeps the user data it was launched with: when the group launches a newer launch template version
// by the time it enters service, the boot hands it back (abandons the launch hook's action; without a hook or a
// waiting action, marks it Unhealthy) instead of joining with stale values. One of the current version joins; an
// answer without versions lets it join too.
func TestJoinHandsBackAStaleWarmInstance(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		hook, instance, group, result, last string
	}{
		"stale":         {cloudfake.Hook, "3", "4", "stale", "CompleteLifecycleAction " + cloudfake.Group + " " + cloudfake.Hook + " " + cloudfake.InstanceID + " ABANDON"},
		"stale no hook": {"", "9", "10", "stale", "SetInstanceHealth " + cloudfake.InstanceID + " Unhealthy"},
		"current":       {cloudfake.Hook, "4", "4", "joined", "CompleteLifecycleAction " + cloudfake.Group + " " + cloudfake.Hook + " " + cloudfake.InstanceID + " CONTINUE"},
		"unknown":       {cloudfake.Hook, "", "", "joined", "CompleteLifecycleAction " + cloudfake.Group + " " + cloudfake.Hook + " " + cloudfake.InstanceID + " CONTINUE"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "Warmed:Stopped", c.hook)
			r.asg.PendingAction = true
			r.asg.InstanceVersion, r.asg.GroupVersion = c.instance, c.group
			assert.NilError(t, r.join().err)
			requests := r.ssm.Requests
			start := r.startFromTheWarmPool()
			assert.NilError(t, start.err)
			assert.Check(t, is.Equal(start.timeline.Result, c.result))
			asg := r.asg.Recorded()
			assert.Check(t, is.Equal(asg[len(asg)-1], c.last))
			if c.result == "stale" {
				assert.Check(t, is.Contains(start.log, "launched from version "+c.instance+" of the launch template; "+
					"the group launches version "+c.group))
				assert.Check(t, start.index("kubeadm") < 0, "a stale instance joined")
				assert.Check(t, is.Equal(r.ssm.Requests, requests), "a stale instance read the token")
				return
			}
			assert.Check(t, start.index("kubeadm join") >= 0)
		})
	}
}

// A warm pool that waits Running (or Hibernated): the instance prepares once and then waits without a boot while
// the timer runs the join again and again; those runs return, quietly, touching nothing. When the group puts the
// instance in service, the next run joins, on the same boot, and stops the timer after the join.
func TestJoinWaitsRunningInTheWarmPoolThenJoins(t *testing.T) {
	t.Parallel()
	r := newRig(t, "Warmed:Running", cloudfake.Hook)
	r.asg.PendingAction = true
	timer := filepath.Join(r.root, "etc/systemd/system", joinTimerName)
	assert.NilError(t, os.MkdirAll(filepath.Dir(timer), 0o755))
	assert.NilError(t, os.WriteFile(timer, nil, 0o644))
	warm := r.join()
	assert.NilError(t, warm.err)
	assert.Check(t, is.Equal(warm.timeline.Result, "prepared"))
	timeline, err := os.ReadFile(filepath.Join(r.root, "run/dynk8s/timeline.json"))
	assert.NilError(t, err)
	asgCalls := len(r.asg.Recorded())
	for range 3 {
		tick := r.join()
		assert.Check(t, tick.waited)
		assert.Check(t, is.Equal(tick.log, ""), "a waiting run logs nothing")
		assert.Check(t, is.Len(tick.calls, 0))
	}
	assert.Check(t, is.Len(r.asg.Recorded(), asgCalls), "a waiting run called Auto Scaling")
	again, err := os.ReadFile(filepath.Join(r.root, "run/dynk8s/timeline.json"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(again), string(timeline)), "a waiting run rewrote the timeline")

	r.imds.SetLifecycle("InService")
	r.asg.PendingAction = true
	join := r.join()
	assert.NilError(t, join.err)
	checkLocksBeforeJoin(t, join)
	stop := join.index("systemctl disable --now --no-block " + joinTimerName)
	assert.Check(t, stop > join.index("kubeadm join"), "the joined node's timer was not stopped after the join: %v", join.calls)
	assert.Check(t, is.Equal(join.timeline.Result, "joined"))
}

// A run that fails at once on an instance whose join timer runs it again (a warm-pool instance) lasts
// FailedRunLasts, so that the timer's 2 s between runs does not make it a loop of failures every few seconds; on an
// instance without the timer (a cold pool's: nothing runs it again but a boot), it ends at once. Its one reason is
// logged before the wait.
func TestJoinFailedRunIsPacedForTheTimer(t *testing.T) {
	t.Parallel()
	for _, timer := range []bool{false, true} {
		r := newRig(t, "Warmed:Bogus", cloudfake.Hook)
		if timer {
			path := filepath.Join(r.root, "etc/systemd/system", joinTimerName)
			assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			assert.NilError(t, os.WriteFile(path, nil, 0o644))
		}
		out := &nodetest.SyncBuffer{}
		log := system.NewLogger("dynk8s-join", out, r.root)
		log.Journal = false
		clock := system.NewClock(time.Minute, time.Millisecond, time.Millisecond)
		// A clock that stands still: the wait is the whole minute, however long the run took on a busy machine.
		now := time.Now()
		clock.Now = func() time.Time { return now }
		var slept []time.Duration
		clock.Sleep = func(_ context.Context, d time.Duration) error {
			slept = append(slept, d)
			return nil
		}
		j := newJoiner(&bootEnv{cfg: r.cfg, cloud: r.cloud(), host: r.host, log: log, clock: clock,
			files: system.Files{Root: r.root, Proc: filepath.Join(r.root, "proc")}, tl: system.NewTimeline(time.Now)})
		err := j.Run(context.Background())
		assert.ErrorContains(t, err, "IMDS returned an unexpected LIFECYCLE")
		assert.Check(t, is.Equal(strings.Count(out.String(), "FAILED"), 1), out.String())
		if !timer {
			assert.Check(t, is.Len(slept, 0), "a run without the timer waited")
			continue
		}
		assert.Assert(t, is.Len(slept, 1), "timer: the failed run did not wait once")
		assert.Check(t, is.Equal(slept[0], FailedRunLasts))
		assert.Check(t, is.Contains(out.String(), joinTimerName+" tries again in "))
	}
}

// A waiting run reads the lifecycle state again and again for its window: the group putting the instance in
// service during the run ends the wait at once (the join then starts in the same run), and a run whose window ends
// with the instance still warm says it waits.
func TestJoinWaitingReadsTheStateUntilInService(t *testing.T) {
	t.Parallel()
	r := newRig(t, "Warmed:Running", cloudfake.Hook)
	r.asg.PendingAction = true
	assert.NilError(t, r.join().err)
	f := system.Files{Root: r.root, Proc: filepath.Join(r.root, "proc")}
	j := newJoiner(&bootEnv{cfg: r.cfg, cloud: r.cloud(), host: r.host, files: f,
		log: system.NewLogger("dynk8s-join", &nodetest.SyncBuffer{}, r.root)})

	before := r.imds.Requests
	assert.Check(t, j.waiting(context.Background(), 200*time.Millisecond, 20*time.Millisecond),
		"a warm instance stopped waiting")
	assert.Check(t, r.imds.Requests-before >= 2, "the run read the state %d times", r.imds.Requests-before)

	go func() {
		time.Sleep(100 * time.Millisecond)
		r.imds.SetLifecycle("InService")
	}()
	// A window far longer than the test: only the state read again ends it.
	assert.Check(t, !j.waiting(context.Background(), 10*time.Minute, 20*time.Millisecond),
		"the run went on waiting in service")
}

// In a group with a launch hook: a reboot with no action waiting is no error; a boot that gives up completes a
// waiting action with CONTINUE (never ABANDON, never Unhealthy: the autoscaler's max-node-provision-time decides),
// in service as in the warm pool.
func TestJoinLifecycleActionOnFailure(t *testing.T) {
	t.Parallel()
	t.Run("no action waits", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, "InService", cloudfake.Hook)
		run := r.join()
		assert.NilError(t, run.err)
		assert.Check(t, is.Contains(run.log, "no lifecycle action of hook "+cloudfake.Hook+" waits for this instance"))
		assert.Check(t, is.Len(nodetest.FailedLines(run.log), 0))
	})
	t.Run("no action waits, giving up", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, "InService", cloudfake.Hook)
		r.cfg.Deadlines.Join = nodeconfig.Duration(time.Second)
		r.ssm.Failures = -1
		run := r.join()
		assert.Check(t, run.err != nil)
		for _, c := range r.asg.Recorded() {
			assert.Check(t, !strings.HasPrefix(c, "SetInstanceHealth"), "the instance was handed back: %s", c)
		}
		assert.Check(t, is.Contains(run.log, "no lifecycle action of hook "+cloudfake.Hook+" waits for this instance"))
	})
	for _, state := range []string{"Warmed:Stopped", "InService"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, state, cloudfake.Hook)
			r.cfg.Deadlines.Join = nodeconfig.Duration(time.Second)
			r.asg.PendingAction = true
			r.host.dnfNeedsRepo = "no-such-repo"
			run := r.join()
			assert.Check(t, run.err != nil)
			assert.Assert(t, is.Len(nodetest.FailedLines(run.log), 1), run.log)
			assert.Check(t, is.DeepEqual(r.asg.Recorded(), []string{
				"DescribeAutoScalingInstances " + cloudfake.InstanceID,
				"CompleteLifecycleAction " + cloudfake.Group + " " + cloudfake.Hook + " " + cloudfake.InstanceID + " CONTINUE",
			}))
			assert.Check(t, !r.asg.PendingAction, "the hook still holds the instance (its timeout would abandon it)")
			assert.Check(t, is.Contains(run.log, "completed the lifecycle action of hook "+cloudfake.Hook+" with CONTINUE"))
			assert.Check(t, is.Equal(run.timeline.Result, "failed"))
		})
	}
}

// Kernel modules: a missing one brings in kernel-modules-extra of the running kernel from the release repository,
// then the sysctls are applied; one that stays missing is logged and the join goes on (kubeadm does not check it).
func TestJoinKernelModules(t *testing.T) {
	t.Parallel()
	extra := "kernel-modules-extra-" + kernelRelease()
	t.Run("installed", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, "", "")
		r.host.modulesMissing = []string{"br_netfilter"}
		run := r.join()
		assert.NilError(t, run.err)
		assert.Check(t, is.Contains(run.log, "kernel modules missing: br_netfilter; installing "+extra))
		i := run.index("modprobe br_netfilter")
		assert.Assert(t, i >= 0 && len(run.calls) > i+3, "%v", run.calls)
		assert.Check(t, is.DeepEqual(run.calls[i:i+4], []string{"modprobe br_netfilter", dnfInstall + " --repo=fedora " + extra,
			"modprobe br_netfilter", "sysctl -q -e --system"}))
		assert.Check(t, !strings.Contains(run.log, "still missing"))
	})
	t.Run("still missing", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, "", "")
		r.host.modulesMissing, r.host.dnfNeedsRepo = []string{"br_netfilter"}, "dynk8s-kubernetes"
		run := r.join()
		assert.NilError(t, run.err)
		assert.Check(t, is.Contains(run.log, "installing kernel-modules-extra failed: dnf install exited 1"))
		assert.Check(t, is.Contains(run.calls, dnfInstall+" --repo=fedora "+extra))
		assert.Check(t, is.Contains(run.calls, dnfInstall+" --repo=fedora --repo=updates "+extra))
		assert.Check(t, is.Contains(run.log, "still missing kernel modules: br_netfilter (kubeadm join does not need them"))
		assert.Check(t, run.index("kubeadm join") >= 0)
	})
}

// The images are pulled in the background once CRI-O runs: the token, the probe and the join go on meanwhile, and
// a failed pull does not fail the boot.
func TestJoinPrePullsWhileJoining(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.cfg.PrePullImages = append(r.cfg.PrePullImages, "quay.io/example/agent:2.1", "docker.io/library/busybox:latest")
	r.host.awaitJoin = make(chan struct{})
	run := r.join()
	assert.NilError(t, run.err)
	var pulls []string
	for _, c := range run.calls {
		if img, ok := strings.CutPrefix(c, "crictl --runtime-endpoint unix:///var/run/crio/crio.sock pull "); ok {
			pulls = append(pulls, img)
		}
	}
	assert.Check(t, is.DeepEqual(pulls, r.cfg.PrePullImages))
	assert.Check(t, run.index("kubeadm join") >= 0 && run.index("kubeadm join") < len(run.calls)-1,
		"kubeadm join waited for the pulls: %v", run.calls)
	assert.Check(t, is.Contains(run.log, "pre-pull of docker.io/library/busybox:latest failed (crictl exited 1)"))
	assert.Check(t, is.Contains(run.log, "(4 images, 1 failed)"))
	assert.Check(t, is.Equal(run.timeline.Result, "joined"))
	assert.Check(t, is.Equal(run.phases()[len(run.phases())-1], "pre-pull"))
}

// The API server is probed beside the preparation, not after it: here CRI-O's start waits for the API server's
// first answer, which the boot could not give before the crio phase if it probed only after it.
func TestJoinProbesTheAPIServerWhilePreparing(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	probed := make(chan struct{})
	var once sync.Once
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		once.Do(func() { close(probed) })
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(api.Close)
	r.cfg.APIServerEndpoint = endpoint.MustParse(strings.TrimPrefix(api.URL, "https://"))
	r.cfg.Deadlines.Join = nodeconfig.Duration(time.Minute) // a hang's bound
	r.host.gates = map[string]chan struct{}{"systemctl start crio.service": probed}
	run := r.join()
	assert.NilError(t, run.err, run.log)
	assert.Check(t, is.Equal(run.timeline.Result, "joined"))
	assert.Check(t, slices.Contains(run.phases(), "api-server"), "the join's wait is its api-server phase: %v",
		run.phases())
}

// The pins' lock runs beside the join's first phases, not in line after the packages: here it waits until the
// checks phase has turned swap off, which a lock in line would wait for until its gate's bound. kubeadm join comes
// after its end, and only then is the instance marked prepared.
func TestJoinLocksBesideTheJoin(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	checked := make(chan struct{})
	r.host.gates = map[string]chan struct{}{dnfLock: checked}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for !slices.Contains(r.host.Recorded(), "swapoff -a") {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		close(checked)
	}()
	run := r.join()
	assert.NilError(t, run.err, run.log)
	// The gate held the lock until swapoff had run: in line, the lock would have failed at the gate's bound.
	swap, join := run.index("swapoff -a"), run.index("kubeadm join")
	assert.Check(t, swap >= 0 && join > swap, "swapoff %d, kubeadm join %d: %v", swap, join, run.calls)
	phases := run.phases()
	assert.Check(t, slices.Index(phases, "lock") >= 0 && slices.Index(phases, "lock") < slices.Index(phases, "kubeadm-join"),
		"the lock did not end before kubeadm join: %v", phases)
	lockEnd := strings.Index(run.log, "phase=lock took=")
	assert.Check(t, lockEnd >= 0 && lockEnd < strings.Index(run.log, "phase=kubeadm-join took="), run.log)
	_, err := os.Stat(filepath.Join(r.root, "var/lib/dynk8s/prepared"))
	assert.Check(t, err)
}

// --skip leaves the named phases out of the boot, each with one log line, and runs the rest in order; a name that is
// no phase is a usage error before anything runs.
func TestJoinSkipsPhases(t *testing.T) {
	r := newRig(t, "", "")
	r.skip = map[string]bool{"packages": true, "api-server": true}
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, is.DeepEqual(run.phases(), []string{"identity", "kernel", "crio", "checks", "token", "kubelet-key",
		"kubeadm-join", "pre-pull"}))
	assert.Check(t, is.Contains(run.log, "phase=packages skipped (--skip)"))
	assert.Check(t, is.Contains(run.log, "phase=api-server skipped (--skip)"))
	assert.Check(t, run.index("dnf") == -1, "dnf ran: %v", run.calls)

	skip, err := skipped("packages,crio")
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(skip, map[string]bool{"packages": true, "crio": true}))
	_, err = skipped("packages,kubelet")
	assert.ErrorContains(t, err, `--skip packages,kubelet: no phase "kubelet" (the phases: kernel, packages, crio, cache, checks, token, kubelet-key, api-server, kubeadm-join)`)
}

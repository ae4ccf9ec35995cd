//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dynk8s/dynk8s/infra/addons"
)

// The lease timing of TestControllerLeaderHandover, shorter than the Deployment's 15 s, 10 s and 2 s so that the
// handover is quick to watch; client-go's leader election takes any lease-duration > renew-deadline > retry-period.
const (
	handoverLease = 6 * time.Second
	handoverRenew = 4 * time.Second
	handoverRetry = time.Second
	// handoverSlack is what a takeover may take beyond the lease duration: the follower tries once a retry period,
	// from when it last saw the leader's renewal (up to one retry period before the kill), plus the load of a
	// 2-core machine running the control plane beside it (a fresh, loaded machine is several times slower than a
	// warm one: the bound says "the lease, not forever", not how fast).
	handoverSlack = 2*handoverRetry + 10*time.Second
)

// TestControllerLeaderHandover runs two replicas of dynk8s-controller as the Deployment runs them (its rendered
// args, the controller ServiceAccount, the cleanup IAM user's key against moto), each with an identity of its own
// and a short lease:
//   - exactly one holds the Lease kube-system/dynk8s-controller and runs the loops; both answer /healthz, /readyz
//     and /metrics on --addr, the metrics naming dynk8s_controller_csr_decisions_total and the leader's
//     dynk8s_controller_leader 1, the follower's 0;
//   - the leader SIGKILLed (no release of the Lease), the follower holds the Lease within the lease duration plus
//     handoverSlack (the time is logged);
//   - the new leader approves a join: a kubelet-like CSR of the join tokens' group for a live instance of a pool's
//     group, whose key the instance marked (CreateTags in moto).
func TestControllerLeaderHandover(t *testing.T) {
	c := requireCluster(t)
	requireTool(t, "python3")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	cfg := devConfig(t)
	pool := firstTaintedPool(t, cfg)
	const token = "e2eho1.0123456789abcdef"
	kubeadmInitGroup(ctx, t, c, token, addons.NodeBootstrapGroup)
	controllerObjects(ctx, t, c)
	s := loadStackAutoscaling(t)
	a := startAWS(ctx, t, s, []replayUser{{Name: s.cleanupUser, Policy: s.cleanupPolicy}})
	var live []string
	a.python(ctx, t, nil, &live, "launch", a.admin.Key, a.admin.Secret, s.poolGroup(t, pool.Name), "1")
	if len(live) != 1 {
		t.Fatalf("launched %v, want one instance", live)
	}

	replica := func(id string) *controllerProcess {
		return startController(ctx, t, c, controllerSpec{args: renderedControllerArgs(t), identity: id,
			set: []string{"--loops=approve", "--lease-duration=" + handoverLease.String(),
				"--renew-deadline=" + handoverRenew.String(), "--retry-period=" + handoverRetry.String()},
			ec2: a.url, ssm: a.url, ec2Key: a.users[s.cleanupUser]})
	}
	replicas := map[string]*controllerProcess{"e2e-controller-a": replica("e2e-controller-a"),
		"e2e-controller-b": replica("e2e-controller-b")}
	leaderID := waitLeader(ctx, t, c, time.Minute, "e2e-controller-a", "e2e-controller-b")
	leader := replicas[leaderID]
	followerID := "e2e-controller-a"
	if leaderID == followerID {
		followerID = "e2e-controller-b"
	}
	follower := replicas[followerID]
	leader.waitLine(t, time.Minute, "leading: running the loops", map[string]string{"identity": leaderID})
	follower.waitLine(t, time.Minute, "following", map[string]string{"leader": leaderID})
	t.Logf("leader %s, follower %s", leaderID, followerID)

	for id, p := range replicas {
		for _, path := range []string{"/healthz", "/readyz"} {
			if status, body := p.get(t, path); status != http.StatusOK {
				t.Errorf("%s %s: %d %q", id, path, status, body)
			}
		}
		want := "dynk8s_controller_leader 0"
		if id == leaderID {
			want = "dynk8s_controller_leader 1"
		}
		status, metrics := p.get(t, "/metrics")
		for _, m := range []string{want, "dynk8s_controller_csr_decisions_total"} {
			if status != http.StatusOK || !strings.Contains(metrics, m) {
				t.Errorf("%s /metrics (%d) lacks %q", id, status, m)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The leader's node is lost: no release, the Lease runs out.
	killed := time.Now()
	leader.kill()
	took := time.Duration(0)
	for deadline := killed.Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if leaseHolder(ctx, c) == followerID {
			took = time.Since(killed)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Lease is held by %q a minute after %s was killed:\n%s", leaseHolder(ctx, c), leaderID,
				tail(follower.log(), 30))
		}
	}
	t.Logf("handover: %s holds the Lease %.1f s after %s was killed (lease duration %s, allowed %s)", followerID,
		took.Seconds(), leaderID, handoverLease, handoverLease+handoverSlack)
	if took > handoverLease+handoverSlack {
		t.Errorf("the takeover took %s, more than the lease duration %s plus %s", took, handoverLease, handoverSlack)
	}
	follower.waitLine(t, 30*time.Second, "leading: running the loops", map[string]string{"identity": followerID})
	if status, metrics := follower.get(t, "/metrics"); status != http.StatusOK ||
		!strings.Contains(metrics, "dynk8s_controller_leader 1") {
		t.Errorf("the new leader's /metrics (%d) lacks dynk8s_controller_leader 1", status)
	}

	// A join after the handover, judged by the new leader.
	request, key := kubeletRequest(t, live[0])
	a.markKey(ctx, t, live[0], key)
	createCSR(ctx, t, c, token, "e2e-csr-after-handover", request)
	if got := waitCSRDecided(ctx, t, c, "e2e-csr-after-handover", follower); got.decision != "Approved" {
		t.Errorf("after the handover, the CSR for %s is %s %q, want Approved", live[0], got.decision, got.message)
	}
	follower.waitLine(t, 10*time.Second, "approve", map[string]string{"node": live[0]})
	if cert := waitCSRCertificate(ctx, c, "e2e-csr-after-handover", 20*time.Second); cert == "" {
		t.Errorf("the approved CSR for %s was never signed", live[0])
	}
	if status, metrics := follower.get(t, "/metrics"); status != http.StatusOK ||
		!strings.Contains(metrics, `dynk8s_controller_csr_decisions_total{decision="approved",reason="live-instance"} 1`) {
		t.Errorf("the new leader's /metrics (%d) does not count the approval:\n%s", status,
			grepLines(metrics, "dynk8s_controller_csr_decisions_total"))
	}
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

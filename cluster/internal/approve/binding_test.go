package approve

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/testkit/csrtest"
)

const liveID = "i-0a00000000000000a"

// TestKeyBindingRace: a token holder's CSR for a live instance's name, with a key of its own, made before or after
// the instance's own CSR, is denied for its key, and the instance's own CSR is approved, in both orders; a retried
// CSR of the instance with the same key, older than its newest, is denied as superseded.
func TestKeyBindingRace(t *testing.T) {
	for _, racerFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("racer first %v", racerFirst), func(t *testing.T) {
			own := newKey(t)
			base := time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC)
			realAt, racerAt := base.Add(10*time.Second), base.Add(20*time.Second)
			if racerFirst {
				realAt, racerAt = racerAt, realAt
			}
			csrs := []runtime.Object{
				kubeletCSR("real", requestFor(t, csrtest.KubeletSubject(liveID), own), realAt),
				kubeletCSR("racer", requestFor(t, csrtest.KubeletSubject(liveID), newKey(t)), racerAt),
				kubeletCSR("retry", requestFor(t, csrtest.KubeletSubject(liveID), own), base),
			}
			r := newRig(t, []fakeaws.EC2Instance{instance(liveID, "builders-x86", keyMark(t, own))}, csrs...)
			r.start(t)
			r.decided(t, "real", "racer", "retry")
			assert.Check(t, is.Equal(r.condition(t, "real").Type, certificatesv1.CertificateApproved))
			assert.Check(t, is.Equal(r.condition(t, "racer").Message,
				"dynk8s-controller: its public key is not the one "+liveID+" marked"))
			assert.Check(t, is.Equal(r.condition(t, "retry").Message,
				"dynk8s-controller: a newer CSR for "+liveID+", real, is the one approved"))
		})
	}
}

// TestKeyMarkWait: a CSR whose live instance has marked no key stays pending, with an Event, while the instance
// may still mark it, and is denied once KeyMarkWait has passed since the CSR was made.
func TestKeyMarkWait(t *testing.T) {
	r := newRig(t, []fakeaws.EC2Instance{instance(liveID, "builders-x86", "")})
	created := r.clock.Now().Add(-time.Minute)
	r.client = fakeClientset([]runtime.Object{kubeletCSR("early", requestFor(t, csrtest.KubeletSubject(liveID),
		newKey(t)), created)}, r.watching)
	r.start(t)
	poll := func() (bool, string) {
		return r.hasEvent("Normal " + EventWaiting + " waiting for " + liveID + "'s kubelet key mark"), "no Event"
	}
	r.until(t, poll) // steps the clock a second a try, well within the wait
	assert.Check(t, r.condition(t, "early") == nil, "decided before KeyMarkWait")
	assert.Check(t, r.clock.Now().Sub(created) < DefaultKeyMarkWait)
	r.clock.Step(DefaultKeyMarkWait)
	r.decided(t, "early")
	c := r.condition(t, "early")
	assert.Check(t, is.Equal(c.Type, certificatesv1.CertificateDenied))
	assert.Check(t, is.Equal(c.Message, "dynk8s-controller: "+liveID+" marked no kubelet key "+
		"(dynk8s:kubelet-key-sha256) within 10m0s of the CSR"))
	assert.Check(t, !c.LastUpdateTime.Time.Before(created.Add(DefaultKeyMarkWait)))
}

// TestApprovedBeforeSurvives: after an approval, a new CSR for the same instance (with the instance's own key) is
// denied as approved before, also once the approved CSR is deleted (the controller manager's cleaner does after an
// hour) and the controller restarts: the record says so, not the CSRs.
func TestApprovedBeforeSurvives(t *testing.T) {
	key := newKey(t)
	request := requestFor(t, csrtest.KubeletSubject(liveID), key)
	r := newRig(t, []fakeaws.EC2Instance{instance(liveID, "builders-x86", keyMark(t, key))},
		kubeletCSR("first", request, time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC)))
	r.start(t)
	r.decided(t, "first")
	assert.Assert(t, is.Equal(r.condition(t, "first").Type, certificatesv1.CertificateApproved))
	r.stop()
	ctx := context.Background()
	assert.NilError(t, r.client.CertificatesV1().CertificateSigningRequests().Delete(ctx, "first",
		metav1.DeleteOptions{}))
	r.start(t)
	r.create(t, kubeletCSR("second", requestFor(t, csrtest.KubeletSubject(liveID), key), r.clock.Now()))
	r.decided(t, "second")
	assert.Check(t, is.Equal(r.condition(t, "second").Message,
		"dynk8s-controller: a certificate for "+liveID+" was approved before"))
	cm, err := r.client.CoreV1().ConfigMaps(testNS).Get(ctx, testRecord, metav1.GetOptions{})
	assert.NilError(t, err)
	entry, ok := parseApproval(cm.Data[liveID])
	assert.Check(t, ok && entry.UID == "uid-first", cm.Data[liveID])
}

// TestRecordFinishesAnApproval: a record that names a CSR still pending (the controller stopped between the
// record's write and the approval's) finishes that approval without writing the record again, and the update that
// records a new approval drops the entries older than two hours of instances that are not live, only those.
func TestRecordFinishesAnApproval(t *testing.T) {
	key := newKey(t)
	const other = "i-0b00000000000000b"
	r := newRig(t, []fakeaws.EC2Instance{instance(liveID, "builders-x86", keyMark(t, key)),
		instance(other, "builders-x86", keyMark(t, key))},
		kubeletCSR("recorded", requestFor(t, csrtest.KubeletSubject(liveID), key),
			time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC)),
		recordOf(map[string]string{liveID: "uid-recorded 2026-03-01T11:59:30Z",
			"i-0c00000000000000c": "uid-gone 2026-03-01T09:00:00Z",
			"i-0d00000000000000d": "uid-recent 2026-03-01T11:00:00Z"}))
	r.start(t)
	r.decided(t, "recorded")
	assert.Check(t, is.Equal(r.condition(t, "recorded").Type, certificatesv1.CertificateApproved))
	for _, a := range r.client.Actions() {
		assert.Check(t, a.GetResource().Resource != "configmaps" || (a.GetVerb() != "update" &&
			a.GetVerb() != "create"), "the record was written again: %v", a)
	}
	r.create(t, kubeletCSR("other", requestFor(t, csrtest.KubeletSubject(other), key), r.clock.Now()))
	r.decided(t, "other")
	assert.Check(t, is.Equal(r.condition(t, "other").Type, certificatesv1.CertificateApproved))
	cm, err := r.client.CoreV1().ConfigMaps(testNS).Get(context.Background(), testRecord, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Len(cm.Data, 3), "%v", cm.Data)
	assert.Check(t, is.Contains(cm.Data, liveID))
	assert.Check(t, is.Contains(cm.Data, other))
	assert.Check(t, is.Contains(cm.Data, "i-0d00000000000000d"))
}

// TestEC2Down: while EC2 cannot be asked, a CSR that needs its answer gets no decision and an Event says the join
// waits, a CSR that needs none is still denied, and once EC2 answers the CSR is approved.
func TestEC2Down(t *testing.T) {
	key := newKey(t)
	at := time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC)
	r := newRig(t, []fakeaws.EC2Instance{instance(liveID, "builders-x86", keyMark(t, key))},
		kubeletCSR("live", requestFor(t, csrtest.KubeletSubject(liveID), key), at),
		kubeletCSR("onprem-name", requestFor(t, csrtest.KubeletSubject("worker-1"), key), at))
	r.ec2.Fail(-1, 503, "Unavailable")
	r.start(t)
	r.decided(t, "onprem-name")
	r.until(t, func() (bool, string) {
		return r.hasEvent("Warning " + EventEC2Unusable + " cannot ask EC2: "), "no Event"
	})
	assert.Check(t, is.Contains(strings.Join(r.eventsSeen(), "\n"), "the join waits"))
	assert.Check(t, r.condition(t, "live") == nil, "decided while EC2 is down")
	assert.Check(t, is.DeepEqual(r.approvalWrites(), []string{"onprem-name Denied"}))
	r.ec2.Fail(0, 0, "")
	r.decided(t, "live")
	assert.Check(t, is.Equal(r.condition(t, "live").Type, certificatesv1.CertificateApproved))
}

// TestFlood: 2000 bogus CSRs (half well-formed for names of no live instance, half garbage requests), made before
// one own join's CSR, do not hold the own one back: its approval is written while denials are still
// outstanding, and EC2 is asked a few times, not once per CSR. The fake API server's writes are given some latency
// (0.2 ms, less than a own one's): the fake's own microseconds would let every denial finish before any judgement.
func TestFlood(t *testing.T) {
	started := time.Now()
	key := newKey(t)
	base := time.Date(2026, 3, 1, 11, 50, 0, 0, time.UTC)
	var objs []runtime.Object
	var bogus []string
	for i := range 2000 {
		name := fmt.Sprintf("flood-%04d", i)
		request := []byte("-----BEGIN CERTIFICATE REQUEST-----\ngarbage\n-----END CERTIFICATE REQUEST-----\n")
		if i%2 == 0 {
			request = requestFor(t, csrtest.KubeletSubject(fmt.Sprintf("i-%017x", 0xf0000+i)), key)
		}
		objs = append(objs, kubeletCSR(name, request, base.Add(time.Duration(i)*time.Millisecond)))
		bogus = append(bogus, name)
	}
	objs = append(objs, kubeletCSR("real", requestFor(t, csrtest.KubeletSubject(liveID), key), base.Add(time.Minute)))
	r := newRig(t, []fakeaws.EC2Instance{instance(liveID, "builders-x86", keyMark(t, key))}, objs...)
	r.client.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object,
		error) {
		time.Sleep(200 * time.Microsecond)
		return false, nil, nil
	})
	// Listing 2001 CSRs is the fake's slowest call: poll it seldom, and give the race detector's build time.
	r.timeout, r.delay = 2*time.Minute, 250*time.Millisecond
	r.start(t)
	r.decided(t, append(bogus, "real")...)
	writes := r.approvalWrites()
	at := slices.Index(writes, "real Approved")
	assert.Assert(t, at >= 0, "no approval of real")
	assert.Check(t, at < len(writes)-1, "the approval is the last write: every denial came first")
	assert.Check(t, is.Len(writes, 2001))
	assert.Check(t, len(r.ec2.Actions()) <= 3, "EC2 calls: %d", len(r.ec2.Actions()))
	t.Logf("2001 CSRs judged in %s; the approval was write %d of %d; %d EC2 calls",
		time.Since(started).Round(time.Millisecond), at+1, len(writes), len(r.ec2.Actions()))
}

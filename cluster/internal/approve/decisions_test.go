package approve

import (
	"context"
	"crypto/x509/pkix"
	"encoding/asn1"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/testkit/csrtest"
)

var (
	oidCN = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidO  = asn1.ObjectIdentifier{2, 5, 4, 10}
)

// rawSubjectRequest is a request signed with a new key whose subject is rdn as given, byte for byte.
func rawSubjectRequest(t *testing.T, rdn pkix.RDNSequence) []byte {
	t.Helper()
	raw, err := asn1.Marshal(rdn)
	assert.NilError(t, err)
	key := newKey(t)
	return requestForRaw(t, raw, key)
}

func bmpString(s string) asn1.RawValue {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u>>8), byte(u))
	}
	return asn1.RawValue{Tag: asn1.TagBMPString, Bytes: b}
}

// TestDecisions is the approval loop's decision table, the one the approver before it (a script) was held to, with
// the key binding added: it approves the kubelet client CSR of a live, marked instance
// of the stack's groups and pools, and denies every other pending kubelet client CSR of the group with its reason
// code and message: another node's name, a live instance whose Node exists or that had a certificate approved
// before, an instance EC2 does not know or that is in no group or in another pool, a subject or request a kubelet
// does not make (another organization, two common names, a BMPString common name, a SAN, a request larger than a
// kubelet's), server usages, a second CSR for the name with a key the instance did not mark, and every request that
// is not exactly one PEM block (csrtest.Smuggled). CSRs of other groups or signers, renewals and decided ones get
// no write at all.
func TestDecisions(t *testing.T) {
	const live, other, exists, before, unknown, grouped, live2, live3 = "i-0a00000000000000a", "i-0b00000000000000b",
		"i-0c00000000000000c", "i-0d00000000000000d", "i-0e00000000000000e", "i-0f00000000000000f",
		"i-01000000000000001", "i-02000000000000002"
	key := newKey(t)
	mark := keyMark(t, key)
	var (
		csrs []*certificatesv1.CertificateSigningRequest
		when = time.Date(2026, 3, 1, 11, 50, 0, 0, time.UTC)
	)
	add := func(name string, request []byte) *certificatesv1.CertificateSigningRequest {
		c := kubeletCSR(name, request, when.Add(time.Duration(len(csrs))*time.Second))
		csrs = append(csrs, c)
		return c
	}
	subject := csrtest.KubeletSubject
	org := pkix.RelativeDistinguishedNameSET{{Type: oidO, Value: "system:nodes"}}

	add("live", requestFor(t, subject(live), key))
	add("onprem-name", requestFor(t, subject("worker-1"), newKey(t)))
	add("control-plane", requestFor(t, subject("cp-1"), newKey(t)))
	add("node-exists", requestFor(t, subject(exists), key))
	add("approved-before", requestFor(t, subject(before), key))
	add("not-in-ec2", requestFor(t, subject(unknown), key))
	add("no-group", requestFor(t, subject(grouped), key))
	add("other-pool", requestFor(t, subject(other), key))
	add("masters", requestFor(t, pkix.Name{CommonName: "system:node:" + live,
		Organization: []string{"system:masters"}}, key))
	add("two-names", rawSubjectRequest(t, pkix.RDNSequence{org, {{Type: oidCN, Value: "system:node:" + live}},
		{{Type: oidCN, Value: "system:node:cp-1"}}}))
	add("bmp-name", rawSubjectRequest(t, pkix.RDNSequence{org, {{Type: oidCN, Value: bmpString("system:node:cp-1")}}}))
	add("server-usages", requestFor(t, subject(live), key)).Spec.Usages = []certificatesv1.KeyUsage{
		certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	add("with-san", requestFor(t, subject(live), key, "evil.example"))
	add("oversized", requestFor(t, pkix.Name{CommonName: "system:node:" + live3, Organization: []string{"system:nodes"},
		OrganizationalUnit: []string{strings.Repeat("x", 3000)}}, key))
	add("live-other-key", requestFor(t, subject(live), newKey(t)))
	smuggled := csrtest.Smuggled(t, live2, live3, "cp-1")
	for _, name := range slices.Sorted(maps.Keys(smuggled)) {
		add("smuggled-"+name, []byte(smuggled[name]))
	}
	// Left alone: kubeadm's token group, the serving signer, a renewal (the kubelet's own identity), decided.
	kubeadmGroup := add("kubeadm-group", requestFor(t, subject("worker-1"), newKey(t)))
	kubeadmGroup.Spec.Groups = []string{"system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token"}
	add("serving", requestFor(t, subject(live), key)).Spec.SignerName = "kubernetes.io/kubelet-serving"
	renewal := add("renewal", requestFor(t, subject("i-0aaaaaaaaaaaaaaaa"), newKey(t)))
	renewal.Spec.Username, renewal.Spec.Groups = "system:node:i-0aaaaaaaaaaaaaaaa",
		[]string{"system:nodes", "system:authenticated"}
	decided := add("decided", requestFor(t, subject(live), key))
	decided.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
		Type: certificatesv1.CertificateApproved, Status: "True", Reason: ApprovedReason, Message: "earlier"}}
	untouched := []string{"kubeadm-group", "serving", "renewal", "decided"}

	objs := []runtime.Object{node(exists), node("worker-1"),
		recordOf(map[string]string{before: "uid-gone 2026-03-01T11:00:00Z"})}
	for _, c := range csrs {
		objs = append(objs, c)
	}
	instances := []fakeaws.EC2Instance{
		instance(live, "builders-x86", mark), instance(before, "builders-x86", mark),
		instance(other, "other-pool", mark), instance(exists, "builders-x86", mark),
		instance(live2, "builders-x86", mark), instance(live3, "builders-arm", mark),
	}
	noGroup := instance(grouped, "builders-x86", mark)
	delete(noGroup.Tags, "aws:autoscaling:groupName")
	instances = append(instances, noGroup)
	r := newRig(t, instances, objs...)
	r.start(t)

	type want struct {
		reason Reason
		text   string // in the message
	}
	notOne := "the request is not exactly one CERTIFICATE REQUEST PEM block"
	wants := map[string]want{
		"live": {ReasonLiveInstance, "dynk8s-controller: live instance of group builders-x86-asg, pool " +
			"builders-x86, node " + live},
		"onprem-name":     {ReasonSubject, `the common name ["system:node:worker-1"] is not system:node:<instance id>`},
		"control-plane":   {ReasonSubject, `the common name ["system:node:cp-1"] is not system:node:<instance id>`},
		"node-exists":     {ReasonNodeExists, "a Node named " + exists + " exists already"},
		"approved-before": {ReasonApprovedBefore, "a certificate for " + before + " was approved before"},
		"not-in-ec2": {ReasonNotLive, unknown + " is no pending or running instance of an Auto Scaling group of " +
			"cluster homelab"},
		"no-group": {ReasonNotLive, grouped + " is no pending or running instance of an Auto Scaling group of " +
			"cluster homelab"},
		"other-pool": {ReasonPool, other + ` of group other-pool-asg is in pool "other-pool", not one of this ` +
			`stack's (builders-arm builders-x86)`},
		"masters": {ReasonSubject, `the subject's organizations are ["system:masters"] with 0 other attributes, ` +
			`want exactly ["system:nodes"]`},
		"two-names":      {ReasonSubject, "the subject is 3 RDNs, want exactly O=system:nodes and CN=system:node:"},
		"bmp-name":       {ReasonSubject, "a subject value of tag 30, not PrintableString or UTF8String"},
		"server-usages":  {ReasonUsages, `usages ["digital signature","server auth"] are not a kubelet client`},
		"with-san":       {ReasonExtension, "the request has attributes or extensions"},
		"oversized":      {ReasonRequest, "more than a kubelet's request (4096)"},
		"live-other-key": {ReasonKeyMismatch, "its public key is not the one " + live + " marked"},
	}
	for name := range smuggled {
		wants["smuggled-"+name] = want{ReasonRequest, notOne}
	}
	judged := slices.Collect(maps.Keys(wants))
	r.decided(t, judged...)

	for _, name := range slices.Sorted(maps.Keys(wants)) {
		w := wants[name]
		c := r.condition(t, name)
		kind, reason := certificatesv1.CertificateDenied, DeniedReason
		if w.reason == ReasonLiveInstance {
			kind, reason = certificatesv1.CertificateApproved, ApprovedReason
		}
		assert.Check(t, is.Equal(c.Type, kind), name)
		assert.Check(t, is.Equal(c.Reason, reason), name)
		assert.Check(t, is.Equal(string(c.Status), "True"), name)
		assert.Check(t, strings.HasPrefix(c.Message, "dynk8s-controller: "), "%s: %s", name, c.Message)
		assert.Check(t, is.Contains(c.Message, w.text), name)
		assert.Check(t, !c.LastUpdateTime.IsZero() && !c.LastUpdateTime.After(r.clock.Now()), name)
		if w.reason != ReasonLiveInstance {
			assert.Check(t, r.hasEvent("Warning "+EventDenied+" "+c.Message), "%s: no Event %q", name, c.Message)
		}
	}
	// The reason codes are the metric's labels.
	counts := map[Reason]float64{}
	for _, w := range wants {
		counts[w.reason]++
	}
	// A decision counts once its write has returned, which may come after the test has read the CSR.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, reason := range slices.Sorted(maps.Keys(counts)) {
			decision := "denied"
			if reason == ReasonLiveInstance {
				decision = "approved"
			}
			if v := metricValue(t, r.ctrl.decisions.WithLabelValues(decision, string(reason))); v != counts[reason] {
				return poll.Continue("%s/%s counted %v times, want %v", decision, reason, v, counts[reason])
			}
		}
		return poll.Success()
	}, poll.WithTimeout(r.timeout), poll.WithDelay(r.delay))
	// Nothing was written to the CSRs the loop does not judge, and none of them counts as pending: the gauge drops
	// as the informer delivers each decision back, which may come after the test has read the decisions.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if v := metricValue(t, r.ctrl.pending); v != 0 {
			return poll.Continue("%v CSRs pending", v)
		}
		return poll.Success()
	}, poll.WithTimeout(r.timeout), poll.WithDelay(r.delay))
	r.stop()
	for _, w := range r.approvalWrites() {
		name, _, _ := strings.Cut(w, " ")
		assert.Check(t, !slices.Contains(untouched, name), "a write to %s: %s", name, w)
	}
	assert.Check(t, is.Len(r.approvalWrites(), len(wants)), "one write per judged CSR: %v", r.approvalWrites())
	for _, name := range untouched {
		c := r.condition(t, name)
		assert.Check(t, name == "decided" && c != nil && c.Message == "earlier" || name != "decided" && c == nil, name)
	}
	// The approval is in the record, with the CSR's uid and the time.
	cm, err := r.client.CoreV1().ConfigMaps(testNS).Get(context.Background(), testRecord, metav1.GetOptions{})
	assert.NilError(t, err)
	entry, ok := parseApproval(cm.Data[live])
	assert.Check(t, ok, cm.Data[live])
	assert.Check(t, is.Equal(entry.UID, "uid-live"))
	approvedAt := r.condition(t, "live").LastUpdateTime.Time
	assert.Check(t, !entry.Time.After(approvedAt) && entry.Time.After(approvedAt.Add(-time.Minute)),
		"recorded %s, approved %s", entry.Time, approvedAt)
	assert.Check(t, is.Equal(cm.Data[before], "uid-gone 2026-03-01T11:00:00Z"))
}

package addons

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/testkit/csrtest"
	"github.com/dynk8s/dynk8s/internal/testkit/realtools"
)

var (
	oidCommonName   = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidOrganization = asn1.ObjectIdentifier{2, 5, 4, 10}
)

// csrRequest is the base64 of a PEM certificate request, as a CSR's spec.request holds it, made by Go's x509 the way
// a kubelet's client-go makes it (an ECDSA P-256 key, the subject, no extensions), or with the raw subject given.
func csrRequest(t *testing.T, subject pkix.Name, rawSubject pkix.RDNSequence, dnsNames ...string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	tmpl := &x509.CertificateRequest{Subject: subject, DNSNames: dnsNames}
	if rawSubject != nil {
		tmpl.RawSubject, err = asn1.Marshal(rawSubject)
		assert.NilError(t, err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	assert.NilError(t, err)
	return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

var kubeletSubject = csrtest.KubeletSubject

// testCSR is a CertificateSigningRequest as the API server serves it.
type testCSR struct {
	name, request, signer string
	groups, usages        []string
	approved              string // the message of an Approved condition, if any
}

// object is the CSR as the API server serves it; created orders it among the others (creationTimestamp, seconds).
func (c testCSR) object(created int) map[string]any {
	o := map[string]any{
		"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
		"metadata": map[string]any{"name": c.name, "uid": "uid-" + c.name,
			"creationTimestamp": time.Date(2026, 1, 1, 0, 0, created, 0, time.UTC).Format(time.RFC3339)},
		"spec": map[string]any{"request": c.request, "signerName": c.signer, "usages": c.usages,
			"groups": c.groups, "username": "system:bootstrap:abcdef"},
		"status": map[string]any{},
	}
	if c.approved != "" {
		o["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Approved", "status": "True",
			"reason": "DynK8sLiveInstance", "message": c.approved}}}
	}
	return o
}

// approverRun is one run of approve-csr.sh (APPROVER_ONCE: the rounds its CSRs take) against stand-ins: kubectl
// serves the CSRs, created in the order given, and the Nodes that exist, and writes what the script sets through the
// approval subresource into the CSRs it serves next, as the API server does; aws answers describe-instances with
// the instances ("group pool" per instance id) or, with ec2Down, fails as the CLI does when EC2 cannot be reached.
type approverRun struct {
	decisions map[string]map[string]string // CSR name: type, reason, message of the condition it got
	order     []string                     // the CSR names in the order their conditions were written
	output    string
	status    int
	ec2Calls  int
	lists     int // how many times the script listed the CSRs: its rounds
}

func runApprover(t *testing.T, csrs []testCSR, nodes []string, instances map[string]string, ec2Down bool) approverRun {
	t.Helper()
	dir := realtools.ClosedPath(t, "jq")
	var items []any
	for i, c := range csrs {
		items = append(items, c.object(i))
	}
	b, err := json.Marshal(map[string]any{"kind": "CertificateSigningRequestList", "items": items})
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "list.json"), b, 0o644))
	decisions := filepath.Join(dir, "decisions.log")
	realtools.WriteStub(t, dir, "kubectl", fmt.Sprintf(`#!/bin/sh
dir=%q
case "$*" in
"get csr --output json") echo list >> "$dir/lists.log"; cat "$dir/list.json" ;;
"get csr "*" --output json") jq -e --arg n "$3" '.items[] | select(.metadata.name == $n)' "$dir/list.json" ;;
"get node "*" --output name")
	for n in %s; do [ "$n" = "$3" ] && echo "node/$3" && exit 0; done
	echo "Error from server (NotFound): nodes \"$3\" not found" >&2; exit 1 ;;
"replace --raw /apis/certificates.k8s.io/v1/certificatesigningrequests/"*"/approval --filename -")
	obj=$(cat)
	printf '%%s\n' "$obj" >> "$dir/decisions.log"
	printf '%%s' "$obj" | jq -c --slurpfile all "$dir/list.json" \
		'. as $o | $all[0] | .items |= map(if .metadata.name == $o.metadata.name then $o else . end)' \
		> "$dir/list.next" && mv "$dir/list.next" "$dir/list.json" ;;
*) echo "kubectl stand-in: unexpected $*" >&2; exit 3 ;;
esac
`, dir, strings.Join(nodes, " ")))
	var answer strings.Builder
	for id, facts := range instances {
		fmt.Fprintf(&answer, "%s\t%s\n", id, strings.ReplaceAll(facts, " ", "\t"))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "instances.txt"), []byte(answer.String()), 0o644))
	down := ""
	if ec2Down {
		down = `echo "Could not connect to the endpoint URL: \"https://ec2.eu-central-1.amazonaws.com/\"" >&2; exit 255`
	}
	realtools.WriteStub(t, dir, "aws", fmt.Sprintf(`#!/bin/sh
echo call >> %[1]q
[ "$1 $2" = "ec2 describe-instances" ] || { echo "aws stand-in: unexpected $*" >&2; exit 9; }
[ "$3 $4 $5" = "--filters Name=instance-state-name,Values=pending,running Name=tag:dynk8s:cluster,Values=homelab" ] ||
	{ echo "aws stand-in: unexpected filters $*" >&2; exit 9; }
%[2]s
cat %[3]q
`, filepath.Join(dir, "ec2.log"), down, filepath.Join(dir, "instances.txt")))
	realtools.WriteStub(t, dir, "sleep", "#!/bin/sh\nexit 0\n")
	script := filepath.Join(dir, "approve-csr.sh")
	assert.NilError(t, os.WriteFile(script, []byte(approveCSRScript), 0o755))

	cmd := exec.Command("bash", script)
	cmd.Env = []string{"PATH=" + dir, "TMPDIR=" + t.TempDir(), "APPROVER_ONCE=1", "BOOTSTRAP_GROUP=" + NodeBootstrapGroup,
		"CLUSTER_NAME=homelab", "POOLS=builders-arm builders-x86"}
	out, err := cmd.CombinedOutput()
	realtools.CheckNoMissingCommand(t, string(out))
	run := approverRun{output: string(out), decisions: map[string]map[string]string{}}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		run.status = exit.ExitCode()
	} else {
		assert.NilError(t, err)
	}
	if raw, err := os.ReadFile(decisions); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			var csr struct {
				Metadata struct{ Name string }
				Status   struct {
					Conditions []map[string]string
				}
			}
			assert.NilError(t, json.Unmarshal([]byte(line), &csr), line)
			last := csr.Status.Conditions[len(csr.Status.Conditions)-1]
			run.decisions[csr.Metadata.Name] = last
			run.order = append(run.order, csr.Metadata.Name)
		}
	}
	count := func(file string) int {
		raw, _ := os.ReadFile(filepath.Join(dir, file))
		return strings.Count(string(raw), "\n")
	}
	run.ec2Calls, run.lists = count("ec2.log"), count("lists.log")
	return run
}

// TestApproverDecisions is the approver's decision table, the real script against stand-ins for kubectl and the
// AWS CLI: it approves the kubelet client CSR of a live instance of the stack's groups and pools, and denies, each
// with its reason, every other CSR of the join tokens' group: another node's name, a live instance whose Node
// exists or that had a certificate before, an instance EC2 does not know or that is in no group or in another pool,
// a subject or request a kubelet does not make (another organization, two common names, a BMPString common name, a
// SAN, a request larger than a kubelet's), server usages, a second CSR for a name an older one claims, and every
// request that is not exactly one PEM block (csrtest.Smuggled: two would be judged under a live instance's name by a
// reader of the whole text, while the API server signs cp-1). CSRs of other groups, other signers or already
// decided are left alone. e2e/approver_test.go runs it against the real API server, kubelet and moto.
func TestApproverDecisions(t *testing.T) {
	const live, other, exists, before, unknown, grouped, live2, live3 = "i-0a00000000000000a", "i-0b00000000000000b",
		"i-0c00000000000000c", "i-0d00000000000000d", "i-0e00000000000000e", "i-0f00000000000000f",
		"i-01000000000000001", "i-02000000000000002"
	client := []string{"digital signature", "client auth"}
	ours := []string{"system:bootstrappers", NodeBootstrapGroup, "system:authenticated"}
	csr := func(name string, subject pkix.Name) testCSR {
		return testCSR{name: name, request: csrRequest(t, subject, nil), signer: KubeletClientSigner, groups: ours,
			usages: client}
	}
	bmp := func(s string) asn1.RawValue {
		var b []byte
		for _, u := range utf16.Encode([]rune(s)) {
			b = append(b, byte(u>>8), byte(u))
		}
		return asn1.RawValue{Tag: asn1.TagBMPString, Bytes: b}
	}
	raw := func(name string, rdn pkix.RDNSequence) testCSR {
		c := csr(name, pkix.Name{})
		c.request = csrRequest(t, pkix.Name{}, rdn)
		return c
	}
	org := pkix.RelativeDistinguishedNameSET{{Type: oidOrganization, Value: "system:nodes"}}
	serverUsages := csr("server-usages", kubeletSubject(live))
	serverUsages.usages = []string{"digital signature", "server auth"}
	withSAN := csr("with-san", kubeletSubject(live))
	withSAN.request = csrRequest(t, kubeletSubject(live), nil, "evil.example")
	kubeadmGroup := csr("kubeadm-group", kubeletSubject("worker-1"))
	kubeadmGroup.groups = []string{"system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token"}
	serving := csr("serving", kubeletSubject(live))
	serving.signer = "kubernetes.io/kubelet-serving"
	decided := csr("decided", kubeletSubject(live))
	decided.approved = "dynk8s-node-csr-approver: live instance of group g, pool builders-x86, node " + before

	csrs := []testCSR{
		csr("live", kubeletSubject(live)),
		csr("onprem-name", kubeletSubject("worker-1")),
		csr("control-plane", kubeletSubject("cp-1")),
		csr("node-exists", kubeletSubject(exists)),
		csr("approved-before", kubeletSubject(before)),
		csr("not-in-ec2", kubeletSubject(unknown)),
		csr("no-group", kubeletSubject(grouped)),
		csr("other-pool", kubeletSubject(other)),
		csr("masters", pkix.Name{CommonName: "system:node:" + live, Organization: []string{"system:masters"}}),
		raw("two-names", pkix.RDNSequence{org, {{Type: oidCommonName, Value: "system:node:" + live}},
			{{Type: oidCommonName, Value: "system:node:cp-1"}}}),
		raw("bmp-name", pkix.RDNSequence{org, {{Type: oidCommonName, Value: bmp("system:node:cp-1")}}}),
		serverUsages, withSAN, kubeadmGroup, serving, decided,
		csr("live-again", kubeletSubject(live)),
	}
	smuggled := csrtest.Smuggled(t, live2, live3, "cp-1")
	for _, name := range slices.Sorted(maps.Keys(smuggled)) {
		c := csr(name, pkix.Name{})
		c.request = base64.StdEncoding.EncodeToString([]byte(smuggled[name]))
		csrs = append(csrs, c)
	}
	oversized := csr("oversized", kubeletSubject(live3))
	oversized.request = csrRequest(t, pkix.Name{CommonName: "system:node:" + live3, Organization: []string{
		"system:nodes"}, OrganizationalUnit: []string{strings.Repeat("x", 3000)}}, nil)
	csrs = append(csrs, oversized)
	run := runApprover(t, csrs, []string{exists, "worker-1"}, map[string]string{
		live:    "builders-x86-asg builders-x86",
		before:  "builders-x86-asg builders-x86",
		grouped: "None None",
		other:   "someone-else other-pool",
		exists:  "builders-x86-asg builders-x86",
		live2:   "builders-x86-asg builders-x86",
		live3:   "builders-arm-asg builders-arm",
	}, false)
	assert.Equal(t, run.status, 0, run.output)
	reasons := map[string]string{}
	for name, c := range run.decisions {
		reasons[name] = c["type"] + ": " + c["message"]
	}
	want := map[string]string{
		"live": "Approved: dynk8s-node-csr-approver: live instance of group builders-x86-asg, pool builders-x86, " +
			"node " + live,
		"onprem-name":     "Denied: dynk8s-node-csr-approver: the common name [\"system:node:worker-1\"] is not system:node:<instance id>",
		"control-plane":   "Denied: dynk8s-node-csr-approver: the common name [\"system:node:cp-1\"] is not system:node:<instance id>",
		"node-exists":     "Denied: dynk8s-node-csr-approver: a Node named " + exists + " exists already",
		"approved-before": "Denied: dynk8s-node-csr-approver: a certificate for " + before + " was approved before",
		"not-in-ec2": "Denied: dynk8s-node-csr-approver: " + unknown +
			" is no pending or running instance of an Auto Scaling group of cluster homelab",
		"no-group": "Denied: dynk8s-node-csr-approver: " + grouped +
			" is no pending or running instance of an Auto Scaling group of cluster homelab",
		"other-pool": "Denied: dynk8s-node-csr-approver: " + other +
			" of group someone-else is in pool 'other-pool', not one of this stack's (builders-arm builders-x86)",
		"masters": "Denied: dynk8s-node-csr-approver: the subject's organizations are [\"system:masters\"] with 0 " +
			"other attributes, want exactly [\"system:nodes\"]",
		"two-names": "Denied: dynk8s-node-csr-approver: the common name [\"system:node:" + live +
			"\",\"system:node:cp-1\"] is not system:node:<instance id>",
		"bmp-name": "Denied: dynk8s-node-csr-approver: the request is no plain PKCS#10 request: a subject value of tag 30",
		"server-usages": "Denied: dynk8s-node-csr-approver: usages [\"digital signature\",\"server auth\"] are not a " +
			"kubelet client certificate's",
		"with-san":   "Denied: dynk8s-node-csr-approver: the request is no plain PKCS#10 request: attributes or extensions",
		"live-again": "Denied: dynk8s-node-csr-approver: an older pending CSR, live, claims " + live,
		"oversized": fmt.Sprintf("Denied: dynk8s-node-csr-approver: the request is %d bytes of base64, more than a "+
			"kubelet's request (4096)", len(oversized.request)),
	}
	for name := range smuggled {
		want[name] = "Denied: dynk8s-node-csr-approver: the request is not exactly one CERTIFICATE REQUEST PEM block"
	}
	assert.DeepEqual(t, reasons, want)
	for name, c := range run.decisions {
		if c["type"] == "Denied" {
			assert.Check(t, is.Equal(c["reason"], "DynK8sNotALiveInstance"), name)
		} else {
			assert.Check(t, is.Equal(c["reason"], "DynK8sLiveInstance"), name)
		}
	}
	// One round (19 denials, at most 20 a round), and one EC2 call in it, not one per CSR.
	assert.Equal(t, run.lists, 1, run.output)
	assert.Equal(t, run.ec2Calls, 1)
}

// kubeletCSR is the CSR a kubelet of the join tokens' group makes for node.
func kubeletCSR(t *testing.T, name, node string) testCSR {
	return testCSR{name: name, request: csrRequest(t, kubeletSubject(node), nil), signer: KubeletClientSigner,
		groups: []string{"system:bootstrappers", NodeBootstrapGroup}, usages: []string{"digital signature",
			"client auth"}}
}

// TestApproverFailsClosedWhenEC2CannotBeAsked: a CSR whose instance EC2 cannot be asked about gets no decision (it
// stays pending, and the CLI's message is in the log), while a CSR that needs no EC2 answer is still denied.
func TestApproverFailsClosedWhenEC2CannotBeAsked(t *testing.T) {
	const live = "i-0a00000000000000a"
	c := func(name, node string) testCSR { return kubeletCSR(t, name, node) }
	run := runApprover(t, []testCSR{c("live", live), c("onprem-name", "worker-1")}, nil,
		map[string]string{live: "builders-x86-asg builders-x86"}, true)
	assert.Equal(t, run.status, 0, run.output)
	assert.Equal(t, len(run.decisions), 1, run.output)
	assert.Equal(t, run.decisions["onprem-name"]["type"], "Denied")
	assert.Check(t, is.Contains(run.output, "cannot ask EC2 about the instances the pending CSRs name; they stay pending"))
	assert.Check(t, is.Contains(run.output, "Could not connect to the endpoint URL"))
}

// TestApproverJudgesAFloodInRounds: a token holder's flood of CSRs (here 100, each for an instance that is not live)
// cannot hold a real join back: the CSRs of two live instances, one made before the flood and one after it, are the
// first two decisions written (a round reads the oldest and the newest requests first, and approves before it
// denies), EC2 is asked once a round rather than once a CSR, and no round writes more than 20 denials before the
// next one lists the CSRs again (and would approve a CSR made meanwhile).
func TestApproverJudgesAFloodInRounds(t *testing.T) {
	const early, late = "i-0a00000000000000a", "i-0b00000000000000b"
	c := func(name, node string) testCSR { return kubeletCSR(t, name, node) }
	csrs := []testCSR{c("before-the-flood", early)}
	for i := range 100 {
		csrs = append(csrs, c(fmt.Sprintf("flood-%03d", i), fmt.Sprintf("i-%017x", 0xf000+i)))
	}
	csrs = append(csrs, c("after-the-flood", late))
	run := runApprover(t, csrs, nil, map[string]string{early: "builders-x86-asg builders-x86",
		late: "builders-arm-asg builders-arm"}, false)
	assert.Equal(t, run.status, 0, run.output)
	assert.Equal(t, len(run.decisions), 102)
	assert.DeepEqual(t, run.order[:2], []string{"before-the-flood", "after-the-flood"})
	assert.Equal(t, run.decisions["before-the-flood"]["type"], "Approved")
	assert.Equal(t, run.decisions["after-the-flood"]["type"], "Approved")
	assert.Equal(t, run.lists, 5, "100 denials take five rounds of at most 20")
	assert.Equal(t, run.ec2Calls, run.lists)
}

// TestApproverRefusesBadEnvironment: without its group, cluster or pools, or with a group that is not a bootstrap
// token group, the approver exits at once and judges nothing.
func TestApproverRefusesBadEnvironment(t *testing.T) {
	dir := realtools.ClosedPath(t, "jq")
	realtools.WriteStub(t, dir, "kubectl", "#!/bin/sh\necho called >&2\nexit 3\n")
	realtools.WriteStub(t, dir, "aws", "#!/bin/sh\nexit 3\n")
	script := filepath.Join(dir, "approve-csr.sh")
	assert.NilError(t, os.WriteFile(script, []byte(approveCSRScript), 0o755))
	good := map[string]string{"BOOTSTRAP_GROUP": NodeBootstrapGroup, "CLUSTER_NAME": "homelab", "POOLS": "a"}
	for name, change := range map[string][2]string{
		"no group":   {"BOOTSTRAP_GROUP", ""},
		"masters":    {"BOOTSTRAP_GROUP", "system:masters"},
		"no cluster": {"CLUSTER_NAME", ""},
		"no pools":   {"POOLS", ""},
	} {
		env := []string{"PATH=" + dir, "APPROVER_ONCE=1"}
		for k, v := range good {
			if k == change[0] {
				v = change[1]
			}
			env = append(env, k+"="+v)
		}
		cmd := exec.Command("bash", script)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		assert.Check(t, err != nil, "%s: %s", name, out)
		assert.Check(t, !strings.Contains(string(out), "called"), "%s: kubectl ran: %s", name, out)
	}
}

// TestOwnNodePolicies: the fuse untaint container's and the termination handler's ServiceAccounts are held to the
// Node their pod runs on (the token's node-name claim), and the untaint one to removing the startup taint. The e2e
// TestDaemonSetTokensActOnTheirOwnNode proves them against the real API server with bound tokens.
func TestOwnNodePolicies(t *testing.T) {
	run := mustRunAddons(t, testAddonsArgs)
	for name, sa := range map[string]string{FuseNodePolicyName: fuseComponent,
		TerminationHandlerNodePolicyName: nthName} {
		policy := run.object(t, typeAdmissionPolicy, name)
		assert.Equal(t, dig(t, policy, "spec", "matchConditions", 0, "expression"),
			"request.userInfo.username == 'system:serviceaccount:kube-system:"+sa+"'")
		assert.Equal(t, dig(t, policy, "spec", "validations", 0, "expression"),
			"'authentication.kubernetes.io/node-name' in request.userInfo.extra && object.metadata.name == "+
				"request.userInfo.extra['authentication.kubernetes.io/node-name'][0]")
		assert.DeepEqual(t, dig(t, policy, "spec", "matchConstraints", "resourceRules", 0, "operations"),
			[]any{"UPDATE", "DELETE"})
	}
	untaint := dig(t, run.object(t, typeAdmissionPolicy, FuseNodePolicyName), "spec", "validations", 1,
		"expression").(string)
	assert.Check(t, is.Contains(untaint, ".filter(t, t.key != 'startup-taint.cluster-autoscaler.kubernetes.io/fuse')"))
}

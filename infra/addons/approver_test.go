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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/realtools"
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

func kubeletSubject(node string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}
}

// testCSR is a CertificateSigningRequest as the API server serves it.
type testCSR struct {
	name, request, signer string
	groups, usages        []string
	approved              string // the message of an Approved condition, if any
}

func (c testCSR) object() map[string]any {
	o := map[string]any{
		"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
		"metadata": map[string]any{"name": c.name},
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

// approverRun is one run of approve-csr.sh over one watch, against stand-ins: kubectl serves the CSRs (the watch
// prints each object, as `kubectl get --watch -o json` does), the Nodes that exist, and records what the script
// writes to the approval subresource; aws answers describe-instances per instance id from instances ("group pool",
// or "NotFound" and "unreachable" for the CLI's errors).
type approverRun struct {
	decisions map[string]map[string]string // CSR name: type, reason, message of the condition it got
	output    string
	status    int
	ec2Calls  int
}

func runApprover(t *testing.T, csrs []testCSR, nodes []string, instances map[string]string) approverRun {
	t.Helper()
	dir := realtools.ClosedPath(t, "jq")
	var watch, all strings.Builder
	var items []any
	for _, c := range csrs {
		b, err := json.MarshalIndent(c.object(), "", "    ")
		assert.NilError(t, err)
		watch.Write(append(b, '\n'))
		assert.NilError(t, os.WriteFile(filepath.Join(dir, "csr-"+c.name+".json"), b, 0o644))
		items = append(items, c.object())
	}
	b, err := json.Marshal(map[string]any{"kind": "CertificateSigningRequestList", "items": items})
	assert.NilError(t, err)
	all.Write(b)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "watch.json"), []byte(watch.String()), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "list.json"), []byte(all.String()), 0o644))
	decisions := filepath.Join(dir, "decisions.log")
	realtools.WriteStub(t, dir, "kubectl", fmt.Sprintf(`#!/bin/sh
dir=%q
case "$*" in
"get csr --watch --output json --request-timeout 300s") cat "$dir/watch.json" ;;
"get csr --output json") cat "$dir/list.json" ;;
"get csr "*" --output json") cat "$dir/csr-$3.json" ;;
"get node "*" --output name")
	for n in %s; do [ "$n" = "$3" ] && echo "node/$3" && exit 0; done
	echo "Error from server (NotFound): nodes \"$3\" not found" >&2; exit 1 ;;
"replace --raw /apis/certificates.k8s.io/v1/certificatesigningrequests/"*"/approval --filename -")
	cat >> "$dir/decisions.log" ;;
*) echo "kubectl stand-in: unexpected $*" >&2; exit 3 ;;
esac
`, dir, strings.Join(nodes, " ")))
	var cases strings.Builder
	for id, answer := range instances {
		fmt.Fprintf(&cases, "%s) answer=%q ;;\n", id, answer)
	}
	realtools.WriteStub(t, dir, "aws", fmt.Sprintf(`#!/bin/sh
echo call >> %q
[ "$1 $2 $3" = "ec2 describe-instances --instance-ids" ] || { echo "aws stand-in: unexpected $*" >&2; exit 9; }
[ "$5 $6 $7" = "--filters Name=instance-state-name,Values=pending,running Name=tag:dynk8s:cluster,Values=homelab" ] ||
	{ echo "aws stand-in: unexpected filters $*" >&2; exit 9; }
answer=NotFound
case $4 in
%s
esac
case $answer in
NotFound) echo "An error occurred (InvalidInstanceID.NotFound) when calling the DescribeInstances operation: The instance ID '$4' does not exist" >&2; exit 254 ;;
unreachable) echo "Could not connect to the endpoint URL: \"https://ec2.eu-central-1.amazonaws.com/\"" >&2; exit 255 ;;
esac
printf '%%s\n' "$answer"
`, filepath.Join(dir, "ec2.log"), cases.String()))
	realtools.WriteStub(t, dir, "sleep", "#!/bin/sh\nexit 0\n")
	script := filepath.Join(dir, "approve-csr.sh")
	assert.NilError(t, os.WriteFile(script, []byte(approveCSRScript), 0o755))

	cmd := exec.Command("bash", script)
	cmd.Env = []string{"PATH=" + dir, "TMPDIR=" + t.TempDir(), "APPROVER_ONCE=1", "BOOTSTRAP_GROUP=" + NodeBootstrapGroup,
		"CLUSTER_NAME=homelab", "POOLS=builders-arm builders-x86"}
	out, err := cmd.CombinedOutput()
	realtools.CheckNoMissingCommand(t, string(out))
	run := approverRun{output: string(out), decisions: map[string]map[string]string{}}
	if exit, ok := err.(*exec.ExitError); ok {
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
		}
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "ec2.log")); err == nil {
		run.ec2Calls = strings.Count(string(raw), "call")
	}
	return run
}

// TestApproverDecisions is the approver's decision table, the real script against stand-ins for kubectl and the
// AWS CLI: it approves the kubelet client CSR of a live instance of the stack's groups and pools, and denies, each
// with its reason, every other CSR of the join tokens' group: another node's name, a live instance whose Node
// exists or that had a certificate before, an instance EC2 does not know or that is in no group or in another pool,
// a subject or request a kubelet does not make (another organization, two common names, a BMPString common name, a
// SAN), and server usages. CSRs of other groups, other signers or already decided are left alone, and a CSR EC2
// cannot be asked about stays pending. e2e/approver_test.go runs it against the real API server, kubelet and moto.
func TestApproverDecisions(t *testing.T) {
	const live, other, exists, before, unknown, grouped, pending = "i-0a00000000000000a", "i-0b00000000000000b",
		"i-0c00000000000000c", "i-0d00000000000000d", "i-0e00000000000000e", "i-0f00000000000000f", "i-01000000000000001"
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
		csr("ec2-down", kubeletSubject(pending)),
	}
	run := runApprover(t, csrs, []string{exists, "worker-1"}, map[string]string{
		live:    "builders-x86-asg builders-x86",
		before:  "builders-x86-asg builders-x86",
		grouped: "None None",
		other:   "someone-else other-pool",
		pending: "unreachable",
	})
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
		"with-san": "Denied: dynk8s-node-csr-approver: the request is no plain PKCS#10 request: attributes or extensions",
	}
	assert.DeepEqual(t, reasons, want)
	for name, c := range run.decisions {
		if c["type"] == "Denied" {
			assert.Check(t, is.Equal(c["reason"], "DynK8sNotALiveInstance"), name)
		} else {
			assert.Check(t, is.Equal(c["reason"], "DynK8sLiveInstance"), name)
		}
	}
	// The CSR EC2 could not be asked about: three tries, no decision, the CLI's message in the log.
	assert.Check(t, is.Contains(run.output, "cannot ask EC2 about "+pending+" for ec2-down; it stays pending"))
	assert.Check(t, is.Contains(run.output, "Could not connect to the endpoint URL"))
	// One call per CSR that reached EC2 (live, not-in-ec2, no-group, other-pool), three for ec2-down.
	assert.Equal(t, run.ec2Calls, 4+3)
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

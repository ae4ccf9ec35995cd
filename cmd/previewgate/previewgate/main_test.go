package previewgate

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const (
	gatewayURN = "urn:pulumi:prod::dynk8s::dynk8s:infra:WireGuardGateway$aws:ec2/instance:Instance::gateway"
	subnetURN  = "urn:pulumi:prod::dynk8s::dynk8s:infra:Network$aws:ec2/subnet:Subnet::network-subnet-eu-west-1a"
	templURN   = "urn:pulumi:prod::dynk8s::dynk8s:infra:NodePool$aws:ec2/launchTemplate:LaunchTemplate::x86"
)

// preview writes a `pulumi preview --json` document with the given (op, urn) steps and returns its path.
func preview(t *testing.T, steps ...[2]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"config": {"aws:region": "eu-west-1"}, "steps": [`)
	for i, s := range steps {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"op": "` + s[0] + `", "urn": "` + s[1] + `", "provider": "urn:pulumi:prod::dynk8s::pulumi:providers:aws::default", "detailedDiff": null}`)
	}
	b.WriteString(`], "changeSummary": {"same": 40}}`)
	path := filepath.Join(t.TempDir(), "preview.json")
	assert.NilError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

func gate(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestGateStopsAGatewayReplacement: a plan that replaces the gateway instance delete-first
// fails the gate, naming the step, and passes only with -allow.
func TestGateStopsAGatewayReplacement(t *testing.T) {
	for _, op := range []string{"replace", "delete-replaced", "create-replacement", "delete"} {
		p := preview(t, [2]string{"same", subnetURN}, [2]string{op, gatewayURN}, [2]string{"update", templURN})
		code, out, errOut := gate(p)
		assert.Equal(t, code, 1, "op %s", op)
		assert.Check(t, is.Contains(out, op), "op %s", op)
		assert.Check(t, is.Contains(out, gatewayURN+"  <- cuts the tunnel"))
		assert.Check(t, is.Contains(errOut, "1 step(s) replace or delete the gateway"))

		code, out, _ = gate("-allow", p)
		assert.Equal(t, code, 0, "op %s with -allow", op)
		assert.Check(t, is.Contains(out, "allowed for this run"))
	}
}

// TestGateStopsZoneDrift: a count-mode zone that drops out of the region's available list plans the deletion of its
// subnet (and the gateway's, when it was the first); the gate stops that as well.
func TestGateStopsZoneDrift(t *testing.T) {
	code, out, _ := gate(preview(t, [2]string{"delete", subnetURN}))
	assert.Equal(t, code, 1)
	assert.Check(t, is.Contains(out, subnetURN+"  <- cuts the tunnel"))
}

// TestGatePassesOrdinaryChanges: updates in place, new launch template versions and replacements of things the
// tunnel does not hang on pass, and every changing step is listed.
func TestGatePassesOrdinaryChanges(t *testing.T) {
	code, out, _ := gate(preview(t, [2]string{"same", gatewayURN}, [2]string{"update", gatewayURN},
		[2]string{"replace", templURN}, [2]string{"create", subnetURN}))
	assert.Equal(t, code, 0)
	assert.Check(t, is.Contains(out, "the tunnel stays up"))
	assert.Check(t, is.Contains(out, "replace            "+templURN+"\n"))
	assert.Check(t, !strings.Contains(out, "same "), "unchanged steps are not listed")
}

// TestGateRefusesWhatIsNoPreview: a file that is not a preview's JSON (an error message, a truncated file) is an
// error, never a pass.
func TestGateRefusesWhatIsNoPreview(t *testing.T) {
	for _, text := range []string{"error: preview failed", `{"steps": [{"op": "replace", "urn": "gateway"}]}`} {
		path := filepath.Join(t.TempDir(), "preview.json")
		assert.NilError(t, os.WriteFile(path, []byte(text), 0o600))
		code, _, errOut := gate(path)
		assert.Equal(t, code, 2, "%q", text)
		assert.Check(t, errOut != "")
	}
	code, _, _ := gate()
	assert.Equal(t, code, 2)
}

package nodetest

import (
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/fakeaws"
	"github.com/dynk8s/dynk8s/internal/names"
)

// kubeletKeyPath is where the kubelet's TLS bootstrap takes its request's key from, under the node's root.
const kubeletKeyPath = "var/lib/kubelet/pki/kubelet-client.key.tmp"

// publicKeyHash is what the controller compares with the instance's tag: the lowercase hex sha256 of the DER
// SubjectPublicKeyInfo of the key in pemKey, which must be an ECDSA P-256 "EC PRIVATE KEY" (what the kubelet's
// keyutil writes and reads).
func publicKeyHash(t *testing.T, pemKey string) string {
	t.Helper()
	block, rest := pem.Decode([]byte(pemKey))
	assert.Assert(t, block != nil, "no PEM block in the key file")
	assert.Check(t, is.Len(rest, 0))
	assert.Check(t, is.Equal(block.Type, "EC PRIVATE KEY"))
	k, err := x509.ParseECPrivateKey(block.Bytes)
	assert.NilError(t, err)
	assert.Check(t, k.Curve == elliptic.P256(), "curve %s", k.Curve.Params().Name)
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	assert.NilError(t, err)
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// The join writes the kubelet's bootstrap key (0600, in a directory of root's) before kubeadm join and tags its own
// instance, through EC2's Query API, with the hash of that key's public key; kubeadm join fails once, its reset
// empties /var/lib/kubelet, and the retry finds the same key again; the key is in no log.
func TestAgentBindsTheKubeletKey(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, nil, fakeaws.IMDSInstance{})
	env := newAgentEnv(t, ud, aws, map[string]string{"STUB_KUBEADM_FAILURES": "1"}, nil)
	run := env.run(t, AgentPath, "join")
	assert.Equal(t, run.exitCode, 0)
	assert.Check(t, is.Len(FailedLines(run.stderr), 0))

	first, second := run.file("kubelet-key.1"), run.file("kubelet-key.2")
	assert.Assert(t, first != "", "the first kubeadm join found no key at %s", kubeletKeyPath)
	assert.Check(t, is.Equal(second, first), "the retried kubeadm join found another key")
	for _, n := range []string{"1", "2"} {
		assert.Check(t, is.Equal(strings.TrimSpace(run.file("kubelet-key."+n+".mode")), "600"), "attempt %s", n)
	}
	hash := publicKeyHash(t, first)
	assert.Check(t, is.Equal(aws.ec2.Tags(testInstanceID)[names.TagKubeletKey], hash))
	assert.Check(t, is.DeepEqual(aws.ec2.TagCalls(), []string{"CreateTags ResourceId.1=" + testInstanceID +
		" Tag.1.Key=" + names.TagKubeletKey + " Tag.1.Value=" + hash}))
	onDisk, err := os.ReadFile(filepath.Join(run.root, kubeletKeyPath))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(onDisk), first))
	st, err := os.Stat(filepath.Join(run.root, filepath.Dir(kubeletKeyPath)))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(st.Mode().Perm(), os.FileMode(0o700)))

	calls := run.file("calls")
	assert.Check(t, strings.Index(calls, "kubeadm join") > 0)
	block, _ := pem.Decode([]byte(first))
	assert.Assert(t, block != nil)
	for _, secret := range []string{first, strings.Split(first, "\n")[1]} {
		assert.Check(t, !strings.Contains(run.stderr, secret), "the key is in the log")
		assert.Check(t, !strings.Contains(run.file("journal"), secret), "the key is in the journal")
		assert.Check(t, !strings.Contains(calls, secret), "the key is in some command's argv")
	}
	assert.Check(t, is.Contains(run.stderr, "public key sha256 "+hash))
	phases := readTimeline(t, run).PhaseNames()
	assert.Check(t, is.Contains(phases, "kubelet-key"))
}

// EC2 refuses CreateTags (the role lacks it): the boot stops at its deadline with one FAILED line that names the
// call and EC2's answer, before kubeadm join, so no kubelet asks with a key the instance does not name. The key it
// wrote stays: the next boot, with EC2 answering, reuses it and tags the instance with its hash.
func TestAgentFailsWithoutTheKeyTag(t *testing.T) {
	t.Parallel()
	ud, aws := agentFixture(t, 0, nil, fakeaws.IMDSInstance{})
	aws.ec2.Fail(-1, 403, "UnauthorizedOperation")
	env := newAgentEnv(t, ud, aws, map[string]string{"DYNK8S_DEADLINE_SECONDS": "2"}, nil)
	run := env.run(t, AgentPath, "join")
	assert.Check(t, is.Equal(run.exitCode, 1))
	failed := FailedLines(run.stderr)
	assert.Assert(t, is.Len(failed, 1), run.stderr)
	assert.Check(t, is.Contains(failed[0], "FAILED: tag "+testInstanceID+" with "+names.TagKubeletKey+": gave up after"))
	assert.Check(t, is.Contains(failed[0], "EC2 CreateTags: HTTP 403 UnauthorizedOperation: fake EC2 says no"))
	assert.Check(t, !strings.Contains(run.file("calls"), "kubeadm join"), "kubeadm join ran")
	assert.Check(t, is.Len(aws.ec2.Tags(testInstanceID), 0))
	assert.Check(t, is.Equal(readTimeline(t, run).Result, "failed"))
	kept, err := os.ReadFile(filepath.Join(run.root, kubeletKeyPath))
	assert.NilError(t, err)

	aws.ec2.Fail(0, 0, "")
	reboot(t, env.root)
	again := env.run(t, AgentPath, "join")
	assert.Equal(t, again.exitCode, 0)
	assert.Check(t, is.Contains(again.stderr, "kubelet bootstrap key: reused the one at "))
	assert.Check(t, is.Equal(again.file("kubelet-key.1"), string(kept)), "the next boot made another key")
	assert.Check(t, is.Equal(aws.ec2.Tags(testInstanceID)[names.TagKubeletKey], publicKeyHash(t, string(kept))))
}

package boot

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/cloud/cloudfake"
	"github.com/dynk8s/dynk8s/node/internal/system"
	"github.com/dynk8s/dynk8s/node/nodetest"
)

const keyFile = "var/lib/kubelet/pki/kubelet-client.key.tmp"

// spkiHash is the hash the tag must hold for pub, computed here on its own.
func spkiHash(t *testing.T, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	assert.NilError(t, err)
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// parseKey is the ECDSA P-256 key of an "EC PRIVATE KEY" PEM file, as the kubelet's keyutil reads it.
func parseKey(t *testing.T, b []byte) *ecdsa.PrivateKey {
	t.Helper()
	block, _ := pem.Decode(b)
	assert.Assert(t, block != nil, "no PEM block")
	assert.Check(t, is.Equal(block.Type, "EC PRIVATE KEY"))
	k, err := x509.ParseECPrivateKey(block.Bytes)
	assert.NilError(t, err)
	assert.Check(t, k.Curve == elliptic.P256())
	return k
}

// pemOf is der in a PEM block of type typ.
func pemOf(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// What the join finds at the kubelet's key path decides the key: none, a new one; one it wrote (a boot retried
// after a reboot), that one; anything the kubelet would fail on or the boot did not write (junk, another curve,
// RSA), a new one. Each time the file ends 0600 and the instance carries the hash of the key in it, and the key
// is in no log line.
func TestJoinBindsTheKubeletKey(t *testing.T) {
	t.Parallel()
	mine, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	mineDER, err := x509.MarshalECPrivateKey(mine)
	assert.NilError(t, err)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	assert.NilError(t, err)
	p384DER, err := x509.MarshalECPrivateKey(p384)
	assert.NilError(t, err)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	assert.NilError(t, err)
	for name, c := range map[string]struct {
		before string // the file before the join ("": none)
		reused bool
	}{
		"none":            {},
		"one it wrote":    {before: pemOf("EC PRIVATE KEY", mineDER), reused: true},
		"junk":            {before: "not a key\n"},
		"another curve":   {before: pemOf("EC PRIVATE KEY", p384DER)},
		"an RSA key":      {before: pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey))},
		"an empty file":   {before: " "},
		"wrong PEM label": {before: pemOf("PRIVATE KEY", mineDER)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			path := filepath.Join(r.root, keyFile)
			if c.before != "" {
				assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				assert.NilError(t, os.WriteFile(path, []byte(c.before), 0o644))
			}
			run := r.join()
			assert.NilError(t, run.err)
			b, err := os.ReadFile(path)
			assert.NilError(t, err)
			k := parseKey(t, b)
			assert.Check(t, is.Equal(k.Equal(mine), c.reused), "reused the key found")
			st, err := os.Stat(path)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(st.Mode().Perm(), os.FileMode(0o600)))
			hash := spkiHash(t, &k.PublicKey)
			assert.Check(t, is.Equal(r.ec2.Tags("")[names.TagKubeletKey], hash))
			assert.Check(t, is.DeepEqual(r.ec2.Tagged(), []string{"CreateTags " + cloudfake.InstanceID + " " +
				names.TagKubeletKey + "=" + hash}))
			assert.Check(t, !strings.Contains(run.log, strings.Split(string(b), "\n")[1]), "the key is in the log")
			leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".kubelet-client.key-*"))
			assert.Check(t, is.Len(leftovers, 0))
		})
	}
}

// A directory the boot makes is root's alone; one the kubelet made (0755, keyutil.WriteKey) is left as it is.
func TestJoinMakesThePKIDirectoryPrivate(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	assert.NilError(t, r.join().err)
	st, err := os.Stat(filepath.Join(r.root, filepath.Dir(keyFile)))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(st.Mode().Perm(), os.FileMode(0o700)))
}

// CreateTags is retried as the boot's other AWS calls are: a fresh instance may not be known to the API yet
// (InvalidInstanceID.NotFound), and a throttled call passes later; the tag is set before kubeadm join runs. Refused
// until the deadline, the boot fails with that reason, and kubeadm join never runs.
func TestJoinTagsBeforeKubeadmJoin(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		failures     int
		code         string
		status       int
		err          string
		tagged, join bool
	}{
		"not known yet": {failures: 2, code: "InvalidInstanceID.NotFound", status: 400, tagged: true, join: true},
		"throttled":     {failures: 1, code: "RequestLimitExceeded", status: 503, tagged: true, join: true},
		"refused": {failures: -1, code: "UnauthorizedOperation", status: 403,
			err: "tag " + cloudfake.InstanceID + " with " + names.TagKubeletKey + ": gave up after"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, "", "")
			r.ec2.TagFailures, r.ec2.TagFailCode, r.ec2.TagFailStatus = c.failures, c.code, c.status
			run := r.join()
			if c.err != "" {
				assert.ErrorContains(t, run.err, c.err)
				assert.ErrorContains(t, run.err, "EC2 CreateTags: HTTP 403 UnauthorizedOperation: fake EC2 says no")
				assert.Check(t, is.Equal(strings.Count(run.log, "FAILED"), 1), run.log)
			} else {
				assert.NilError(t, run.err)
			}
			assert.Check(t, is.Equal(r.ec2.Tags("")[names.TagKubeletKey] != "", c.tagged))
			assert.Check(t, is.Equal(run.index("kubeadm join") >= 0, c.join), "%v", run.calls)
			if c.failures > 0 {
				assert.Check(t, is.Len(r.ec2.Tagged(), c.failures+1))
			}
		})
	}
}

// A failed kubeadm join's kubeadm reset empties /var/lib/kubelet; the next attempt writes the same key again, so
// the kubelet still asks with the key the tag names, and the instance is tagged once.
func TestJoinRewritesTheKeyAfterReset(t *testing.T) {
	t.Parallel()
	r := newRig(t, "", "")
	r.host.failN["kubeadm"] = 1 // the first kubeadm command is the join
	run := r.join()
	assert.NilError(t, run.err)
	assert.Check(t, run.index("kubeadm reset") >= 0, "%v", run.calls)
	keys := r.host.joinKeys
	assert.Assert(t, is.Len(keys, 2))
	assert.Assert(t, keys[0] != "", "the first kubeadm join found no key")
	assert.Check(t, is.Equal(keys[1], keys[0]), "the second kubeadm join found another key")
	assert.Check(t, is.Equal(r.ec2.Tags("")[names.TagKubeletKey], spkiHash(t, &parseKey(t, []byte(keys[0])).PublicKey)))
	assert.Check(t, is.Len(r.ec2.Tagged(), 1))
}

// A dry run writes no key and tags nothing (EC2 is not even connected).
func TestKubeletKeyDryRun(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var out nodetest.SyncBuffer
	log := system.NewLogger("dynk8s-join", &out, root)
	log.Journal = false
	j := newJoiner(&bootEnv{dryRun: true, files: system.Files{Root: root}, log: log,
		clock: system.NewClock(time.Second, time.Millisecond, time.Millisecond)})
	j.id.InstanceID = cloudfake.InstanceID
	assert.NilError(t, j.kubeletKey(context.Background()))
	assert.Check(t, is.Contains(out.String(), "dry run: would write the kubelet's bootstrap key to "+root+"/"+keyFile))
	_, err := os.Stat(filepath.Join(root, "var/lib/kubelet"))
	assert.Check(t, os.IsNotExist(err))
}

//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/infra"
	"github.com/dynk8s/dynk8s/internal/fakeaws"
)

// A token of its own, so that this test and the other join tests never share or delete each other's.
const (
	joinTokenID     = "e2ejn1"
	joinTokenSecret = "abcdef0123456789"
)

// TestJoinDiscovery runs the node agent (built from this tree), as the dev stack renders its configuration, against the real API server:
// IMDSv2 is a loopback fake, SSM is moto_server holding the token as a SecureString, and kubeadm is the real one in
// --dry-run, so its token discovery fetches kube-public/cluster-info (signed by the real bootstrapsigner) and pins
// the CA for real. A wrong CA hash and a wrong token secret must both stop the join.
func TestJoinDiscovery(t *testing.T) {
	c := requireCluster(t)
	realKubeadm := requireTool(t, "kubeadm")
	moto := requireTool(t, "moto_server")
	requireTool(t, "curl")
	requireTool(t, "python3")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	keepEtcKubernetesClean(t)

	cfg := devConfig(t)
	token := joinTokenID + "." + joinTokenSecret
	kubeadmInit(ctx, t, c, token)

	ssm := startMoto(ctx, t, moto)
	param := infra.JoinTokenParameter(cfg.ClusterName)
	ssm.putSecureString(t, cfg.Region, param, token)
	role := fakeRoleInstance(fakeInstanceID, cfg.Region+fakeZoneSuffix, cfg.Region, fakeNodeIP, "")
	imds := fakeaws.NewIMDS(t, role)
	ec2 := fakeRoleEC2(t, cfg.Region, role)

	// The pin the stack computes when kubernetes.caCertHash is unset: from kube-public/cluster-info, as written by the
	// real kubeadm. kubeadm's own discovery below accepting it is the proof that the two agree.
	caHash := clusterInfoCAHash(ctx, t, c)
	if want := fileCAHash(t, c.CAFile); caHash != want {
		t.Fatalf("hash from cluster-info %s, from the CA file %s", caHash, want)
	}
	// The dev stack's first pool, as the stack renders it, joining the local API server instead of the on-prem one.
	api := apiServerEndpoint(t, c)
	cfg.Kubernetes.APIServerEndpoint = api
	input := func(hash string) poolNode { return stackNode(cfg, cfg.NodePools[0], []string{hash}, param) }
	node := nodeEnv{realKubeadm: realKubeadm, imds: imds.URL, ssm: ssm.url, ec2: ec2.URL}

	t.Run("joins", func(t *testing.T) {
		run := node.join(ctx, t, input(caHash), 90)
		if run.err != nil {
			t.Fatalf("the agent's join: %v\n%s", run.err, run.output)
		}
		for _, want := range []string{
			`Resource name "cluster-info", namespace "kube-public"`,
			"This node has joined the cluster",
			"joined the cluster as " + fakeInstanceID,
		} {
			if !strings.Contains(run.output, want) {
				t.Errorf("join output lacks %q:\n%s", want, run.output)
			}
		}
		checkJoinConfiguration(t, run.joinConfig, token, cfg.Kubernetes.APIServerEndpoint.String(), caHash, cfg.Region)
		if strings.Contains(run.calls, "kubeadm reset") {
			t.Errorf("a successful join ran kubeadm reset:\n%s", run.calls)
		}
	})

	t.Run("wrong CA hash", func(t *testing.T) {
		wrong := "sha256:" + strings.Repeat("0", 64)
		run := node.join(ctx, t, input(wrong), 8)
		if run.err == nil {
			t.Fatalf("the agent's join succeeded with a wrong CA hash:\n%s", run.output)
		}
		for _, want := range []string{
			"cluster CA found in cluster-info ConfigMap is invalid: none of the public keys",
			"FAILED: kubeadm join: gave up",
		} {
			if !strings.Contains(run.output, want) {
				t.Errorf("output lacks %q:\n%s", want, run.output)
			}
		}
		// A failed join must be reset before the next attempt, or its leftovers fail the next preflight.
		if !strings.Contains(run.calls, "kubeadm reset --force") {
			t.Errorf("no kubeadm reset after the failed join:\n%s", run.calls)
		}
	})

	t.Run("wrong token secret", func(t *testing.T) {
		ssm.putSecureString(t, cfg.Region, param, joinTokenID+".ffffffffffffffff")
		defer ssm.putSecureString(t, cfg.Region, param, token)
		run := node.join(ctx, t, input(caHash), 8)
		if run.err == nil {
			t.Fatalf("the agent's join succeeded with a wrong token secret:\n%s", run.output)
		}
		for _, want := range []string{"failed to verify JWS signature", "FAILED: kubeadm join: gave up"} {
			if !strings.Contains(run.output, want) {
				t.Errorf("output lacks %q:\n%s", want, run.output)
			}
		}
	})
}

// fileCAHash is kubeadm's CA pin computed independently: sha256 of the CA certificate's DER SubjectPublicKeyInfo.
func fileCAHash(t *testing.T, caFile string) string {
	t.Helper()
	raw, err := os.ReadFile(caFile)
	assert.NilError(t, err)
	block, _ := pem.Decode(raw)
	if block == nil {
		t.Fatalf("%s: no PEM block", caFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	assert.NilError(t, err, caFile)
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

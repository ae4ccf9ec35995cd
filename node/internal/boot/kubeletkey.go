package boot

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dynk8s/dynk8s/internal/names"
	"github.com/dynk8s/dynk8s/node/internal/cloud"
)

// The kubelet key binding (issue 38): a join-token holder could race this instance for its node name with a
// certificate signing request of its own key for system:node:<instance id>. So, before kubeadm join starts the
// kubelet, the boot writes the private key the kubelet's TLS bootstrap takes for its request, and tags its own
// instance with names.TagKubeletKey, the lowercase hex sha256 of that key's DER SubjectPublicKeyInfo; the
// controller approves a node's bootstrap request only when its public key has that hash.
//
// What the kubelet does with the file (kubernetes v1.34.4): LoadClientCert reads <cert dir>/kubelet-client.key.tmp
// with keyutil.LoadOrGenerateKeyFile, which returns a valid PEM key found there, fails on an invalid one, and only
// else generates an ECDSA P-256 key, "EC PRIVATE KEY" (pkg/kubelet/certificate/bootstrap/bootstrap.go;
// staging/src/k8s.io/client-go/util/keyutil/key.go). The cert dir is /var/lib/kubelet/pki under kubeadm (the
// kubelet's --cert-dir default, cmd/kubelet/app/options/options.go). kubeadm join's preflight checks only
// /etc/kubernetes/kubelet.conf, bootstrap-kubelet.conf and the CA file there, not /var/lib/kubelet
// (cmd/kubeadm/app/preflight/checks.go, JoinNodeChecks), and its kubelet-start phase writes config.yaml and the
// flags beside the pki directory without touching it (cmd/kubeadm/app/cmd/phases/join/kubelet.go). But kubeadm
// reset, which the boot runs after a failed join, empties /var/lib/kubelet (cmd/kubeadm/app/cmd/phases/reset/
// cleanupnode.go): so every retried kubeadm join writes the same key again first (kubeadmJoin).
//
// The kubelet takes LoadClientCert's path only with rotateCertificates false, which the node's kubelet patch sets
// (cloudinit's kubeletPatch): with it true, which kubeadm's default is (cmd/kubeadm/app/componentconfigs/kubelet.go,
// kubeletRotateCertificates), buildKubeletClientConfig (cmd/kubelet/app/server.go) bootstraps through the client
// certificate manager, whose generateCSR makes a fresh key for every request
// (staging/src/k8s.io/client-go/util/certificate/certificate_manager.go) and never reads this file.

// kubeletKey makes the kubelet's bootstrap key, or takes the one an earlier boot wrote (a join retried after a
// reboot), writes it and tags the instance with its hash. The key never reaches the log; its hash does.
func (jn *joining) kubeletKey(ctx context.Context) error {
	path := jn.files.KubeletKey()
	if jn.dryRun {
		jn.log.Printf("dry run: would write the kubelet's bootstrap key to %s and tag %s with %s", path,
			jn.inst.id.InstanceID, names.TagKubeletKey)
		return nil
	}
	pemKey, hash, reused, err := loadOrMakeKey(path)
	if err != nil {
		return err
	}
	if err := writeKey(path, pemKey); err != nil {
		return fmt.Errorf("could not write the kubelet's bootstrap key %s: %w", path, err)
	}
	jn.keyPEM = pemKey
	how := "made"
	if reused {
		how = "reused the one at"
	}
	jn.log.Printf("kubelet bootstrap key: %s %s, public key sha256 %s", how, path, hash)
	return jn.clock.Retry(ctx, jn.log, "tag "+jn.inst.id.InstanceID+" with "+names.TagKubeletKey,
		func(ctx context.Context) error { return jn.tagKey(ctx, hash) })
}

// rewriteKubeletKey puts the key back after kubeadm reset emptied /var/lib/kubelet, so that the next attempt's
// kubelet asks with the key the instance's tag names.
func (jn *joining) rewriteKubeletKey() error {
	if jn.keyPEM == nil || jn.dryRun {
		return nil
	}
	if err := writeKey(jn.files.KubeletKey(), jn.keyPEM); err != nil {
		return fmt.Errorf("could not write the kubelet's bootstrap key %s again: %w", jn.files.KubeletKey(), err)
	}
	return nil
}

// tagKey is one CreateTags of this instance with the one tag.
func (jn *joining) tagKey(ctx context.Context, hash string) error {
	ctx, cancel := context.WithTimeout(ctx, jn.clock.Timeout(10*time.Second))
	defer cancel()
	_, err := jn.cloud.EC2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{jn.inst.id.InstanceID},
		Tags: []ec2types.Tag{{Key: aws.String(names.TagKubeletKey), Value: aws.String(hash)}}})
	if err != nil {
		jn.cloud.Forget(err)
		return cloud.APIError("EC2 CreateTags", err)
	}
	return nil
}

// loadOrMakeKey is the key at path when it is one the boot wrote (an ECDSA P-256 "EC PRIVATE KEY"), else a new one;
// with its public key's hash (KeyHash). Anything else at path is replaced: the kubelet would fail on a file it cannot
// parse, and the tag must name the key it uses.
func loadOrMakeKey(path string) (pemKey []byte, hash string, reused bool, err error) {
	if b, err := os.ReadFile(path); err == nil {
		if block, _ := pem.Decode(b); block != nil && block.Type == "EC PRIVATE KEY" {
			if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil && k.Curve == elliptic.P256() {
				hash, err := KeyHash(&k.PublicKey)
				return pem.EncodeToMemory(block), hash, true, err
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, "", false, fmt.Errorf("could not read %s: %w", path, err)
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", false, fmt.Errorf("could not make the kubelet's bootstrap key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, "", false, fmt.Errorf("could not encode the kubelet's bootstrap key: %w", err)
	}
	hash, err = KeyHash(&k.PublicKey)
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), hash, false, err
}

// KeyHash is what names.TagKubeletKey holds for a public key: the lowercase hex sha256 of its DER
// SubjectPublicKeyInfo (x509.MarshalPKIXPublicKey), as the controller computes it from a request's public key.
func KeyHash(pub any) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// writeKey writes the key readable by root alone, in a directory of root's alone when it makes one (the kubelet
// makes its own 0755, keyutil.WriteKey): a new file in the directory, renamed over path, so that neither a reader
// nor a crash sees half a key, and a file left with wider permissions is never reused.
func writeKey(path string, pemKey []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".kubelet-client.key-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if err := f.Chmod(0o600); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(pemKey); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

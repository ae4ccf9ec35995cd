package addons

import (
	"fmt"
	"regexp"

	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// bootstrapTokenGroup is kubeadm's group for node join tokens: kubeadm init binds it to CSR creation and to the
// auto-approval of node client certificates (kubeadm:node-autoapprove-bootstrap), so a token in this group lets
// kubeadm join finish without manual approval.
const bootstrapTokenGroup = "system:bootstrappers:kubeadm:default-node-token"

var (
	bootstrapTokenIDPattern     = regexp.MustCompile(`^[a-z0-9]{6}$`)
	bootstrapTokenSecretPattern = regexp.MustCompile(`^[a-z0-9]{16}$`)
)

// bootstrapTokenSecretName is the name the API server's bootstrap token authenticator looks up for a token id.
func bootstrapTokenSecretName(id string) (string, error) {
	if !bootstrapTokenIDPattern.MatchString(id) {
		return "", fmt.Errorf("token id %q does not match [a-z0-9]{6}", id)
	}
	return "bootstrap-token-" + id, nil
}

// bootstrapToken declares the bootstrap token Secret the nodes join with and returns its name.
//
// Expiry policy: the Secret has no expiration. Nodes boot at any time, long after `pulumi up`, and a token that
// expired would make every later scale-up fail to join. The token never leaves this Secret
// and the SSM parameter the node role reads; it is rotated by changing kubernetes.bootstrapTokenRotation, which makes
// a new id and secret: the new Secret (another name) is created and the old one deleted in the same update, so a
// rotated token stops working at once. Its groups allow nothing but joining (CSR creation and reading
// kube-public/cluster-info).
func (b *builder) bootstrapToken() (pulumi.StringOutput, error) {
	a := b.args
	name := a.BootstrapTokenID.ToStringOutput().ApplyT(bootstrapTokenSecretName).(pulumi.StringOutput)
	tokenSecret := a.BootstrapTokenSecret.ToStringOutput().ApplyT(func(s string) (string, error) {
		if !bootstrapTokenSecretPattern.MatchString(s) {
			// The value itself is secret: do not print it.
			return "", fmt.Errorf("the token secret (%d characters) does not match [a-z0-9]{16}", len(s))
		}
		return s, nil
	}).(pulumi.StringOutput)
	tokenSecret, ok := pulumi.ToSecret(tokenSecret).(pulumi.StringOutput)
	if !ok {
		return pulumi.StringOutput{}, fmt.Errorf("wrapping the token secret as a secret did not give a string output")
	}

	_, err := corev1.NewSecret(b.ctx, b.childName("bootstrap-token"), &corev1.SecretArgs{
		Metadata: &metav1.ObjectMetaArgs{
			Name:      name,
			Namespace: pulumi.String(namespace),
			Labels:    commonLabels("bootstrap-token"),
		},
		Type: pulumi.String("bootstrap.kubernetes.io/token"),
		StringData: pulumi.StringMap{
			"description": pulumi.String("dynk8s node join token of cluster " + a.ClusterName +
				"; rotated by the dynk8s:kubernetes.bootstrapTokenRotation config, no expiry"),
			"token-id":                       a.BootstrapTokenID,
			"token-secret":                   tokenSecret,
			"usage-bootstrap-authentication": pulumi.String("true"),
			// Signing lets the bootstrapsigner sign kube-public/cluster-info with this token, which kubeadm's
			// token discovery verifies before it trusts the API server.
			"usage-bootstrap-signing": pulumi.String("true"),
			"auth-extra-groups":       pulumi.String(bootstrapTokenGroup),
		},
	}, b.parent)
	if err != nil {
		return pulumi.StringOutput{}, fmt.Errorf("secret: %w", err)
	}
	return name, nil
}

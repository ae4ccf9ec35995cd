package addons

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

// The keys of an AWS credentials Secret: the names the Cluster Autoscaler's AWS provider documents
// (cluster-autoscaler/cloudprovider/aws/README.md, "Using AWS Credentials"), used for every on-prem workload that
// talks to AWS with an IAM user's key.
const (
	awsKeyIDKey     = "aws_access_key_id"
	awsSecretKeyKey = "aws_secret_access_key"
)

// awsCredentials is a Secret holding one IAM user's access key, for a workload that runs on-prem.
type awsCredentials struct {
	secret *corev1.Secret
	name   string
	// checksum is a short digest of the key id: no secret, so it may be a plain pod annotation that rolls the
	// workload when the key is rotated.
	checksum pulumi.StringOutput
}

// awsCredentials declares the Secret name in the namespace with the access key; the secret access key is kept a
// Pulumi secret even when the caller passes a plain value, and so is the key id, which is not secret by itself.
func (b *builder) awsCredentials(child, name, app string, keyID, secretKey pulumi.StringInput) (*awsCredentials, error) {
	secret, ok := pulumi.ToSecret(secretKey.ToStringOutput()).(pulumi.StringOutput)
	if !ok {
		return nil, errors.New("wrapping the secret access key as a secret did not give a string output")
	}
	s, err := corev1.NewSecret(b.ctx, b.childName(child), &corev1.SecretArgs{
		Metadata: b.objectMeta(name, namespace, app),
		Type:     pulumi.String("Opaque"),
		StringData: pulumi.StringMap{
			awsKeyIDKey:     keyID,
			awsSecretKeyKey: secret,
		},
	}, b.parent)
	if err != nil {
		return nil, fmt.Errorf("%s secret: %w", name, err)
	}
	checksum, ok := pulumi.Unsecret(keyID.ToStringOutput().ApplyT(func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return hex.EncodeToString(sum[:])[:16]
	})).(pulumi.StringOutput)
	if !ok {
		return nil, errors.New("the access key checksum is not a string output")
	}
	return &awsCredentials{secret: s, name: name, checksum: checksum}, nil
}

// env is an environment variable read from one key of the Secret.
func (c *awsCredentials) env(name, key string) *corev1.EnvVarArgs {
	return &corev1.EnvVarArgs{
		Name: pulumi.String(name),
		ValueFrom: &corev1.EnvVarSourceArgs{
			SecretKeyRef: &corev1.SecretKeySelectorArgs{Name: pulumi.String(c.name), Key: pulumi.String(key)},
		},
	}
}

package addons

import (
	_ "embed" // the rotator script
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
)

const (
	// TokenRotatorName names the join token policy and the Secrets' managing component: the controller's rotation
	// loop (cluster/internal/rotate) writes the Secrets, the name is the one they have always carried.
	TokenRotatorName = "dynk8s-join-token-rotator"
	// TokenRotatorCredentialsName is the Secret with the token writer's AWS access key (the one IAM user the join
	// token's KMS key lets encrypt), which the controller writes SSM with.
	TokenRotatorCredentialsName = TokenRotatorName + "-aws-credentials"
)

type validation struct{ expression, message string }

// tokenExpirationSlack is what a token's expiration may exceed its creation plus the TTL by: the rotator reads its
// own clock, the API server stamps creationTimestamp with its own, and on-prem clocks drift.
const tokenExpirationSlack = 10 * time.Minute

// tokenRotatorValidations are what every Secret the rotator creates or changes must be, checked at admission where
// RBAC cannot look: a bootstrap token (type, and the name prefix kubeadm and the token authenticator expect; a name
// whose id differs from its token-id authenticates nothing, as the authenticator compares them) that expires
// within the TTL (plus tokenExpirationSlack) of its creation and authenticates with exactly NodeBootstrapGroup. A
// leaked rotator identity can so mint no Secret of another kind, no token that outlives the leak by more than a TTL,
// and none that joins another group (say system:masters, or kubeadm's auto-approved node group).
//
// CEL sees a Secret's data as the base64 text of the API (an object.data value is a string such as 'YWJj' for
// "abc", measured against the real API server, Kubernetes 1.34), and Kubernetes' CEL has no base64 library. A
// group is compared in its base64 form, which is exact because the value is exact bytes; the expiration, whose
// value is not known in advance, is decoded by tokenExpirationVariables.
func tokenRotatorValidations(ttl time.Duration) []validation {
	group := base64.StdEncoding.EncodeToString([]byte(NodeBootstrapGroup))
	bound := strconv.Itoa(int((ttl + tokenExpirationSlack).Seconds()))
	return []validation{
		{"object.type == 'bootstrap.kubernetes.io/token'", "the join token rotator may create bootstrap token Secrets only"},
		{"object.metadata.name.startsWith('bootstrap-token-')", "a bootstrap token Secret is named bootstrap-token-<id>"},
		{"has(object.data) && 'expiration' in object.data && size(object.data['expiration']) == 28 && " +
			"timestamp(variables.expiration) <= timestamp(object.metadata.creationTimestamp) + duration('" + bound + "s')",
			fmt.Sprintf("a join token expires, as a UTC RFC 3339 time in whole seconds, within %s of its creation",
				ttl+tokenExpirationSlack)},
		{"has(object.data) && 'auth-extra-groups' in object.data && object.data['auth-extra-groups'] == '" + group + "'",
			"a join token authenticates with exactly the group " + NodeBootstrapGroup},
	}
}

// tokenExpirationVariables decode the expiration of a token Secret in CEL: the base64 text of the 20 bytes of
// "2006-01-02T15:04:05Z" (the form the controller writes: cluster/internal/rotate) is 28 characters, 6 full groups of four and one with
// padding. Each group becomes its 24 bits by a table of the base64 alphabet (RFC 4648, section 4), the bits its
// bytes, and each byte a character by a table of the only ones such a timestamp holds; any other character fails
// the lookup, and a policy that fails to evaluate denies (failurePolicy Fail). The result is a string that CEL's
// timestamp() parses.
func tokenExpirationVariables() []variable {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	b64 := make([]string, 0, len(alphabet)+1)
	for i, c := range alphabet {
		b64 = append(b64, fmt.Sprintf("'%c': %d", c, i))
	}
	b64 = append(b64, "'=': 0")
	var ascii []string
	for _, c := range "-0123456789:TZ" {
		ascii = append(ascii, fmt.Sprintf("%d: '%c'", c, c))
	}
	return []variable{
		{"expirationBase64", "has(object.data) && 'expiration' in object.data && " +
			"size(object.data['expiration']) == 28 ? object.data['expiration'] : 'MDAwMC0wMC0wMFQwMDowMDowMFo='"},
		{"base64Digits", "{" + strings.Join(b64, ", ") + "}"},
		{"expirationBits", "[0, 1, 2, 3, 4, 5, 6].map(g, " +
			"variables.base64Digits[variables.expirationBase64.charAt(4 * g)] * 262144 + " +
			"variables.base64Digits[variables.expirationBase64.charAt(4 * g + 1)] * 4096 + " +
			"variables.base64Digits[variables.expirationBase64.charAt(4 * g + 2)] * 64 + " +
			"variables.base64Digits[variables.expirationBase64.charAt(4 * g + 3)])"},
		{"expiration", "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19].map(i, " +
			"{" + strings.Join(ascii, ", ") + "}[variables.expirationBits[i / 3] / [65536, 256, 1][i % 3] % 256]).join()"},
	}
}

// tokenRotatorAdmission holds the controller's ServiceAccount, which issues the join tokens, to
// tokenRotatorValidations: it may create no other Secret.
func (b *builder) tokenRotatorAdmission() (pulumi.Resource, error) {
	return b.admissionPolicy(admissionPolicy{
		resource: "token-rotator-policy", name: TokenRotatorName, component: TokenRotatorName,
		resources: []string{"secrets"}, operations: []string{"CREATE", "UPDATE"},
		who:           "the-join-token-rotator",
		whoExpression: serviceAccountIs(ControllerName),
		variables:     tokenExpirationVariables(),
		validations:   tokenRotatorValidations(b.args.BootstrapTokenTTL),
	})
}

// tokenRotator declares what the controller's rotation loop writes under: the token writer's AWS key and the
// policy that holds the Secrets the controller creates to join tokens of NodeBootstrapGroup. It returns both, which
// the controller's Deployment depends on.
func (b *builder) tokenRotator() (*awsCredentials, pulumi.Resource, error) {
	a := b.args
	admission, err := b.tokenRotatorAdmission()
	if err != nil {
		return nil, nil, err
	}
	creds, err := b.awsCredentials("token-rotator-credentials", TokenRotatorCredentialsName, TokenRotatorName,
		a.TokenRotatorAccessKeyID, a.TokenRotatorSecretAccessKey)
	if err != nil {
		return nil, nil, err
	}
	return creds, admission, nil
}

// DefaultParameterKey is the KMS key SSM encrypts a SecureString with when a PutParameter names none: the account's
// AWS managed key for Systems Manager (PutParameter, KeyId: "the system uses the default key associated with your
// Amazon Web Services account", Systems Manager API Reference), whose alias it is.
const DefaultParameterKey = "alias/aws/ssm"

// KeyedParameter is a parameter resource that also names the KMS key its SecureString is encrypted with ("" for
// SSM's default): what a stack gives as ClusterAddonsArgs.JoinTokenParameterResource (infra.Identity), so that the
// rotator writes each token with the key the stack chose instead of leaving it to SSM.
type KeyedParameter interface {
	pulumi.Resource
	ParameterKeyID() pulumi.StringOutput
}

// tokenKeyID is the KMS key the rotator encrypts the join token with: the join token parameter's (KeyedParameter),
// or SSM's default when it names none or the component runs without the parameter resource.
func tokenKeyID(parameter pulumi.Resource) pulumi.StringInput {
	p, ok := parameter.(KeyedParameter)
	if !ok {
		return pulumi.String(DefaultParameterKey)
	}
	return p.ParameterKeyID().ApplyT(func(key string) string {
		if key == "" {
			return DefaultParameterKey
		}
		return key
	}).(pulumi.StringOutput)
}

package addons

import (
	"crypto/sha256"
	_ "embed" // the rotator script
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/batch/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	rbacv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/rbac/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// rotateTokenScript issues a join token and writes it to SSM; see the file.
//
//go:embed scripts/rotate-token.sh
var rotateTokenScript string

const (
	// TokenRotatorName names the rotator's ServiceAccount, Role, CronJob and the rest; its Jobs add a suffix.
	TokenRotatorName = "dynk8s-join-token-rotator"
	// TokenRotatorCredentialsName is the Secret with the rotator's AWS access key.
	TokenRotatorCredentialsName = TokenRotatorName + "-aws-credentials"
	tokenRotatorScriptKey       = "rotate-token.sh"
	tokenRotatorScriptDir       = "/scripts"
	// tokenRotatorRunTimeout bounds one run: a kubectl create and one SSM call, each a few seconds at most.
	tokenRotatorRunTimeout = 5 * time.Minute
)

// tokenRotatorRules allow what the script does in the API: create a Secret in kube-system. RBAC cannot narrow
// create to a name or a type (the name of an object being created is not known to the authorizer: see "Referring to
// resources" in https://kubernetes.io/docs/reference/access-authn-authz/rbac/), so this is the narrowest rule there
// is. Nothing else: no get or list, so the rotator reads no Secret, not even the tokens it made; and no delete,
// because expired tokens are deleted by the controller manager's token cleaner.
func tokenRotatorRules() rbacv1.PolicyRuleArray {
	return rbacv1.PolicyRuleArray{
		rule([]string{""}, []string{"secrets"}, nil, "create"),
	}
}

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
// "2006-01-02T15:04:05Z" (the form rotate-token.sh writes) is 28 characters, 6 full groups of four and one with
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

// tokenRotatorAdmission holds the rotator's ServiceAccount to tokenRotatorValidations.
func (b *builder) tokenRotatorAdmission() (pulumi.Resource, error) {
	return b.admissionPolicy(admissionPolicy{
		resource: "token-rotator-policy", name: TokenRotatorName, component: TokenRotatorName,
		resources: []string{"secrets"}, operations: []string{"CREATE", "UPDATE"},
		who: "the-join-token-rotator",
		whoExpression: fmt.Sprintf("request.userInfo.username == 'system:serviceaccount:%s:%s'", namespace,
			TokenRotatorName),
		variables:   tokenExpirationVariables(),
		validations: tokenRotatorValidations(b.args.BootstrapTokenTTL),
	})
}

// TokenRotationSchedule is the rotator CronJob's schedule for a token TTL: every config.BootstrapTokenRotationPeriod
// (a third of the TTL in whole minutes), as a step in the minute field below an hour and in the hour field from one
// hour on. A step that does not divide the hour (or the day) restarts at the top of it, so the gap between two runs
// is never longer than the period, only sometimes shorter. In UTC (the CronJob's timeZone), so that daylight saving
// time cannot stretch a gap.
func TokenRotationSchedule(ttl time.Duration) (string, error) {
	period := config.BootstrapTokenRotationPeriod(ttl)
	switch minutes := int(period.Minutes()); {
	case minutes < 1:
		return "", fmt.Errorf("token TTL %s: a rotation period of %s is under a minute", ttl, period)
	case minutes < 60:
		return fmt.Sprintf("*/%d * * * *", minutes), nil
	case minutes < 24*60:
		return fmt.Sprintf("0 */%d * * *", minutes/60), nil
	default:
		return "", fmt.Errorf("token TTL %s: a rotation period of %s is a day or more", ttl, period)
	}
}

// TokenRotatorJobName is the name of the Job that issues a token when the stack is installed or rotated. It carries a
// hash of what the run depends on (the rotation value, the TTL, the parameter, the region), so that a new rotation
// value, or a change to the run, declares a new Job, which runs once more, while the same config declares the same
// finished Job and a second `pulumi up` has nothing to do.
func TokenRotatorJobName(a *ClusterAddonsArgs) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%q %d %q %q", a.BootstrapTokenRotation, a.BootstrapTokenTTL,
		a.JoinTokenParameter, a.Region)))
	return TokenRotatorName + "-" + hex.EncodeToString(sum[:])[:10]
}

// tokenRotator declares the join token rotator: its ServiceAccount and Role, its AWS credentials, its script, the
// CronJob that issues a token every rotation period, and the Job that issues one now. It returns the Job's name.
func (b *builder) tokenRotator() (string, error) {
	a := b.args
	schedule, err := TokenRotationSchedule(a.BootstrapTokenTTL)
	if err != nil {
		return "", err
	}
	sa, err := b.serviceAccount("token-rotator-sa", TokenRotatorName, TokenRotatorName)
	if err != nil {
		return "", err
	}
	role, err := rbacv1.NewRole(b.ctx, b.childName("token-rotator-role"), &rbacv1.RoleArgs{
		Metadata: b.objectMeta(TokenRotatorName, namespace, TokenRotatorName),
		Rules:    tokenRotatorRules(),
	}, b.parent)
	if err != nil {
		return "", fmt.Errorf("role: %w", err)
	}
	binding, err := rbacv1.NewRoleBinding(b.ctx, b.childName("token-rotator-rolebinding"), &rbacv1.RoleBindingArgs{
		Metadata: b.objectMeta(TokenRotatorName, namespace, TokenRotatorName),
		RoleRef: &rbacv1.RoleRefArgs{
			ApiGroup: pulumi.String("rbac.authorization.k8s.io"),
			Kind:     pulumi.String("Role"),
			Name:     pulumi.String(TokenRotatorName),
		},
		Subjects: rbacv1.SubjectArray{&rbacv1.SubjectArgs{
			Kind:      pulumi.String("ServiceAccount"),
			Name:      pulumi.String(TokenRotatorName),
			Namespace: pulumi.String(namespace),
		}},
	}, b.parent, pulumi.DependsOn([]pulumi.Resource{role}))
	if err != nil {
		return "", fmt.Errorf("role binding: %w", err)
	}
	admission, err := b.tokenRotatorAdmission()
	if err != nil {
		return "", err
	}

	creds, err := b.awsCredentials("token-rotator-credentials", TokenRotatorCredentialsName, TokenRotatorName,
		a.TokenRotatorAccessKeyID, a.TokenRotatorSecretAccessKey)
	if err != nil {
		return "", err
	}
	script, err := corev1.NewConfigMap(b.ctx, b.childName("token-rotator-script"), &corev1.ConfigMapArgs{
		Metadata: b.objectMeta(TokenRotatorName, namespace, TokenRotatorName),
		Data:     pulumi.StringMap{tokenRotatorScriptKey: pulumi.String(rotateTokenScript)},
	}, b.parent)
	if err != nil {
		return "", fmt.Errorf("script config map: %w", err)
	}
	after := []pulumi.Resource{sa, binding, admission, creds.secret, script}
	if a.JoinTokenParameterResource != nil {
		after = append(after, a.JoinTokenParameterResource)
	}
	deps := pulumi.DependsOn(after)

	_, err = batchv1.NewCronJob(b.ctx, b.childName("token-rotator"), &batchv1.CronJobArgs{
		Metadata: b.objectMeta(TokenRotatorName, namespace, TokenRotatorName),
		Spec: &batchv1.CronJobSpecArgs{
			Schedule: pulumi.String(schedule),
			TimeZone: pulumi.String("Etc/UTC"),
			// Two runs at once would only issue two tokens; one at a time keeps the log readable.
			ConcurrencyPolicy: pulumi.String("Forbid"),
			// A run the controller missed (it was down) still happens if it is less than half a period late.
			StartingDeadlineSeconds:    pulumi.Int(int(config.BootstrapTokenRotationPeriod(a.BootstrapTokenTTL).Seconds()) / 2),
			SuccessfulJobsHistoryLimit: pulumi.Int(1),
			FailedJobsHistoryLimit:     pulumi.Int(3),
			JobTemplate: &batchv1.JobTemplateSpecArgs{
				Metadata: &metav1.ObjectMetaArgs{Labels: commonLabels(TokenRotatorName)},
				Spec:     b.tokenRotatorJobSpec(creds),
			},
		},
	}, b.parent, deps)
	if err != nil {
		return "", fmt.Errorf("cron job: %w", err)
	}

	jobName := TokenRotatorJobName(a)
	_, err = batchv1.NewJob(b.ctx, b.childName("token-rotator-now"), &batchv1.JobArgs{
		Metadata: b.workloadMeta(jobName, TokenRotatorName),
		Spec:     b.tokenRotatorJobSpec(creds),
	}, b.parent, deps)
	if err != nil {
		return "", fmt.Errorf("job: %w", err)
	}
	return jobName, nil
}

// tokenRotatorJobSpec is one run of the rotator, for the CronJob and the install Job alike: a few retries (the API
// server or SSM may be briefly unreachable), all within a deadline far below the rotation period.
func (b *builder) tokenRotatorJobSpec(creds *awsCredentials) *batchv1.JobSpecArgs {
	return &batchv1.JobSpecArgs{
		BackoffLimit:          pulumi.Int(3),
		ActiveDeadlineSeconds: pulumi.Int(int(tokenRotatorRunTimeout.Seconds())),
		Template: &corev1.PodTemplateSpecArgs{
			Metadata: &metav1.ObjectMetaArgs{Labels: commonLabels(TokenRotatorName)},
			Spec:     b.tokenRotatorPodSpec(creds),
		},
	}
}

// tokenRotatorPodSpec runs the script on an on-prem node with the rotator's service account and AWS key: a missed
// rotation leaves nodes an older token, and a node that can join holds no business issuing the tokens to join with.
// The image has what the script needs besides kubectl: bash, curl with --aws-sigv4, jq.
func (b *builder) tokenRotatorPodSpec(creds *awsCredentials) *corev1.PodSpecArgs {
	a := b.args
	return scriptPod{
		name: TokenRotatorName, container: "rotate", shell: "/bin/bash", image: a.scriptImage(),
		dir: tokenRotatorScriptDir, key: tokenRotatorScriptKey,
		env: corev1.EnvVarArray{
			&corev1.EnvVarArgs{Name: pulumi.String("SSM_PARAMETER"), Value: pulumi.String(a.JoinTokenParameter)},
			&corev1.EnvVarArgs{Name: pulumi.String("AWS_REGION"), Value: pulumi.String(a.Region)},
			&corev1.EnvVarArgs{Name: pulumi.String("SSM_ENDPOINT"), Value: pulumi.String(ssmEndpoint(a.Region))},
			&corev1.EnvVarArgs{Name: pulumi.String("KMS_KEY_ID"), Value: tokenKeyID(a.JoinTokenParameterResource)},
			&corev1.EnvVarArgs{
				Name:  pulumi.String("TOKEN_TTL_SECONDS"),
				Value: pulumi.String(strconv.Itoa(int(a.BootstrapTokenTTL.Seconds()))),
			},
			scriptHome,
			creds.env("AWS_ACCESS_KEY_ID", awsKeyIDKey),
			creds.env("AWS_SECRET_ACCESS_KEY", awsSecretKeyKey),
		},
	}.spec()
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

// ssmEndpoint is the regional SSM endpoint of region's partition: the China regions' domain is amazonaws.com.cn,
// every other region config accepts (commercial and GovCloud; it refuses the isolated partitions) is under
// amazonaws.com (AWS General Reference,
// "Service endpoints"; the partitions' dnsSuffix in the AWS SDKs' endpoints.json).
func ssmEndpoint(region string) string {
	domain := "amazonaws.com"
	if strings.HasPrefix(region, "cn-") {
		domain = "amazonaws.com.cn"
	}
	return "https://ssm." + region + "." + domain
}

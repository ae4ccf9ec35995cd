package rotate

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"

	"github.com/dynk8s/dynk8s/internal/names"
)

// The labels of every token Secret the rotator creates, the ones the rotator before this loop (a script) gave them,
// so that `kubectl -n kube-system delete secret -l app.kubernetes.io/managed-by=dynk8s-join-token-rotator` (an
// emergency revocation, and the e2e tests' cleanup) finds the controller's tokens and the older ones alike.
const (
	labelName      = "app.kubernetes.io/name"
	labelPartOf    = "app.kubernetes.io/part-of"
	labelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is the managed-by label's value: an operator selects the loop's Secrets by it.
	ManagedBy = names.JoinTokenManagedBy
)

// Selector selects the rotator's token Secrets.
const Selector = names.JoinTokenSelector

// token is one join token: what its Secret says and SSM is given. The secret half is the credential; String and
// LogValue leave it out, so that a token passed to a log or a format by mistake prints only its public id.
type token struct {
	id, secret string
	// issued is when the rotator created the token, expires when the API server stops taking it (issued + TTL, in
	// whole seconds, as the Secret states it).
	issued, expires time.Time
	// obj is the token's Secret as the API server created it, what Events are recorded on.
	obj *corev1.Secret
}

// mint draws a new token with cluster-bootstrap's generator (the same kubeadm uses: 6 and 16 characters of
// [a-z0-9] from crypto/rand, k8s.io/cluster-bootstrap/token/util/helpers.go) that expires ttl after now.
func mint(now time.Time, ttl time.Duration) (*token, error) {
	s, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return nil, fmt.Errorf("draw a bootstrap token: %w", err)
	}
	id, secret, ok := strings.Cut(s, ".")
	if !ok || !bootstraputil.IsValidBootstrapToken(s) {
		// Not the token: a malformed one is no secret worth keeping, but it is never printed all the same.
		return nil, fmt.Errorf("draw a bootstrap token: %d characters, not of the form %s", len(s),
			bootstrapapi.BootstrapTokenPattern)
	}
	return &token{id: id, secret: secret, issued: now, expires: now.Add(ttl).UTC().Truncate(time.Second)}, nil
}

// name is the token's Secret's name, bootstrap-token-<id>: the API server's token authenticator looks the Secret up
// by it and compares its token-id (plugin/pkg/auth/authenticator/token/bootstrap/bootstrap.go, Kubernetes 1.34).
func (t *token) name() string { return bootstraputil.BootstrapTokenSecretName(t.id) }

// value is what SSM holds and a node gives kubeadm join --token: <id>.<secret>.
func (t *token) value() string { return bootstraputil.TokenFromIDAndSecret(t.id, t.secret) }

// expiration is the token's expiration as the Secret states it: RFC 3339 in UTC and whole seconds, the 20
// characters the token rotator's admission policy decodes (infra/addons/token.go, tokenExpirationVariables).
func (t *token) expiration() string { return t.expires.Format(time.RFC3339) }

// String is the token's public id.
func (t *token) String() string { return t.id }

// LogValue is the token's public id.
func (t *token) LogValue() slog.Value { return slog.StringValue(t.id) }

// scrub is err's text with the token's secret cut out, in clear and in base64 (a Secret's data as the API prints
// it): an error that echoes what it was sent (an API server's validation message, a proxy's) must not carry the
// credential into a log, an Event or the work queue's retry log.
func (t *token) scrub(err error) string {
	return strings.NewReplacer(t.secret, "<token-secret>",
		base64.StdEncoding.EncodeToString([]byte(t.secret)), "<token-secret>").Replace(err.Error())
}

// secretFor is the token's Secret in the bootstrap token format the API server's authenticator, the controller
// manager's bootstrapsigner and tokencleaner, and kubeadm read
// (https://kubernetes.io/docs/reference/access-authn-authz/bootstrap-tokens/, "Bootstrap Token Secret Format"): type
// bootstrap.kubernetes.io/token, token-id and token-secret, the expiration, both usages (authentication for the
// join's TLS bootstrap, signing for the discovery of cluster-info), and group as its only extra group. The labels
// and the description are the ones the tokens have always carried. Data rather than stringData, so that what the client sends is what
// admission sees.
func secretFor(t *token, namespace, group string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      t.name(),
			Namespace: namespace,
			Labels: map[string]string{
				labelName:      "dynk8s-join-token",
				labelPartOf:    "dynk8s",
				labelManagedBy: ManagedBy,
			},
		},
		Type: bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			bootstrapapi.BootstrapTokenDescriptionKey: []byte(
				"dynk8s node join token, issued by the join token rotator; expires " + t.expiration()),
			bootstrapapi.BootstrapTokenIDKey:               []byte(t.id),
			bootstrapapi.BootstrapTokenSecretKey:           []byte(t.secret),
			bootstrapapi.BootstrapTokenExpirationKey:       []byte(t.expiration()),
			bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
			bootstrapapi.BootstrapTokenUsageSigningKey:     []byte("true"),
			bootstrapapi.BootstrapTokenExtraGroupsKey:      []byte(group),
		},
	}
}

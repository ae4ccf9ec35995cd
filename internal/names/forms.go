// Package names holds the names and forms dynk8s spells in more than one place: the tag keys it puts on AWS
// resources and the forms of ids, regions, tokens and keys that the config, the renderer and the node agent check.
// It is a leaf: it imports nothing of the module.
package names

import (
	"regexp"
	"strconv"
)

// The stack's identity tag keys: infra/config's IdentityTags puts them on every resource it tags, the IAM policies
// scope by them, and the gateway's idle check tells the stack's pool instances by them.
const (
	TagCluster = "dynk8s:cluster"
	TagPool    = "dynk8s:pool"
)

// TagCache marks a pool's build cache volume (its value: the pool's name); the cluster and pool tags name whose it
// is. The node agent finds, creates and attaches the volumes by it, the node role's policy scopes to it, and the
// controller keeps the pool's volumes in order by it.
const TagCache = "dynk8s:cache"

// TagCacheUsed is the mark the controller's cache loop puts on a cache volume it sees in use: the time, RFC 3339,
// UTC; the loop deletes a volume whose mark has grown older than its pool's idle limit.
const TagCacheUsed = "dynk8s:cache-used"

// TagKubeletKey is the tag a pool instance puts on itself before it joins: the lowercase hex sha256 of the DER
// SubjectPublicKeyInfo of the key its kubelet's bootstrap CSR is signed with. The node role may write this one tag,
// on its own instance only; the controller approves a node's CSR only when its public key has that hash.
const TagKubeletKey = "dynk8s:kubelet-key-sha256"

// JoinTokenManagedBy is the app.kubernetes.io/managed-by label of every join token Secret the controller's rotator
// creates (and the script before it created); JoinTokenSelector selects them, for a revocation, the operator's
// status view and the e2e tests' cleanup.
const (
	JoinTokenManagedBy = "dynk8s-join-token-rotator"
	JoinTokenSelector  = "app.kubernetes.io/managed-by=" + JoinTokenManagedBy
)

// The forms of the values the agent reads (from its config, IMDS and SSM), which the config and the renderer check
// too, or look for where a secret must not be: one home each.
const (
	// InstanceIDPattern is an EC2 instance id, 8 or 17 hex digits
	// (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Instance.html).
	InstanceIDPattern = `i-[0-9a-f]{8}([0-9a-f]{9})?`
	// RegionPattern is an AWS region, the GovCloud and ISO partitions' included.
	RegionPattern = `[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+`
	// BootstrapTokenPattern is a kubeadm bootstrap token, "<id>.<secret>" (k8s.io/cluster-bootstrap
	// token/api/types.go, BootstrapTokenPattern).
	BootstrapTokenPattern = `[a-z0-9]{6}\.[a-z0-9]{16}`
	// WireGuardKeyPattern is a WireGuard key as wg(8) prints it: 32 bytes of standard base64, 43 characters whose
	// last carries 2 zero bits, then "=".
	WireGuardKeyPattern = `[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=`
)

var (
	instanceIDRE     = regexp.MustCompile(`^` + InstanceIDPattern + `$`)
	regionRE         = regexp.MustCompile(`^` + RegionPattern + `$`)
	bootstrapTokenRE = regexp.MustCompile(`^` + BootstrapTokenPattern + `$`)
	wireGuardKeyRE   = regexp.MustCompile(`^` + WireGuardKeyPattern + `$`)
)

// IsInstanceID reports whether s is an EC2 instance id.
func IsInstanceID(s string) bool { return instanceIDRE.MatchString(s) }

// IsRegion reports whether s is an AWS region's name.
func IsRegion(s string) bool { return regionRE.MatchString(s) }

// IsBootstrapToken reports whether s is a kubeadm bootstrap token.
func IsBootstrapToken(s string) bool { return bootstrapTokenRE.MatchString(s) }

// IsWireGuardKey reports whether s is a WireGuard key in wg(8)'s form.
func IsWireGuardKey(s string) bool { return wireGuardKeyRE.MatchString(s) }

// IsTemplateVersion reports whether s is a launch template version number (not $Latest or $Default).
func IsTemplateVersion(s string) bool {
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}

// OlderTemplateVersion reports whether launch template version v is older than current. Both must be version
// numbers, as a pool's group names its template's (the stack sets the version, never $Latest or $Default) and as
// Auto Scaling reports an instance's; anything else is not compared: false.
func OlderTemplateVersion(v, current string) bool {
	a, errA := strconv.ParseUint(v, 10, 64)
	b, errB := strconv.ParseUint(current, 10, 64)
	return errA == nil && errB == nil && a < b
}

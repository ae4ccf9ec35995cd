package kube

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Labels every dynk8s pool node sets on itself through the kubelet's --node-labels (both are outside the
// kubernetes.io/k8s.io namespaces, so NodeRestriction allows them). The in-cluster parts select on them: the
// Cluster Autoscaler stays off nodes with LabelPool, stale-node cleanup only ever deletes nodes with LabelPool, and
// the spot drain handler runs only where LabelCapacityType is CapacitySpot.
const (
	LabelPool         = "dynk8s.io/pool"
	LabelCapacityType = "dynk8s.io/capacity-type"

	CapacitySpot     = "spot"
	CapacityOnDemand = "on-demand"
)

// LabelCache is on a pool node that mounted its pool's build cache at boot (node/internal/cache), "true"; a pool
// node without one (all its pool's volumes taken, the pool at its most, the API refusing) has no such label. It is
// not on the group's template node: a scale-up cannot promise a cache.
const LabelCache = "dynk8s.io/cache"

// LabelOnPrem marks the on-prem Nodes, where the parts that hold the stack's AWS keys and the approver's
// ServiceAccount run (the autoscaler, the CSR approver, the token rotator, the stale-node cleanup). The operator sets
// it (kubectl label node NAME node-restriction.kubernetes.io/dynk8s-onprem=true); no kubelet can: NodeRestriction
// refuses a kubelet any label of the node-restriction.kubernetes.io namespace, to add, change or remove
// (https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction), so a pool node
// cannot draw those pods by relabelling itself, whatever its labels say otherwise.
const LabelOnPrem = "node-restriction.kubernetes.io/dynk8s-onprem"

// Well-known node labels (k8s.io/api/core/v1 well_known_labels.go).
const (
	LabelHostname     = "kubernetes.io/hostname"
	LabelArch         = "kubernetes.io/arch"
	LabelOS           = "kubernetes.io/os"
	LabelZone         = "topology.kubernetes.io/zone"
	LabelRegion       = "topology.kubernetes.io/region"
	LabelInstanceType = "node.kubernetes.io/instance-type"
)

// FuseResource is the extended resource the fuse device plugin advertises on a node.
const FuseResource = "github.com/fuse"

// LabelSource is who sets a label that every pool node carries.
type LabelSource int

const (
	// ByKubelet labels the kubelet sets on its own Node.
	ByKubelet LabelSource = iota
	// ByBoot labels the node's boot sets through the kubelet's --node-labels, from the instance's metadata.
	ByBoot
	// ByPool labels dynk8s sets through --node-labels from the pool's config.
	ByPool
)

// NodeLabel is a label every dynk8s pool node carries without the pool asking for it.
type NodeLabel struct {
	Key string
	By  LabelSource
	// NotOnTemplate: the Cluster Autoscaler gives its template node of a group this label itself (the zone, from
	// the group's zones; the hostname, the template node's own name), so the group's node-template tags leave it out.
	NotOnTemplate bool
}

// EveryNode is the one list of the labels every pool node carries: validation refuses them in a pool's labels,
// the boot sets the ByBoot ones, and the group's node-template tags carry them (but the NotOnTemplate ones) so that
// the autoscaler's template node matches the nodes the group really gets.
var EveryNode = []NodeLabel{
	{Key: LabelArch, By: ByKubelet},
	{Key: LabelCapacityType, By: ByPool},
	{Key: LabelHostname, By: ByKubelet, NotOnTemplate: true},
	{Key: LabelInstanceType, By: ByBoot},
	{Key: LabelOS, By: ByKubelet},
	{Key: LabelPool, By: ByPool},
	{Key: LabelRegion, By: ByBoot},
	{Key: LabelZone, By: ByBoot, NotOnTemplate: true},
}

// SetOnEveryNode reports whether every pool node carries the label key without the pool asking, so that a pool may
// not set it.
func SetOnEveryNode(key string) bool {
	return slices.ContainsFunc(EveryNode, func(l NodeLabel) bool { return l.Key == key })
}

// SetByBoot are the keys of the labels the boot sets from the instance's metadata, sorted.
func SetByBoot() []string {
	var keys []string
	for _, l := range EveryNode {
		if l.By == ByBoot {
			keys = append(keys, l.Key)
		}
	}
	return keys
}

// kubeletLabels and kubeletLabelNamespaces are what a kubelet may set on its own Node in the kubernetes.io and
// k8s.io namespaces: IsKubeletLabel in k8s.io/kubelet pkg/apis/well_known_labels.go (kubernetes v1.34), which the
// NodeRestriction admission plugin applies (plugin/pkg/admission/noderestriction/admission.go).
var (
	kubeletLabels = map[string]bool{
		LabelHostname: true, LabelZone: true, LabelRegion: true,
		"failure-domain.beta.kubernetes.io/zone": true, "failure-domain.beta.kubernetes.io/region": true,
		"beta.kubernetes.io/instance-type": true, LabelInstanceType: true,
		LabelOS: true, LabelArch: true, "beta.kubernetes.io/os": true, "beta.kubernetes.io/arch": true,
	}
	kubeletLabelNamespaces = []string{"kubelet.kubernetes.io", "node.kubernetes.io"}
)

var (
	labelNameRE  = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	labelValueRE = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	dnsLabelRE   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// CheckKey says why key cannot be a label key that a joining kubelet sets on its own Node, or returns nil:
// it must be a qualified name (an optional DNS-subdomain prefix and '/', then a name of at most 63 characters), and
// in the kubernetes.io and k8s.io namespaces only IsKubeletLabel's keys pass NodeRestriction.
func CheckKey(key string) error {
	if err := checkQualifiedName(key); err != nil {
		return err
	}
	prefix, _, _ := strings.Cut(key, "/")
	if !strings.Contains(key, "/") {
		prefix = ""
	}
	if !inNamespace(prefix, "kubernetes.io") && !inNamespace(prefix, "k8s.io") {
		return nil
	}
	if kubeletLabels[key] {
		return nil
	}
	for _, ns := range kubeletLabelNamespaces {
		if inNamespace(prefix, ns) {
			return nil
		}
	}
	if inNamespace(prefix, "node-role.kubernetes.io") {
		return fmt.Errorf("%q cannot be set by the kubelet (NodeRestriction forbids node-role.kubernetes.io/*); "+
			"use your own prefix, e.g. example.com/role", key)
	}
	return fmt.Errorf("%q is in the kubernetes.io/k8s.io namespace, which NodeRestriction forbids the kubelet to "+
		"set (allowed: kubelet.kubernetes.io/*, node.kubernetes.io/* and the well-known "+
		"topology/arch/os/instance-type keys); use your own prefix", key)
}

// checkQualifiedName checks a Kubernetes qualified name: an optional DNS-subdomain prefix and '/', then a name of at
// most 63 characters.
func checkQualifiedName(key string) error {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if len(name) > 63 || !labelNameRE.MatchString(name) {
		return fmt.Errorf("%q is not a valid key: the name part must be at most 63 characters of letters, "+
			"digits, '-', '_', '.'", key)
	}
	if hasPrefix && !IsDNSSubdomain(prefix) {
		return fmt.Errorf("%q is not a valid key: the prefix must be a DNS subdomain", key)
	}
	return nil
}

// inNamespace reports whether a label prefix is domain or a subdomain of it.
func inNamespace(prefix, domain string) bool {
	return prefix == domain || strings.HasSuffix(prefix, "."+domain)
}

// CheckValue says why v cannot be a label or taint value, or returns nil. The rule also keeps ',' and '=' out of the
// kubelet's --node-labels.
func CheckValue(v string) error {
	if len(v) > 63 || !labelValueRE.MatchString(v) {
		return fmt.Errorf("%q is not a label value (at most 63 characters: letters, digits, '-', '_', '.')", v)
	}
	return nil
}

// IsDNSSubdomain reports whether s is a DNS name as Kubernetes and systemd-resolved take it (RFC 1123): lower-case
// labels of 1 to 63 of [a-z0-9-], neither starting nor ending with '-', joined by dots, at most 253 characters, no
// trailing dot. The one rule for label prefixes, on-prem domains and API server names (compare a name lower-cased:
// DNS is case-insensitive).
func IsDNSSubdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if !IsDNSLabel(label) {
			return false
		}
	}
	return true
}

// IsDNSLabel reports whether s is one label of such a name: 1 to 63 of [a-z0-9-], neither starting nor ending with
// '-'.
func IsDNSLabel(s string) bool { return dnsLabelRE.MatchString(s) }

package kube

import (
	"fmt"
	"regexp"
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

// SetOnEveryNode are the labels that every dynk8s pool node gets without the pool asking: from the kubelet itself
// (hostname, arch, os), from the join script out of the instance's metadata (zone, region, instance type), and from
// dynk8s (pool, capacity type). A pool may not set them.
var SetOnEveryNode = []string{
	LabelArch, LabelCapacityType, LabelHostname, LabelInstanceType, LabelOS, LabelPool, LabelRegion, LabelZone,
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
	dnsSubdomRE  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// CheckKey says why key cannot be a label or taint key that a joining kubelet sets on its own Node, or returns nil:
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
	if hasPrefix && (len(prefix) > 253 || !dnsSubdomRE.MatchString(prefix)) {
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

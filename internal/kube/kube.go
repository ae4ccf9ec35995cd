// Package kube holds the Kubernetes facts dynk8s depends on, each in one place: the node architectures, the labels
// and taints a joining kubelet may set on itself (with the NodeRestriction rule), the labels dynk8s sets on its
// nodes (EveryNode, with who sets each), the DNS-name rule, the node boot's deadline that the config validates
// against, and one table of what each supported Kubernetes minor needs (pause image, Cluster Autoscaler release,
// CRI-O stream). It is a leaf: it imports nothing of this module, and nothing of Pulumi.
package kube

import "fmt"

// Arch is a node pool's CPU architecture, spelled as EC2 spells it (the config's spelling).
type Arch string

// The architectures dynk8s runs nodes on.
const (
	ArchX86_64 Arch = "x86_64"
	ArchArm64  Arch = "arm64"
)

// Arches are all architectures, sorted.
var Arches = []Arch{ArchArm64, ArchX86_64}

// ParseArch accepts the EC2 spelling, and says which spelling to use for the Go and Fedora ones.
func ParseArch(s string) (Arch, error) {
	switch Arch(s) {
	case ArchX86_64, ArchArm64:
		return Arch(s), nil
	case "amd64", "aarch64":
		return "", fmt.Errorf("%q is not x86_64 or arm64 (dynk8s uses the EC2 names)", s)
	}
	return "", fmt.Errorf("%q is not x86_64 or arm64", s)
}

// Label is the value of the kubernetes.io/arch node label (Go's GOARCH names).
func (a Arch) Label() string {
	if a == ArchX86_64 {
		return "amd64"
	}
	return string(a)
}

// Fedora is the architecture as Fedora names its images and packages.
func (a Arch) Fedora() string {
	if a == ArchArm64 {
		return "aarch64"
	}
	return string(a)
}

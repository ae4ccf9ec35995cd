package config

import (
	"fmt"
	"sort"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// InstanceShape is what the Cluster Autoscaler needs to know of an instance type to size a node group: it builds
// its template node from the first type of an ASG only, so every type of a pool must have the same shape.
type InstanceShape struct {
	Arch      kube.Arch
	VCPU      int
	MemoryMiB int
	// Hibernates: the type can hibernate a Fedora instance (see instanceFamily.hibernation).
	Hibernates bool
}

// instanceFamily describes one EC2 family: its architecture and memory per vCPU. Sizes follow the common EC2
// pattern (large = 2 vCPU, xlarge = 4, Nxlarge = 4N). Burstable families have their own size table.
type instanceFamily struct {
	arch         kube.Arch
	memPerVCPU   int // MiB
	burstable    bool
	smallestSize string // the smallest size the family has ("medium" or "large")
	largest      int    // the vCPUs of the largest size, when it is below the table's 24xlarge
	// hibernation: the family is on AWS's list of hibernation instance families for a Fedora image. AWS supports
	// hibernating Fedora (34 or later, with additional configuration) on Nitro Intel and AMD types only; its
	// Graviton list names Amazon Linux and Ubuntu images alone (EC2 User Guide, "Prerequisites for EC2 instance
	// hibernation", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/hibernating-prerequisites.html).
	hibernation bool
}

// familySizes are the families whose sizes break the common pattern: c5 has 9xlarge and 18xlarge instead of
// 8xlarge and 16xlarge.
var familySizes = map[string]map[string]int{
	"c5": {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "9xlarge": 36, "12xlarge": 48, "18xlarge": 72,
		"24xlarge": 96},
}

// instanceFamilies are the families dynk8s knows the shapes of. Source: the EC2 instance type pages (general
// purpose 4 GiB/vCPU, compute optimized 2 GiB/vCPU, memory optimized 8 GiB/vCPU); Graviton families end in "g".
var instanceFamilies = map[string]instanceFamily{
	// x86_64, Intel and AMD
	"m5": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 4096, smallestSize: "large"}, "m5a": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 4096, smallestSize: "large"},
	"m6i": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 4096, smallestSize: "large"}, "m6a": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 4096, smallestSize: "large"},
	"m7i": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 4096, smallestSize: "large"}, "m7a": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 4096, smallestSize: "medium"},
	"c5": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 2048, smallestSize: "large"}, "c5a": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 2048, smallestSize: "large"},
	"c6i": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 2048, smallestSize: "large"}, "c6a": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 2048, smallestSize: "large"},
	"c7i": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 2048, smallestSize: "large"}, "c7a": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 2048, smallestSize: "medium"},
	"r5": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 8192, smallestSize: "large"}, "r6i": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 8192, smallestSize: "large"},
	"r6a": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 8192, smallestSize: "large"}, "r7i": {arch: kube.ArchX86_64, hibernation: true, memPerVCPU: 8192, smallestSize: "large"},
	"t3": {arch: kube.ArchX86_64, hibernation: true, burstable: true}, "t3a": {arch: kube.ArchX86_64, hibernation: true, burstable: true},
	// arm64, Graviton
	"m6g": {arch: kube.ArchArm64, largest: 64, memPerVCPU: 4096, smallestSize: "medium"}, "m7g": {arch: kube.ArchArm64, largest: 64, memPerVCPU: 4096, smallestSize: "medium"},
	"m8g": {arch: kube.ArchArm64, memPerVCPU: 4096, smallestSize: "medium"},
	"c6g": {arch: kube.ArchArm64, largest: 64, memPerVCPU: 2048, smallestSize: "medium"}, "c7g": {arch: kube.ArchArm64, largest: 64, memPerVCPU: 2048, smallestSize: "medium"},
	"c8g": {arch: kube.ArchArm64, memPerVCPU: 2048, smallestSize: "medium"},
	"r6g": {arch: kube.ArchArm64, largest: 64, memPerVCPU: 8192, smallestSize: "medium"}, "r7g": {arch: kube.ArchArm64, largest: 64, memPerVCPU: 8192, smallestSize: "medium"},
	"r8g": {arch: kube.ArchArm64, memPerVCPU: 8192, smallestSize: "medium"},
	"t4g": {arch: kube.ArchArm64, burstable: true},
}

// burstableSizes are the T-family shapes (t3, t3a, t4g share them).
var burstableSizes = map[string]InstanceShape{
	"nano": {VCPU: 2, MemoryMiB: 512}, "micro": {VCPU: 2, MemoryMiB: 1024}, "small": {VCPU: 2, MemoryMiB: 2048},
	"medium": {VCPU: 2, MemoryMiB: 4096}, "large": {VCPU: 2, MemoryMiB: 8192}, "xlarge": {VCPU: 4, MemoryMiB: 16384},
	"2xlarge": {VCPU: 8, MemoryMiB: 32768},
}

// vcpusBySize are the vCPU counts of the non-burstable sizes dynk8s accepts.
var vcpusBySize = map[string]int{
	"medium": 1, "large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "12xlarge": 48,
	"16xlarge": 64, "24xlarge": 96,
}

// LookupInstanceType returns the shape of an EC2 instance type such as "c7g.2xlarge".
func LookupInstanceType(name string) (InstanceShape, error) {
	family, size, ok := strings.Cut(name, ".")
	if !ok {
		return InstanceShape{}, fmt.Errorf("%q is not an instance type (want family.size, e.g. c7g.2xlarge)", name)
	}
	f, ok := instanceFamilies[family]
	if !ok {
		return InstanceShape{}, fmt.Errorf("unknown instance family %q (known: %s)", family, knownFamilies())
	}
	if f.burstable {
		s, ok := burstableSizes[size]
		if !ok {
			return InstanceShape{}, fmt.Errorf("unknown size %q of burstable family %s", size, family)
		}
		s.Arch, s.Hibernates = f.arch, f.hibernation
		return s, nil
	}
	v, ok := vcpusBySize[size]
	if sizes, own := familySizes[family]; own {
		v, ok = sizes[size]
	}
	if !ok || (size == "medium" && f.smallestSize != "medium") || (f.largest != 0 && v > f.largest) {
		return InstanceShape{}, fmt.Errorf("unknown size %q of family %s", size, family)
	}
	return InstanceShape{Arch: f.arch, VCPU: v, MemoryMiB: v * f.memPerVCPU, Hibernates: f.hibernation}, nil
}

func knownFamilies() string {
	names := make([]string, 0, len(instanceFamilies))
	for n := range instanceFamilies {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

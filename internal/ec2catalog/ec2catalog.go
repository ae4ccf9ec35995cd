// Package ec2catalog is the offline tools' catalog of EC2 instance types: for the families the examples and tests
// use, the shapes of the EC2 instance type pages (general purpose 4 GiB per vCPU, compute optimized 2, memory
// optimized 8; Graviton families end in "g") and the zones that offer them. The offline plan's stand-in for EC2
// answers ec2:DescribeInstanceTypes and ec2:DescribeInstanceTypeOfferings from it, and explain sizes template nodes
// by it, so both size a pool as a real preview would. Anything that runs against AWS asks EC2 instead
// (config.InstanceType). It imports nothing of the module.
package ec2catalog

import (
	"maps"
	"slices"
	"strings"
)

// family is one EC2 family of the catalog.
type family struct {
	arch       string // "x86_64" or "arm64"
	memPerVCPU int    // MiB
	burstable  bool
	// smallest is the family's smallest size ("medium" or "large"); largest the vCPUs of its largest size when
	// below 24xlarge (Graviton 6g/7g stop at 16xlarge).
	smallest string
	largest  int
	// sizes replace the common size table for families that break it (c5 has 9xlarge and 18xlarge).
	sizes map[string]int
	// zones limits the zone letters the family is offered in (a newer family not yet everywhere); nil: all.
	zones string
	// noHibernation: the family cannot hibernate (the stand-in's newest families and Macs).
	noHibernation bool
}

var families = map[string]family{
	"m5": {arch: "x86_64", memPerVCPU: 4096, smallest: "large"}, "m6i": {arch: "x86_64", memPerVCPU: 4096, smallest: "large"},
	"m6a": {arch: "x86_64", memPerVCPU: 4096, smallest: "large"}, "m7i": {arch: "x86_64", memPerVCPU: 4096, smallest: "large"},
	"m7a": {arch: "x86_64", memPerVCPU: 4096, smallest: "medium"},
	"c5": {arch: "x86_64", memPerVCPU: 2048, smallest: "large", sizes: map[string]int{"large": 2, "xlarge": 4,
		"2xlarge": 8, "4xlarge": 16, "9xlarge": 36, "12xlarge": 48, "18xlarge": 72, "24xlarge": 96}},
	"c6i": {arch: "x86_64", memPerVCPU: 2048, smallest: "large"}, "c6a": {arch: "x86_64", memPerVCPU: 2048, smallest: "large"},
	"c7i": {arch: "x86_64", memPerVCPU: 2048, smallest: "large"}, "c7a": {arch: "x86_64", memPerVCPU: 2048, smallest: "medium"},
	"r6i": {arch: "x86_64", memPerVCPU: 8192, smallest: "large"}, "r7i": {arch: "x86_64", memPerVCPU: 8192, smallest: "large"},
	"t3": {arch: "x86_64", burstable: true}, "t3a": {arch: "x86_64", burstable: true},
	"m6g": {arch: "arm64", memPerVCPU: 4096, smallest: "medium", largest: 64},
	"m7g": {arch: "arm64", memPerVCPU: 4096, smallest: "medium", largest: 64},
	"c6g": {arch: "arm64", memPerVCPU: 2048, smallest: "medium", largest: 64},
	"c7g": {arch: "arm64", memPerVCPU: 2048, smallest: "medium", largest: 64},
	"r6g": {arch: "arm64", memPerVCPU: 8192, smallest: "medium", largest: 64},
	"r7g": {arch: "arm64", memPerVCPU: 8192, smallest: "medium", largest: 64},
	// The newest Graviton family, offered in two of the three zones of the stand-in region.
	"c8g": {arch: "arm64", memPerVCPU: 2048, smallest: "medium", zones: "ab", noHibernation: true},
	"m8g": {arch: "arm64", memPerVCPU: 4096, smallest: "medium", zones: "ab", noHibernation: true},
	"t4g": {arch: "arm64", burstable: true},
	// A Mac family: neither x86_64 nor arm64 as Linux knows them.
	"mac2": {arch: "arm64_mac", memPerVCPU: 1365, smallest: "metal", sizes: map[string]int{"metal": 12},
		noHibernation: true},
}

// burstableSizes are the T-family shapes (t3, t3a, t4g share them): vCPUs and MiB.
var burstableSizes = map[string][2]int{
	"nano": {2, 512}, "micro": {2, 1024}, "small": {2, 2048}, "medium": {2, 4096}, "large": {2, 8192},
	"xlarge": {4, 16384}, "2xlarge": {8, 32768},
}

// commonSizes are the vCPUs of the non-burstable sizes.
var commonSizes = map[string]int{
	"medium": 1, "large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "12xlarge": 48,
	"16xlarge": 64, "24xlarge": 96,
}

// Type is one catalog entry.
type Type struct {
	Name      string
	VCPU      int
	MemoryMiB int
	fam       family
}

// Arch is the architecture EC2 lists for the type: "x86_64", "arm64", or "arm64_mac" for a Mac family.
func (t Type) Arch() string { return t.fam.arch }

// Hibernation says whether on-demand instances of the type can hibernate.
func (t Type) Hibernation() bool { return !t.fam.noHibernation }

// Lookup is the catalog's entry for an instance type name; ok is false for a type it lacks (an unknown family, or
// a size its family does not have).
func Lookup(name string) (t Type, ok bool) {
	fam, size, ok := strings.Cut(name, ".")
	f, known := families[fam]
	if !ok || !known {
		return Type{}, false
	}
	if f.burstable {
		s, ok := burstableSizes[size]
		return Type{name, s[0], s[1], f}, ok
	}
	v, ok := commonSizes[size]
	if f.sizes != nil {
		v, ok = f.sizes[size]
	}
	if !ok || (size == "medium" && f.smallest != "medium") || (f.largest != 0 && v > f.largest) {
		return Type{}, false
	}
	return Type{name, v, v * f.memPerVCPU, f}, true
}

// OfferedIn reports whether the type is offered in zone; Local Zones offer only the burstable families.
func (t Type) OfferedIn(zone string) bool {
	if strings.Count(zone, "-") > 2 {
		return t.fam.burstable
	}
	return t.fam.zones == "" || strings.ContainsRune(t.fam.zones, rune(zone[len(zone)-1]))
}

// HasFamily says whether the catalog holds the family (the part of a type name before the dot).
func HasFamily(fam string) bool {
	_, ok := families[fam]
	return ok
}

// Families are the catalog's families, sorted.
func Families() []string {
	return slices.Sorted(maps.Keys(families))
}

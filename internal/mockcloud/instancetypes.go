package mockcloud

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
)

// The stand-in's EC2 instance type catalog: what ec2:DescribeInstanceTypes and ec2:DescribeInstanceTypeOfferings
// answer in the mock cloud. It covers the families the examples and tests use, with the shapes of the EC2 instance
// type pages (general purpose 4 GiB per vCPU, compute optimized 2, memory optimized 8; Graviton families end in
// "g"), so that the offline plan sizes pools as a real preview would. A real preview asks EC2.

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

// instanceType is one catalog entry.
type instanceType struct {
	name      string
	fam       family
	vcpu, mib int
}

func lookupInstanceType(name string) (instanceType, bool) {
	fam, size, ok := strings.Cut(name, ".")
	f, known := families[fam]
	if !ok || !known {
		return instanceType{}, false
	}
	if f.burstable {
		s, ok := burstableSizes[size]
		return instanceType{name, f, s[0], s[1]}, ok
	}
	v, ok := commonSizes[size]
	if f.sizes != nil {
		v, ok = f.sizes[size]
	}
	if !ok || (size == "medium" && f.smallest != "medium") || (f.largest != 0 && v > f.largest) {
		return instanceType{}, false
	}
	return instanceType{name, f, v, v * f.memPerVCPU}, true
}

// offeredIn reports whether the type is offered in zone; Local Zones offer only the burstable families.
func (t instanceType) offeredIn(zone string) bool {
	if strings.Count(zone, "-") > 2 {
		return t.fam.burstable
	}
	return t.fam.zones == "" || strings.ContainsRune(t.fam.zones, rune(zone[len(zone)-1]))
}

// OfflineCatalogMiss is the error code of a lookup of a type whose family the catalog does not hold: the stand-in
// cannot tell whether EC2 has it, so it says so instead of answering as EC2 would (config.IsOfflineCatalogMiss).
const OfflineCatalogMiss = "NotInOfflineCatalog"

// getInstanceType answers aws:ec2/getInstanceType as EC2 does for the catalog's families, failing for a size a
// family does not have with the error text of ec2:DescribeInstanceTypes; a type of any other family fails with
// OfflineCatalogMiss.
func (c *Cloud) getInstanceType(args resource.PropertyMap) (resource.PropertyMap, error) {
	name, _ := Plain(args["instanceType"], true).(string)
	t, ok := lookupInstanceType(name)
	if fam, _, _ := strings.Cut(name, "."); !ok && !slices.Contains(slices.Collect(maps.Keys(families)), fam) {
		return nil, fmt.Errorf("reading EC2 Instance Type (%s): %s: the offline plan's catalog has no family %q "+
			"(it holds %s)", name, OfflineCatalogMiss, fam, strings.Join(slices.Sorted(maps.Keys(families)), ", "))
	}
	if !ok {
		return nil, fmt.Errorf("reading EC2 Instance Type (%s): InvalidInstanceType: The following supplied "+
			"instance types do not exist: [%s]", name, name)
	}
	arch := []any{t.fam.arch}
	if t.fam.arch == "x86_64" {
		arch = append(arch, "i386")
	}
	usage := []any{"on-demand", "spot"}
	if t.fam.arch == "arm64_mac" {
		usage = []any{"on-demand"}
	}
	return resource.NewPropertyMapFromMap(map[string]any{
		"id":                     name,
		"instanceType":           name,
		"defaultVcpus":           t.vcpu,
		"memorySize":             t.mib,
		"supportedArchitectures": arch,
		"supportedUsagesClasses": usage,
		"autoRecoverySupported":  t.fam.arch != "arm64_mac",
		"hibernationSupported":   !t.fam.noHibernation,
		"currentGeneration":      true,
	}), nil
}

// getInstanceTypeOfferings answers aws:ec2/getInstanceTypeOfferings for location type availability-zone with the
// filters instance-type and location: the (type, zone) pairs in the catalog, sorted.
func (c *Cloud) getInstanceTypeOfferings(args resource.PropertyMap) (resource.PropertyMap, error) {
	if lt, _ := Plain(args["locationType"], true).(string); lt != "availability-zone" {
		return nil, fmt.Errorf("mockcloud: getInstanceTypeOfferings answers locationType availability-zone only, "+
			"got %q", lt)
	}
	filters := filterValues(args)
	var types, locations, locationTypes []any
	for _, name := range slices.Sorted(slices.Values(filters["instance-type"])) {
		t, ok := lookupInstanceType(name)
		if !ok {
			continue
		}
		for _, zone := range slices.Sorted(slices.Values(filters["location"])) {
			if t.offeredIn(zone) {
				types, locations = append(types, name), append(locations, zone)
				locationTypes = append(locationTypes, "availability-zone")
			}
		}
	}
	return resource.NewPropertyMapFromMap(map[string]any{
		"id": c.Region, "locationType": "availability-zone",
		"instanceTypes": types, "locations": locations, "locationTypes": locationTypes,
	}), nil
}

// filterValues reads the filters argument of a data source ([{name, values}]) into name -> values.
func filterValues(args resource.PropertyMap) map[string][]string {
	out := map[string][]string{}
	list, _ := Plain(args["filters"], true).([]any)
	for _, f := range list {
		m := f.(map[string]any)
		for _, v := range m["values"].([]any) {
			out[m["name"].(string)] = append(out[m["name"].(string)], v.(string))
		}
	}
	return out
}

// Shape is the vCPUs and MiB of memory of an instance type in the stand-in's catalog, as getInstanceType answers
// them; ok is false for a type the catalog lacks. For the offline tools (cmd/explain) that size a pool as the
// offline plan does.
func Shape(name string) (vcpu, memoryMiB int, ok bool) {
	t, ok := lookupInstanceType(name)
	return t.vcpu, t.mib, ok
}

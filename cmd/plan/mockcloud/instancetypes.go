package mockcloud

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"

	"github.com/dynk8s/dynk8s/internal/ec2catalog"
)

// The stand-in's EC2 instance types: what ec2:DescribeInstanceTypes and ec2:DescribeInstanceTypeOfferings answer in
// the mock cloud, from the offline catalog (internal/ec2catalog). A real preview asks EC2.

// OfflineCatalogMiss is the error code of a lookup of a type whose family the catalog does not hold: the stand-in
// cannot tell whether EC2 has it, so it says so instead of answering as EC2 would (config.IsOfflineCatalogMiss).
const OfflineCatalogMiss = "NotInOfflineCatalog"

// getInstanceType answers aws:ec2/getInstanceType as EC2 does for the catalog's families, failing for a size a
// family does not have with the error text of ec2:DescribeInstanceTypes; a type of any other family fails with
// OfflineCatalogMiss.
func (c *Cloud) getInstanceType(args resource.PropertyMap) (resource.PropertyMap, error) {
	name, _ := Plain(args["instanceType"], true).(string)
	t, ok := ec2catalog.Lookup(name)
	if fam, _, _ := strings.Cut(name, "."); !ok && !ec2catalog.HasFamily(fam) {
		return nil, fmt.Errorf("reading EC2 Instance Type (%s): %s: the offline plan's catalog has no family %q "+
			"(it holds %s)", name, OfflineCatalogMiss, fam, strings.Join(ec2catalog.Families(), ", "))
	}
	if !ok {
		return nil, fmt.Errorf("reading EC2 Instance Type (%s): InvalidInstanceType: The following supplied "+
			"instance types do not exist: [%s]", name, name)
	}
	arch := []any{t.Arch()}
	if t.Arch() == "x86_64" {
		arch = append(arch, "i386")
	}
	usage := []any{"on-demand", "spot"}
	if t.Arch() == "arm64_mac" {
		usage = []any{"on-demand"}
	}
	return resource.NewPropertyMapFromMap(map[string]any{
		"id":                     name,
		"instanceType":           name,
		"defaultVcpus":           t.VCPU,
		"memorySize":             t.MemoryMiB,
		"supportedArchitectures": arch,
		"supportedUsagesClasses": usage,
		"autoRecoverySupported":  t.Arch() != "arm64_mac",
		"hibernationSupported":   t.Hibernation(),
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
		t, ok := ec2catalog.Lookup(name)
		if !ok {
			continue
		}
		for _, zone := range slices.Sorted(slices.Values(filters["location"])) {
			if t.OfferedIn(zone) {
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

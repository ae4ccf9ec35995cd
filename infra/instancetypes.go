package infra

import (
	"fmt"
	"maps"
	"slices"

	"github.com/pulumi/pulumi-aws/sdk/v6/go/aws/ec2"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/dynk8s/dynk8s/infra/config"
)

// instanceTypes asks EC2 about every instance type the config names (ec2:DescribeInstanceTypes) and where the
// stack's zones offer them (ec2:DescribeInstanceTypeOfferings), then checks them (config.CheckInstanceTypes): a
// type that does not exist, has the wrong architecture or shape, cannot run as Spot in a spot pool, or is offered
// in none of the zones fails the preview with its key path before anything is declared. Warnings go to the
// operator through the engine's log.
func instanceTypes(ctx *pulumi.Context, cfg *config.Config, zones []string) (map[string]config.InstanceType, error) {
	types := map[string]config.InstanceType{}
	failed := map[string]error{}
	for _, name := range cfg.InstanceTypeNames() {
		res, err := ec2.GetInstanceType(ctx, &ec2.GetInstanceTypeArgs{InstanceType: name})
		switch {
		case config.IsUnknownInstanceType(err), config.IsOfflineCatalogMiss(err):
			failed[name] = err
			continue
		case err != nil:
			// Credentials, throttling, or no provider at all: no config change fixes that, so it is not reported
			// as a configuration problem.
			return nil, fmt.Errorf("asking EC2 about instance type %q in %s: %w", name, cfg.Region, err)
		}
		types[name] = config.InstanceType{
			Name:         name,
			Arch:         config.ArchOf(res.SupportedArchitectures),
			VCPU:         res.DefaultVcpus,
			MemoryMiB:    res.MemorySize,
			Spot:         slices.Contains(res.SupportedUsagesClasses, "spot"),
			AutoRecovery: res.AutoRecoverySupported,
			Hibernation:  res.HibernationSupported,
		}
	}
	if len(types) > 0 {
		offers, err := ec2.GetInstanceTypeOfferings(ctx, &ec2.GetInstanceTypeOfferingsArgs{
			LocationType: pulumi.StringRef("availability-zone"),
			Filters: []ec2.GetInstanceTypeOfferingsFilter{
				{Name: "instance-type", Values: slices.Sorted(maps.Keys(types))},
				{Name: "location", Values: zones},
			},
		})
		if err != nil {
			return nil, fmt.Errorf("instance type offerings in %s: %w", cfg.Region, err)
		}
		if len(offers.Locations) != len(offers.InstanceTypes) {
			return nil, fmt.Errorf("instance type offerings in %s: %d types but %d locations", cfg.Region,
				len(offers.InstanceTypes), len(offers.Locations))
		}
		for _, zone := range zones {
			for i, name := range offers.InstanceTypes {
				if t, ok := types[name]; ok && offers.Locations[i] == zone {
					t.Zones = append(t.Zones, zone)
					types[name] = t
				}
			}
		}
	}
	warnings, err := cfg.CheckInstanceTypes(types, failed, zones)
	for _, w := range warnings {
		if logErr := ctx.Log.Warn(w, nil); logErr != nil {
			return nil, logErr
		}
	}
	if err != nil {
		return nil, err
	}
	return types, nil
}

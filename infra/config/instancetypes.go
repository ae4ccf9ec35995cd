package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// InstanceType is what EC2 says of one instance type in the stack's region: its shape and capabilities
// (ec2:DescribeInstanceTypes, the ec2.GetInstanceType data source) and the stack's zones that offer it
// (ec2:DescribeInstanceTypeOfferings). The stack keeps no table of its own: the API is the source of truth. Only
// the tools that run without an AWS account, the offline plan's stand-in for EC2 and explain's template nodes, size
// types from the offline catalog (internal/ec2catalog).
type InstanceType struct {
	Name string
	// Arch is the architecture a Fedora image exists for: x86_64 or arm64, "" for any other (i386-only, Mac).
	Arch         kube.Arch
	VCPU         int
	MemoryMiB    int
	Spot         bool // "spot" is among its supported usage classes
	AutoRecovery bool // simplified automatic recovery is supported
	Hibernation  bool // on-demand instances of it can hibernate
	// Zones are the stack's zones where it is offered, in the stack's zone order.
	Zones []string
}

// ArchOf is the architecture of an instance type from its supported architectures ("x86_64", "arm64", "i386",
// "x86_64_mac", ...).
func ArchOf(supported []string) kube.Arch {
	for _, a := range []kube.Arch{kube.ArchX86_64, kube.ArchArm64} {
		if slices.Contains(supported, string(a)) {
			return a
		}
	}
	return ""
}

// minNodeMemoryMiB is the memory kubeadm's installation guide asks of every machine of a cluster ("2 GB or more of
// RAM per machine (any less will leave little room for your apps)", kubernetes.io/docs/setup/production-environment/
// tools/kubeadm/install-kubeadm). A pool of a smaller type is warned about, not refused: it joins and runs.
const minNodeMemoryMiB = 2048

// instanceTypeRE is the form of an EC2 instance type name: family (letters, digits, "-" as in "u-6tb1"), a dot,
// size. Whether the type exists is for EC2 to say, at preview.
var instanceTypeRE = regexp.MustCompile(`^[a-z][a-z0-9-]*\.[a-z0-9]+$`)

func checkInstanceTypeName(r *reader, path, name string) {
	if !instanceTypeRE.MatchString(name) {
		r.addf(path, "%q is not an EC2 instance type name (family.size, e.g. c7g.2xlarge)", name)
	}
}

// InstanceTypeNames are the distinct instance types the config names: the gateway's, then every pool's, in config
// order. The caller looks each up in EC2 and hands the answers to CheckInstanceTypes.
func (c *Config) InstanceTypeNames() []string {
	names := []string{c.Gateway.InstanceType}
	for _, p := range c.NodePools {
		for _, t := range p.InstanceTypes {
			if !slices.Contains(names, t) {
				names = append(names, t)
			}
		}
	}
	return names
}

// IsUnknownInstanceType says whether a DescribeInstanceTypes failure is EC2's answer that the type does not exist
// (its error code; the rest of the text is the engine's and the provider's framing of the call).
func IsUnknownInstanceType(err error) bool {
	return err != nil && strings.Contains(err.Error(), "InvalidInstanceType")
}

// IsOfflineCatalogMiss says whether a lookup failed because the offline plan's stand-in for EC2 does not hold the
// type's family (mockcloud.OfflineCatalogMiss): nothing is known of the type then, and a real preview asks EC2.
func IsOfflineCatalogMiss(err error) bool {
	return err != nil && strings.Contains(err.Error(), "NotInOfflineCatalog")
}

// CheckInstanceTypes checks the config's instance types against what EC2 said of them. types has an entry for every
// name in InstanceTypeNames that EC2 knows; lookupErrs has the error of every name it refused. zones are the stack's
// zones, the gateway's first. Problems come back as an *Error with key paths; warnings are for the operator to read
// (a type not offered in every zone of its pool still works, in fewer zones).
func (c *Config) CheckInstanceTypes(types map[string]InstanceType, lookupErrs map[string]error, zones []string) (
	warnings []string, err error) {
	r := &reader{}
	ns := Namespace + ":"
	known := func(path, name string) (InstanceType, bool) {
		if e, failed := lookupErrs[name]; failed {
			// EC2's error code says the type does not exist; the rest of the text is the engine's and the
			// provider's framing of the call. Any other failure (credentials, throttling) is shown whole.
			switch {
			case IsUnknownInstanceType(e):
				r.addf(path, "EC2 has no instance type %q in %s (InvalidInstanceType)", name, c.Region)
			case IsOfflineCatalogMiss(e):
				r.addf(path, "instance type %q cannot be checked offline: the plan's catalog of EC2 families does not "+
					"hold it (a real `pulumi preview` asks EC2 about it)", name)
			default:
				r.addf(path, "asking EC2 about instance type %q in %s failed: %v", name, c.Region, e)
			}
			return InstanceType{}, false
		}
		t, ok := types[name]
		if !ok {
			r.addf(path, "instance type %q was not looked up", name)
		}
		return t, ok
	}

	gp := ns + "gateway.instanceType"
	if g, ok := known(gp, c.Gateway.InstanceType); ok {
		switch {
		case g.Arch == "":
			r.addf(gp, "%s is neither an x86_64 nor an arm64 type: there is no Fedora Cloud image for it", g.Name)
		case len(zones) > 0 && !slices.Contains(g.Zones, zones[0]):
			r.addf(gp, "%s is not offered in %s, the zone of the gateway", g.Name, zones[0])
		case !g.AutoRecovery:
			warnings = append(warnings, fmt.Sprintf("%s: %s does not support automatic recovery: a host failure "+
				"leaves the gateway down until its status-check alarm reboots it or you act", gp, g.Name))
		}
	}

	for i, p := range c.NodePools {
		var first InstanceType
		for j, name := range p.InstanceTypes {
			ip := fmt.Sprintf("%snodePools[%d].instanceTypes[%d]", ns, i, j)
			t, ok := known(ip, name)
			if !ok {
				continue
			}
			switch {
			case t.Arch != p.Arch:
				r.addf(ip, "%s is an %s type but the pool's arch is %s", name, describeArch(t.Arch), p.Arch)
				continue
			case p.Spot && !t.Spot:
				r.addf(ip, "%s cannot run as Spot capacity (EC2 lists only %q usage) but the pool is spot", name,
					"on-demand")
			case len(t.Zones) == 0:
				r.addf(ip, "%s is not offered in any of the stack's zones (%s)", name, strings.Join(zones, ", "))
			case len(t.Zones) < len(zones):
				warnings = append(warnings, fmt.Sprintf("%s: %s is offered only in %s of the stack's zones %s; the "+
					"group launches it there only", ip, name, strings.Join(t.Zones, ", "), strings.Join(zones, ", ")))
			}
			if p.WarmPool != nil && p.WarmPool.State == WarmHibernated && p.AMIID != "" {
				if msg := hibernationPrerequisites(p, t); msg != "" {
					r.addf(fmt.Sprintf("%snodePools[%d].warmPool.state", ns, i), "%s", msg)
				}
			}
			if first.Name == "" {
				first = t
				if t.MemoryMiB > 0 && t.MemoryMiB < minNodeMemoryMiB {
					warnings = append(warnings, fmt.Sprintf("%s: %s has %d MiB of memory: a kubeadm node needs 2 GiB "+
						"or more (kubernetes.io, Installing kubeadm: 'any less will leave little room for your apps'); "+
						"the kubelet, CRI-O and the stack's DaemonSets take much of it from the builds", ip, name,
						t.MemoryMiB))
				}
				continue
			}
			if t.VCPU != first.VCPU || t.MemoryMiB != first.MemoryMiB {
				r.addf(ip, "%s has %d vCPU/%d MiB but %s has %d vCPU/%d MiB: the Cluster Autoscaler sizes a group by "+
					"its first type, so every type of a pool must have the same shape (make another pool)", name,
					t.VCPU, t.MemoryMiB, first.Name, first.VCPU, first.MemoryMiB)
			}
		}
	}
	if len(r.errs) > 0 {
		slices.SortStableFunc(r.errs, func(a, b FieldError) int { return comparePaths(a.Path, b.Path) })
		return warnings, &Error{Errors: r.errs}
	}
	return warnings, nil
}

func describeArch(a kube.Arch) string {
	if a == "" {
		return "other-architecture"
	}
	return string(a)
}

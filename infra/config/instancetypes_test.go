package config_test

import (
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/infra/config"
	"github.com/dynk8s/dynk8s/internal/kube"
)

// TestCheckInstanceTypes: the checks on what EC2 says of the config's types, each problem on its key path.
func TestCheckInstanceTypes(t *testing.T) {
	zones := []string{"eu-central-1a", "eu-central-1b"}
	all := func(name string, arch kube.Arch, vcpu, mib int) config.InstanceType {
		return config.InstanceType{Name: name, Arch: arch, VCPU: vcpu, MemoryMiB: mib, Spot: true, AutoRecovery: true,
			Zones: zones}
	}
	facts := func() map[string]config.InstanceType {
		return map[string]config.InstanceType{
			"t4g.micro":   all("t4g.micro", kube.ArchArm64, 2, 1024),
			"c7i.2xlarge": all("c7i.2xlarge", kube.ArchX86_64, 8, 16384),
			"c7g.2xlarge": all("c7g.2xlarge", kube.ArchArm64, 8, 16384),
			"c6g.2xlarge": all("c6g.2xlarge", kube.ArchArm64, 8, 16384),
		}
	}
	cfg, err := parse(t, devConfig(t))
	assert.NilError(t, err)
	assert.DeepEqual(t, cfg.InstanceTypeNames(), []string{"t4g.micro", "c7i.2xlarge", "c7g.2xlarge", "c6g.2xlarge"})
	warnings, err := cfg.CheckInstanceTypes(facts(), nil, zones)
	assert.NilError(t, err)
	assert.Equal(t, len(warnings), 0)

	for name, tc := range map[string]struct {
		change     func(map[string]config.InstanceType, map[string]error)
		path, want string
	}{
		"unknown type": {func(f map[string]config.InstanceType, e map[string]error) {
			delete(f, "c6g.2xlarge")
			e["c6g.2xlarge"] = errors.New("invocation of aws:ec2/getInstanceType:getInstanceType returned an error: " +
				"reading EC2 Instance Type (c6g.2xlarge): api error InvalidInstanceType: The following supplied " +
				"instance types do not exist: [c6g.2xlarge]")
		}, "dynk8s:nodePools[1].instanceTypes[1]", `EC2 has no instance type "c6g.2xlarge" in eu-central-1 (InvalidInstanceType)`},
		"EC2 does not answer": {func(f map[string]config.InstanceType, e map[string]error) {
			delete(f, "c6g.2xlarge")
			e["c6g.2xlarge"] = errors.New("api error UnauthorizedOperation: You are not authorized")
		}, "dynk8s:nodePools[1].instanceTypes[1]", `asking EC2 about instance type "c6g.2xlarge" in eu-central-1 failed: api error UnauthorizedOperation`},
		"wrong arch": {func(f map[string]config.InstanceType, _ map[string]error) {
			f["c7i.2xlarge"] = all("c7i.2xlarge", kube.ArchArm64, 8, 16384)
		}, "dynk8s:nodePools[0].instanceTypes[0]", "is an arm64 type but the pool's arch is x86_64"},
		"no spot": {func(f map[string]config.InstanceType, _ map[string]error) {
			t := f["c6g.2xlarge"]
			t.Spot = false
			f["c6g.2xlarge"] = t
		}, "dynk8s:nodePools[1].instanceTypes[1]", "cannot run as Spot capacity"},
		"no zone": {func(f map[string]config.InstanceType, _ map[string]error) {
			t := f["c7g.2xlarge"]
			t.Zones = nil
			f["c7g.2xlarge"] = t
		}, "dynk8s:nodePools[1].instanceTypes[0]", "not offered in any of the stack's zones"},
		"shape": {func(f map[string]config.InstanceType, _ map[string]error) {
			f["c6g.2xlarge"] = all("c6g.2xlarge", kube.ArchArm64, 8, 8192)
		}, "dynk8s:nodePools[1].instanceTypes[1]", "same shape"},
		"gateway zone": {func(f map[string]config.InstanceType, _ map[string]error) {
			t := f["t4g.micro"]
			t.Zones = zones[1:]
			f["t4g.micro"] = t
		}, "dynk8s:gateway.instanceType", "not offered in eu-central-1a, the zone of the gateway"},
	} {
		t.Run(name, func(t *testing.T) {
			f, e := facts(), map[string]error{}
			tc.change(f, e)
			_, err := cfg.CheckInstanceTypes(f, e, zones)
			var cfgErr *config.Error
			assert.Assert(t, errors.As(err, &cfgErr), "got %v", err)
			assert.Equal(t, len(cfgErr.Errors), 1, "%v", err)
			assert.Equal(t, cfgErr.Errors[0].Path, tc.path)
			assert.Check(t, is.Contains(cfgErr.Errors[0].Msg, tc.want))
		})
	}

	// Warnings: a type in only some zones, a gateway without automatic recovery.
	f := facts()
	c7g, gw := f["c7g.2xlarge"], f["t4g.micro"]
	c7g.Zones, gw.AutoRecovery = zones[1:], false
	f["c7g.2xlarge"], f["t4g.micro"] = c7g, gw
	warnings, err = cfg.CheckInstanceTypes(f, nil, zones)
	assert.NilError(t, err)
	assert.Equal(t, len(warnings), 2, strings.Join(warnings, "\n"))
	assert.Check(t, is.Contains(warnings[0], "does not support automatic recovery"))
	assert.Check(t, is.Contains(warnings[1], "dynk8s:nodePools[1].instanceTypes[0]: c7g.2xlarge is offered only in eu-central-1b"))

	// A pool of a type below kubeadm's 2 GiB is warned about on the pool's type (the gateway of 1 GiB is no node);
	// 2 GiB itself is enough.
	for mib, want := range map[int]int{512: 1, 2047: 1, 2048: 0} {
		f := facts()
		f["c7i.2xlarge"] = all("c7i.2xlarge", kube.ArchX86_64, 2, mib)
		warnings, err := cfg.CheckInstanceTypes(f, nil, zones)
		assert.NilError(t, err)
		assert.Equal(t, len(warnings), want, "%d MiB: %s", mib, strings.Join(warnings, "\n"))
		if want > 0 {
			assert.Check(t, is.Contains(warnings[0], "dynk8s:nodePools[0].instanceTypes[0]: c7i.2xlarge has "))
			assert.Check(t, is.Contains(warnings[0], "a kubeadm node needs 2 GiB or more"))
		}
	}
}

func TestArchOf(t *testing.T) {
	assert.Equal(t, config.ArchOf([]string{"i386", "x86_64"}), kube.ArchX86_64)
	assert.Equal(t, config.ArchOf([]string{"arm64"}), kube.ArchArm64)
	assert.Equal(t, config.ArchOf([]string{"x86_64_mac"}), kube.Arch(""))
}

package infra

import (
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// TestAutoscalerReleaseTableCoversEveryMinor checks that the table has one entry per minor from 1.23 to 1.36, with
// no gap: a gap would make a supported Kubernetes minor fail with "no known release".
func TestAutoscalerReleaseTableCoversEveryMinor(t *testing.T) {
	lo, hi := autoscalerKnownMinors()
	assert.Equal(t, lo, 23)
	assert.Equal(t, hi, 36)
	for m := lo; m <= hi; m++ {
		_, ok := autoscalerLatestPatch[m]
		assert.Check(t, ok, "no entry for 1.%d", m)
	}
	assert.Equal(t, len(autoscalerLatestPatch), hi-lo+1)
}

// TestResolveAutoscalerVersionDefaultPerMinor resolves every known minor without an override, with fuse on and off:
// the result is the table's patch of the same minor, except that 1.23 (never fixed) is refused with fuse on.
func TestResolveAutoscalerVersionDefaultPerMinor(t *testing.T) {
	want := map[int]string{
		23: "1.23.1", 24: "1.24.3", 25: "1.25.3", 26: "1.26.8", 27: "1.27.8", 28: "1.28.7", 29: "1.29.5",
		30: "1.30.6", 31: "1.31.5", 32: "1.32.7", 33: "1.33.6", 34: "1.34.5", 35: "1.35.2", 36: "1.36.1",
	}
	for minor := 23; minor <= 36; minor++ {
		k8s := fmt.Sprintf("1.%d.4", minor)
		t.Run(k8s, func(t *testing.T) {
			got, err := ResolveAutoscalerVersion(k8s, "", false)
			assert.NilError(t, err)
			assert.Equal(t, got, want[minor])

			got, err = ResolveAutoscalerVersion(k8s, "", true)
			if minor == 23 {
				assert.ErrorContains(t, err, "ignores the node-template resource tags")
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, want[minor])
		})
	}
}

// TestResolveAutoscalerVersionFuseWindows checks each edge of the fuse bug windows with explicit versions: the last
// broken and the first fixed patch of 1.24, 1.25 and 1.26, all of 1.23 and older, and 1.27.0. Without fuse every one
// of them is accepted.
func TestResolveAutoscalerVersionFuseWindows(t *testing.T) {
	cases := []struct {
		version string
		broken  bool
	}{
		{"1.22.3", true},
		{"1.23.0", true},
		{"1.23.1", true},
		{"1.24.0", true},
		{"1.24.1", true},
		{"1.24.2", false},
		{"1.24.3", false},
		{"1.25.0", true},
		{"1.25.1", true},
		{"1.25.2", false},
		{"1.26.0", true},
		{"1.26.2", true},
		{"1.26.3", false},
		{"1.26.8", false},
		{"1.27.0", false},
		{"1.34.0", false},
	}
	for _, tc := range cases {
		t.Run(tc.version, func(t *testing.T) {
			k8s, err := parseAutoscalerSemver(tc.version)
			assert.NilError(t, err)
			kubernetes := fmt.Sprintf("1.%d.9", k8s.minor)

			got, err := ResolveAutoscalerVersion(kubernetes, tc.version, true)
			if tc.broken {
				assert.ErrorContains(t, err, "the Cluster Autoscaler version "+tc.version+
					" ignores the node-template resource tags")
				assert.ErrorContains(t, err, "kubernetes/autoscaler#5164")
			} else {
				assert.NilError(t, err)
				assert.Equal(t, got, tc.version)
			}

			got, err = ResolveAutoscalerVersion(kubernetes, tc.version, false)
			assert.NilError(t, err)
			assert.Equal(t, got, tc.version)
		})
	}
}

// TestResolveAutoscalerVersionErrors checks every refusal other than the fuse windows, and that the messages carry
// no config key (the config loader adds dynk8s:autoscaler.version itself).
func TestResolveAutoscalerVersionErrors(t *testing.T) {
	cases := []struct {
		name, kubernetes, override string
		want                       string
	}{
		{"override with v prefix", "1.34.4", "v1.34.5", `"v1.34.5" is not a version of the form MAJOR.MINOR.PATCH`},
		{"override without patch", "1.34.4", "1.34", `"1.34" is not a version`},
		{"override pre-release", "1.34.4", "1.34.5-rc.1", `"1.34.5-rc.1" is not a version`},
		{"override leading zero", "1.34.4", "1.034.5", `"1.034.5" is not a version`},
		{"override with blank", "1.34.4", " 1.34.5", `" 1.34.5" is not a version`},
		{"override of an older minor", "1.34.4", "1.33.6",
			"the Cluster Autoscaler version 1.33.6 does not match Kubernetes 1.34.4: the autoscaler's minor " +
				"version must equal the control plane's (use a 1.34.x release)"},
		{"override of a newer minor", "1.34.4", "1.35.2", "does not match Kubernetes 1.34.4"},
		{"override of another major", "1.34.4", "2.34.0", "does not match Kubernetes 1.34.4"},
		{"unknown newer minor", "1.37.0", "",
			"no Cluster Autoscaler release is known for Kubernetes 1.37 (known: 1.23 to 1.36); set the version " +
				"explicitly to the latest cluster-autoscaler-1.37.x release"},
		{"unknown older minor", "1.22.17", "", "no Cluster Autoscaler release is known for Kubernetes 1.22"},
		{"malformed kubernetes version", "1.34", "", `the Kubernetes version: "1.34" is not a version`},
		{"kubernetes major 2", "2.0.0", "", "the Kubernetes version 2.0.0 is not a 1.x release"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ResolveAutoscalerVersion(tc.kubernetes, tc.override, false)
			assert.ErrorContains(t, err, tc.want)
			assert.Check(t, !strings.Contains(err.Error(), "dynk8s:"), "message carries a key path: %v", err)
		})
	}
}

// TestResolveAutoscalerVersionOverride accepts a patch of the right minor that the table does not know, and a minor
// beyond the table when given explicitly.
func TestResolveAutoscalerVersionOverride(t *testing.T) {
	for _, tc := range []struct{ kubernetes, override string }{
		{"1.34.4", "1.34.9"},
		{"1.34.4", "1.34.0"},
		{"1.37.0", "1.37.0"},
		{"1.22.17", "1.22.3"},
	} {
		got, err := ResolveAutoscalerVersion(tc.kubernetes, tc.override, false)
		assert.NilError(t, err, "%s with %s", tc.kubernetes, tc.override)
		assert.Equal(t, got, tc.override)
	}
}

func TestAutoscalerImage(t *testing.T) {
	assert.Equal(t, autoscalerImage("1.34.5"), "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.5")
}

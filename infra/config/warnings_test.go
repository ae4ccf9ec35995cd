package config_test

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// TestWarnings: a valid config pinned to a Kubernetes minor past its end of life, or within EndOfLifeNotice of it,
// is warned about with the key path and the date; a minor far from it, or whose date is not known, is not; so is a
// Fedora release past its end of life, and not one whose end is not known; an admin kubeconfig in the clear is
// warned about with the command that stores it encrypted.
func TestWarnings(t *testing.T) {
	day := func(s string) time.Time {
		d, err := time.Parse(time.DateOnly, s)
		assert.NilError(t, err)
		return d
	}
	secret := func(string) bool { return true }
	for name, tc := range map[string]struct {
		version string
		now     string
		want    string
	}{
		"past its end of life":  {"1.34.4", "2026-12-02", "dynk8s:kubernetes.version: Kubernetes 1.34 reached its end of life on 2026-10-27"},
		"on the day":            {"1.34.4", "2026-10-27", "reached its end of life on 2026-10-27"},
		"within the notice":     {"1.35.4", "2027-01-15", "Kubernetes 1.35 reaches its end of life on 2027-02-28"},
		"far from it":           {"1.35.4", "2026-12-02", ""},
		"end of life not known": {"1.37.2", "2030-01-01", ""},
		"the upgrade named":     {"1.33.6", "2026-12-02", "upgrade the cluster and the pin to 1.34 or later"},
	} {
		t.Run(name, func(t *testing.T) {
			c := devConfig(t)
			obj(c, "kubernetes")["version"] = tc.version
			if v, _ := kube.ParseVersion(tc.version); v.Minor == 37 {
				obj(c, "autoscaler")["version"] = "1.37.0"
			}
			cfg, err := parse(t, c)
			assert.NilError(t, err)
			got := cfg.Warnings(day(tc.now), secret)
			if tc.want == "" {
				assert.Check(t, is.Len(got, 0), "%v", got)
				return
			}
			assert.Assert(t, is.Len(got, 1), "%v", got)
			assert.Check(t, is.Contains(got[0], tc.want))
		})
	}

	for release, want := range map[int]string{
		42: "dynk8s:fedora.release: Fedora 42 reached its end of life on 2026-05-28",
		40: "dynk8s:fedora.release: Fedora 40 reached its end of life before Fedora 42's, which ended on 2026-05-28",
		43: "",
		44: "",
	} {
		c := devConfig(t)
		obj(c, "kubernetes")["version"] = "1.36.1"
		obj(c, "fedora")["release"] = release
		cfg, err := parse(t, c)
		assert.NilError(t, err)
		got := cfg.Warnings(day("2026-12-02"), secret)
		if want == "" {
			assert.Check(t, is.Len(got, 0), "Fedora %d: %v", release, got)
			continue
		}
		assert.Assert(t, is.Len(got, 1), "Fedora %d: %v", release, got)
		assert.Check(t, is.Contains(got[0], want))
		assert.Check(t, is.Contains(got[0], "pin 43 or later"))
		assert.Check(t, is.Len(cfg.Warnings(day("2026-05-27"), secret), 0), "Fedora %d, the day before", release)
	}

	c := devConfig(t)
	obj(c, "kubernetes")["version"] = "1.36.1"
	obj(c, "kubernetes")["kubeconfig"] = "apiVersion: v1\nkind: Config\n"
	cfg, err := parse(t, c)
	assert.NilError(t, err)
	assert.Check(t, is.Len(cfg.Warnings(day("2026-12-02"), secret), 0), "a secret kubeconfig")
	got := cfg.Warnings(day("2026-12-02"), func(string) bool { return false })
	assert.Assert(t, is.Len(got, 1), "%v", got)
	assert.Check(t, is.Contains(got[0], "dynk8s:kubernetes.kubeconfig: the on-prem cluster's admin kubeconfig is stored in the clear"))
	assert.Check(t, is.Contains(got[0], "pulumi config set --secret --path 'dynk8s:kubernetes.kubeconfig'"))
}

package kube

import (
	"strconv"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestParseArch(t *testing.T) {
	for _, a := range Arches {
		got, err := ParseArch(string(a))
		assert.NilError(t, err)
		assert.Equal(t, got, a)
	}
	_, err := ParseArch("aarch64")
	assert.ErrorContains(t, err, "EC2 names")
	_, err = ParseArch("riscv64")
	assert.ErrorContains(t, err, "not x86_64 or arm64")
	assert.Equal(t, ArchX86_64.Label(), "amd64")
	assert.Equal(t, ArchArm64.Label(), "arm64")
	assert.Equal(t, ArchArm64.Fedora(), "aarch64")
	assert.Equal(t, ArchX86_64.Fedora(), "x86_64")
}

// TestCheckKey follows IsKubeletLabel (k8s.io/kubelet pkg/apis/well_known_labels.go): subdomains of the allowed
// namespaces pass, as do the beta arch/os keys; everything else in kubernetes.io and k8s.io is refused.
func TestCheckKey(t *testing.T) {
	for _, ok := range []string{
		"example.com/role", "plain", "node.kubernetes.io/role", "a.node.kubernetes.io/x", "x.kubelet.kubernetes.io/y",
		"kubelet.kubernetes.io/z", "beta.kubernetes.io/arch", "kubernetes.io/arch", "topology.kubernetes.io/zone",
		"kubernetes.io.example.com/x",
	} {
		assert.Check(t, CheckKey(ok), ok)
	}
	for key, msg := range map[string]string{
		"kubernetes.io/role":             "NodeRestriction",
		"example.k8s.io/x":               "NodeRestriction",
		"node-role.kubernetes.io/worker": "node-role",
		"Example.com/x":                  "DNS subdomain",
		"example.com/-x":                 "name part",
		"":                               "name part",
	} {
		assert.Check(t, is.ErrorContains(CheckKey(key), msg), key)
	}
}

func TestCheckValue(t *testing.T) {
	assert.Check(t, CheckValue(""))
	assert.Check(t, CheckValue("a.b-c_d"))
	assert.Check(t, is.ErrorContains(CheckValue("a,b=c"), "label value"))
	assert.Check(t, is.ErrorContains(CheckValue(string(make([]byte, 64))), "label value"))
}

func TestSortedTaints(t *testing.T) {
	a := Taint{Key: "a", Effect: NoSchedule}
	b := Taint{Key: "b", Value: "x", Effect: NoExecute}
	assert.DeepEqual(t, SortedTaints([]Taint{b, a}, []Taint{a}), []Taint{a, b})
	assert.Equal(t, b.String(), "b=x:NoExecute")
	assert.Equal(t, a.String(), "a:NoSchedule")
	_, err := ParseTaintEffect("NoSchedulle")
	assert.ErrorContains(t, err, "must be NoSchedule")
}

func TestParseVersion(t *testing.T) {
	v, err := ParseVersion("1.34.4")
	assert.NilError(t, err)
	assert.Equal(t, v, Version{1, 34, 4})
	assert.Equal(t, v.String(), "1.34.4")
	for _, bad := range []string{"v1.34.4", "1.34", "1.034.4", "1.34.x", "1.34.4-rc.1", ""} {
		_, err := ParseVersion(bad)
		assert.Check(t, is.ErrorContains(err, "exact version"), bad)
	}
}

// TestMinors checks the table's own consistency: ascending, one row per minor, each autoscaler release of its row's
// minor, and a CRI-O stream and pause image on every row.
func TestMinors(t *testing.T) {
	for i, m := range Minors {
		if i > 0 {
			assert.Equal(t, m.Minor, Minors[i-1].Minor+1, "rows are consecutive minors")
		}
		assert.Check(t, m.Pause != "" && m.CRIO != "", m)
		if m.Autoscaler != "" {
			v, err := ParseVersion(m.Autoscaler)
			assert.NilError(t, err)
			assert.Equal(t, v.Minor, m.Minor, "autoscaler release of row 1.%d", m.Minor)
		}
	}
	assert.Equal(t, Minors[0].Minor, 31, "v1beta4 JoinConfiguration needs 1.31")
}

func TestAutoscalerVersion(t *testing.T) {
	for _, m := range Minors {
		k8s := Version{1, m.Minor, 0}
		v, err := AutoscalerVersion(k8s, "")
		if m.Autoscaler == "" {
			assert.Check(t, is.ErrorContains(err, "no Cluster Autoscaler release is known"))
			continue
		}
		assert.NilError(t, err)
		assert.Equal(t, v.String(), m.Autoscaler)
	}
	last := Minors[len(Minors)-1]
	v, err := AutoscalerVersion(Version{1, last.Minor, 1}, "1."+strconv.Itoa(last.Minor)+".0")
	assert.NilError(t, err, "an override names a release the table does not know yet")
	assert.Equal(t, v.Minor, last.Minor)
	_, err = AutoscalerVersion(Version{1, 34, 4}, "1.33.6")
	assert.ErrorContains(t, err, "must be the control plane's, which is the nodes' (1.34) or up to three minors newer")
	_, err = AutoscalerVersion(Version{1, 34, 4}, "1.38.0")
	assert.ErrorContains(t, err, "up to three minors newer")
	v, err = AutoscalerVersion(Version{1, 34, 4}, "1.35.2")
	assert.NilError(t, err, "nodes that trail the control plane by a minor")
	assert.Equal(t, v.Minor, 35)
	_, err = AutoscalerVersion(Version{1, 30, 4}, "")
	assert.ErrorContains(t, err, "not supported")
	_, err = AutoscalerVersion(Version{1, 34, 4}, "v1.34.5")
	assert.ErrorContains(t, err, "exact version")
}

// TestIsDNSSubdomain: the one DNS-name rule: lower-case RFC 1123 labels of at most 63, at most 253 in all.
func TestIsDNSSubdomain(t *testing.T) {
	long := strings.Repeat("a", 63)
	for name, want := range map[string]bool{
		"corp.example.com": true, "a": true, "a-b.c0": true, long + ".example": true,
		strings.Repeat(long+".", 3) + strings.Repeat("a", 61): true,  // 253
		strings.Repeat(long+".", 3) + strings.Repeat("a", 62): false, // 254
		long + "a.example": false, "": false, "Corp.example.com": false, "-a.example": false, "a-.example": false,
		"a..example": false, "example.com.": false, "~corp": false, "a_b": false,
	} {
		assert.Check(t, IsDNSSubdomain(name) == want, "IsDNSSubdomain(%q) = %v", name, !want)
	}
}

// TestEveryNodeLabel: the one list of the labels every pool node carries has each once, and SetOnEveryNode and
// SetByBoot read it.
func TestEveryNodeLabel(t *testing.T) {
	seen := map[string]bool{}
	for _, l := range EveryNode {
		assert.Check(t, !seen[l.Key], "%s listed twice", l.Key)
		seen[l.Key] = true
		assert.Check(t, SetOnEveryNode(l.Key))
	}
	assert.Check(t, !SetOnEveryNode("example.com/team"))
	assert.DeepEqual(t, SetByBoot(), []string{LabelInstanceType, LabelRegion, LabelZone})
}

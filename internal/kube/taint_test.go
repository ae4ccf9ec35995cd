package kube

import (
	"fmt"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// A pool's taints: a key in a namespace a kubelet may not label passes (NodeRestriction admits any taint at
// registration: plugin/pkg/admission/noderestriction/admission.go refuses only changes to them), an empty key or
// effect, a bad value and a key:effect twice are each one problem at their field.
func TestCheckTaints(t *testing.T) {
	ok := []Taint{{Key: "node-role.kubernetes.io/ci", Effect: NoSchedule}, {Key: "dedicated", Value: "ci", Effect: NoExecute},
		{Key: "dedicated", Value: "ci", Effect: NoSchedule}}
	assert.Check(t, is.Len(CheckTaints(ok), 0))
	got := CheckTaints([]Taint{{Effect: NoSchedule}, {Key: "a", Value: "x y", Effect: "NoRun"}, {Key: "b"},
		{Key: "a", Effect: "NoRun"}})
	var lines []string
	for _, p := range got {
		lines = append(lines, fmt.Sprintf("%d.%s: %v", p.Index, p.Field, p.Err))
	}
	assert.Check(t, is.DeepEqual(lines, []string{
		"0.key: is required",
		`1.value: "x y" is not a label value (at most 63 characters: letters, digits, '-', '_', '.')`,
		`1.effect: "NoRun" must be NoSchedule, PreferNoSchedule or NoExecute`,
		"2.effect: is required: NoSchedule, PreferNoSchedule or NoExecute",
		`3.effect: "NoRun" must be NoSchedule, PreferNoSchedule or NoExecute`,
		"3.key: taint a:NoRun is already taints[1]",
	}))
}

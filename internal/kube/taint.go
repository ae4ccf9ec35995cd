package kube

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// TaintEffect is what a taint does to pods that do not tolerate it.
type TaintEffect string

// The taint effects (k8s.io/api/core/v1 TaintEffect).
const (
	NoSchedule       TaintEffect = "NoSchedule"
	PreferNoSchedule TaintEffect = "PreferNoSchedule"
	NoExecute        TaintEffect = "NoExecute"
)

// ParseTaintEffect accepts exactly the three effects.
func ParseTaintEffect(s string) (TaintEffect, error) {
	switch e := TaintEffect(s); e {
	case NoSchedule, PreferNoSchedule, NoExecute:
		return e, nil
	}
	return "", fmt.Errorf("%q must be NoSchedule, PreferNoSchedule or NoExecute", s)
}

// Taint is a node taint. Its JSON form is the Kubernetes one; the key tags name its config keys.
type Taint struct {
	// Key is the taint's key, a label key such as dedicated or example.com/gpu.
	Key string `json:"key" key:"key" required:"true"`
	// Value is the taint's value.
	Value string `json:"value,omitempty" key:"value"`
	// Effect is NoSchedule, PreferNoSchedule or NoExecute.
	Effect TaintEffect `json:"effect" key:"effect" required:"true"`
}

// String is the kubectl form, key=value:effect (key:effect without a value).
func (t Taint) String() string {
	if t.Value == "" {
		return t.Key + ":" + string(t.Effect)
	}
	return t.Key + "=" + t.Value + ":" + string(t.Effect)
}

// SortedTaints returns the distinct taints of ts, ordered by key, value and effect: the one order every rendered
// list of taints or tolerations uses, so the same config renders the same bytes.
func SortedTaints(ts ...[]Taint) []Taint {
	var out []Taint
	for _, list := range ts {
		out = append(out, list...)
	}
	slices.SortFunc(out, func(a, b Taint) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Value, b.Value), cmp.Compare(a.Effect, b.Effect))
	})
	return slices.Compact(out)
}

// AutoscalerStartupTaintPrefix marks a taint the Cluster Autoscaler treats as "this node is still starting": a node
// that carries one counts as unready (a scale-up on its way, not a node that lacks what pending pods need), and the
// taint is left off template nodes (utils/taints/taints.go in kubernetes/autoscaler at cluster-autoscaler-1.34.5).
const AutoscalerStartupTaintPrefix = "startup-taint.cluster-autoscaler.kubernetes.io/"

// FuseStartupTaint is the taint dynk8s nodes register with while the fuse device plugin has not yet advertised
// FuseResource; the plugin's pod removes it once the node offers the resource.
var FuseStartupTaint = Taint{Key: AutoscalerStartupTaintPrefix + "fuse", Value: "pending", Effect: NoSchedule}

// CheckTaintKey says why key cannot be a taint key, or returns nil: a qualified name. Unlike labels, a kubelet may
// register its Node with any taint (NodeRestriction only stops it changing them later).
func CheckTaintKey(key string) error {
	return checkQualifiedName(key)
}

// TaintProblem is one thing wrong with one taint of a list: Field is "key", "value" or "effect", for the caller to
// name by its own path.
type TaintProblem struct {
	Index int
	Field string
	Err   error
}

// CheckTaints is the one rule for a pool's taints, which its nodes register with (kubeadm's JoinConfiguration, the
// kubelet's registerWithTaints): each has a key (CheckTaintKey: any qualified name, since NodeRestriction lets a
// kubelet register with any taint and only forbids changing them later), a label value and one of the three
// effects, and no key and effect come twice (the API server refuses a Node with a duplicate taint).
func CheckTaints(ts []Taint) []TaintProblem {
	var out []TaintProblem
	add := func(i int, field string, err error) {
		if err != nil {
			out = append(out, TaintProblem{Index: i, Field: field, Err: err})
		}
	}
	for i, t := range ts {
		if t.Key == "" {
			add(i, "key", errors.New("is required"))
		} else {
			add(i, "key", CheckTaintKey(t.Key))
		}
		add(i, "value", CheckValue(t.Value))
		if t.Effect == "" {
			add(i, "effect", errors.New("is required: NoSchedule, PreferNoSchedule or NoExecute"))
		} else if _, err := ParseTaintEffect(string(t.Effect)); err != nil {
			add(i, "effect", err)
		}
		if j := slices.IndexFunc(ts, func(o Taint) bool { return o.Key == t.Key && o.Effect == t.Effect }); j < i {
			add(i, "key", fmt.Errorf("taint %s:%s is already taints[%d]", t.Key, t.Effect, j))
		}
	}
	return out
}

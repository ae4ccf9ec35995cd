package config

import (
	"testing"

	"gotest.tools/v3/assert"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// TestTemplateCarriesEveryNodeLabel: the autoscaler's template node of a pool carries each label of kube.EveryNode
// that a real node gets and the autoscaler does not set itself, so a label added there reaches the group's tags or
// fails here.
func TestTemplateCarriesEveryNodeLabel(t *testing.T) {
	p := NodePool{Name: "builders", Arch: kube.ArchArm64, InstanceTypes: []string{"c7g.2xlarge"}, Spot: true}
	labels := p.templateLabels("eu-central-1")
	for _, l := range kube.EveryNode {
		_, ok := labels[l.Key]
		assert.Check(t, ok != l.NotOnTemplate, "%s: on the template %v, NotOnTemplate %v", l.Key, ok, l.NotOnTemplate)
	}
}

package config

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
)

// Cluster Autoscaler tag keys: auto-discovery (--node-group-auto-discovery=asg:tag=...) and the node-template tags
// it builds a group's template node from when the group is at zero (kubernetes/autoscaler
// cluster-autoscaler/cloudprovider/aws/README.md, "Auto-Discovery Setup" and "Scaling a node group to 0").
const (
	autoscalerTagPrefix     = "k8s.io/cluster-autoscaler/"
	AutoscalerEnabledTag    = autoscalerTagPrefix + "enabled"
	nodeTemplateLabelTag    = autoscalerTagPrefix + "node-template/label/"
	nodeTemplateTaintTag    = autoscalerTagPrefix + "node-template/taint/"
	nodeTemplateResourceTag = autoscalerTagPrefix + "node-template/resources/"
	nodeTemplateOptionTag   = autoscalerTagPrefix + "node-template/autoscaling-options/"
	// maxGroupTags is the EC2 Auto Scaling limit of tags per group.
	maxGroupTags = 50
)

// Tag is one AWS tag; PropagateAtLaunch copies a group's tag to the instances it launches.
type Tag struct {
	Key               string
	Value             string
	PropagateAtLaunch bool
}

// AutoscalerClusterTag is the tag key that ties a group to one cluster; its value is "owned", and the Cluster
// Autoscaler's IAM policy allows writes only on groups carrying it.
func AutoscalerClusterTag(clusterName string) string { return autoscalerTagPrefix + clusterName }

// IdentityTags are the tags that name a resource of the stack: Name, and the cluster and pool (when not "") it
// belongs to. Every tagged resource carries them, so two stacks in one account can be told apart.
func IdentityTags(clusterName, pool, name string) []Tag {
	tags := []Tag{{Key: "Name", Value: name}, {Key: names.TagCluster, Value: clusterName}}
	if pool != "" {
		tags = append(tags, Tag{Key: names.TagPool, Value: pool})
	}
	return tags
}

// NodeLabels are the labels a pool's nodes set on themselves at join, besides the per-instance ones the node agent
// adds (zone, region, instance type): the pool's own labels plus dynk8s's pool and capacity-type labels.
func (p NodePool) NodeLabels() map[string]string {
	labels := maps.Clone(p.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[kube.LabelPool] = p.Name
	labels[kube.LabelCapacityType] = kube.CapacityOnDemand
	if p.Spot {
		labels[kube.LabelCapacityType] = kube.CapacitySpot
	}
	return labels
}

// templateLabels are the labels the Cluster Autoscaler's template node of the pool must carry to match real nodes:
// the pool's labels and every label of kube.EveryNode but those the autoscaler sets itself (NotOnTemplate: the zone,
// since a pool spans several zones and the autoscaler derives it from the group).
func (p NodePool) templateLabels(region string) map[string]string {
	labels := p.NodeLabels()
	for _, l := range kube.EveryNode {
		if v, ok := p.templateLabel(l.Key, region); ok && !l.NotOnTemplate {
			labels[l.Key] = v
		}
	}
	return labels
}

// templateLabel is the value a real node of the pool gets for one of kube.EveryNode's labels, as far as the group
// knows it (the pool's own labels, NodeLabels, are already in place).
func (p NodePool) templateLabel(key, region string) (string, bool) {
	switch key {
	case kube.LabelArch:
		return p.Arch.Label(), true
	case kube.LabelOS:
		return "linux", true
	case kube.LabelRegion:
		return region, true
	case kube.LabelInstanceType:
		// The autoscaler sizes a group by its first instance type; the label follows the same choice.
		if len(p.InstanceTypes) > 0 {
			return p.InstanceTypes[0], true
		}
	case kube.LabelPool, kube.LabelCapacityType:
		v, ok := p.NodeLabels()[key]
		return v, ok
	}
	return "", false
}

// Estimates of what a node of a pool really reports as allocatable, below the nominal size of its type, for the
// autoscaler's template node (it takes the nominal size as allocatable, kubernetes/autoscaler#2809; a pod sized
// between the two would make it add node after node). kubeadm's kubelet reserves no cpu or memory and evicts below
// 100Mi of memory and 10% of the node filesystem (the kubelet's evictionHard defaults).
const (
	// memoryHeldBack is the share of nominal memory the kernel and firmware keep (MemTotal on EC2 is 2-6% short).
	memoryHeldBack  = 0.07
	evictionMemMiB  = 100
	evictionFsShare = 0.10
	// diskHeldBackGiB is the root volume the OS, the boot partitions and the pulled images take.
	diskHeldBackGiB = 10
)

// tagCountShape stands in for a pool's first instance type where validation counts and measures the group's tags
// before EC2 has been asked: the cpu and memory tags exist for every real type, and their values are short.
var tagCountShape = InstanceType{VCPU: 1, MemoryMiB: 1024}

// templateResources are the cpu, memory and ephemeral-storage a node of the pool offers pods, by resource name;
// shape is what EC2 says of the pool's first instance type (no cpu or memory when unknown).
func (p NodePool) templateResources(shape InstanceType) map[string]string {
	out := map[string]string{}
	heldBack := diskHeldBackGiB
	if shape.VCPU > 0 {
		out["cpu"] = strconv.Itoa(shape.VCPU)
		out["memory"] = strconv.Itoa(int(float64(shape.MemoryMiB)*(1-memoryHeldBack))-evictionMemMiB) + "Mi"
		if p.WarmPool != nil && p.WarmPool.State == WarmHibernated {
			// Hibernation writes the RAM to the root volume: that much of it is not the pods'.
			heldBack += ceilGiB(shape.MemoryMiB)
		}
	}
	if disk := float64(p.VolumeSizeGiB-heldBack) * (1 - evictionFsShare); disk >= 1 {
		out["ephemeral-storage"] = strconv.Itoa(int(disk)) + "Gi"
	}
	return out
}

// GroupTags are all tags of a pool's Auto Scaling Group, sorted by key: the identity tags (propagated to
// instances), the two auto-discovery tags and the node-template tags that let the autoscaler scale the group up
// from zero for pods that need the pool's labels, tolerate its taints, or request github.com/fuse or ephemeral storage,
// sized as a real node is (templateResources). shape is what EC2 says of the pool's first instance type, which the
// autoscaler sizes the group by.
func (c *Config) GroupTags(p NodePool, shape InstanceType) []Tag {
	tags := IdentityTags(c.ClusterName, p.Name, c.ClusterName+"-"+p.Name)
	for i := range tags {
		tags[i].PropagateAtLaunch = true
	}
	tags = append(tags,
		Tag{Key: AutoscalerEnabledTag, Value: "true"},
		Tag{Key: AutoscalerClusterTag(c.ClusterName), Value: "owned"},
	)
	labels := p.templateLabels(c.Region)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		tags = append(tags, Tag{Key: nodeTemplateLabelTag + k, Value: labels[k]})
	}
	for _, t := range p.Taints {
		tags = append(tags, Tag{Key: nodeTemplateTaintTag + t.Key, Value: t.Value + ":" + string(t.Effect)})
	}
	resources := p.templateResources(shape)
	if c.Fuse.Enabled {
		resources[kube.FuseResource] = strconv.Itoa(c.Fuse.Capacity)
	}
	for _, name := range slices.Sorted(maps.Keys(resources)) {
		tags = append(tags, Tag{Key: nodeTemplateResourceTag + name, Value: resources[name]})
	}
	if d := p.Autoscaling.ScaleDownUnneededTime; d != nil {
		tags = append(tags, Tag{Key: nodeTemplateOptionTag + "scaledownunneededtime", Value: d.String()})
	}
	if u := p.Autoscaling.ScaleDownUtilizationThreshold; u != nil {
		tags = append(tags, Tag{Key: nodeTemplateOptionTag + "scaledownutilizationthreshold",
			Value: strconv.FormatFloat(*u, 'f', -1, 64)})
	}
	slices.SortFunc(tags, func(a, b Tag) int { return strings.Compare(a.Key, b.Key) })
	return tags
}

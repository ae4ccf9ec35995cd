package infra

import (
	"sort"
	"strconv"
)

// Cluster Autoscaler tag keys (domain facts 1.1, 1.2).
const (
	caTagPrefix            = "k8s.io/cluster-autoscaler/"
	caTagEnabled           = caTagPrefix + "enabled"
	caNodeTemplateLabel    = caTagPrefix + "node-template/label/"
	caNodeTemplateTaint    = caTagPrefix + "node-template/taint/"
	caNodeTemplateResource = caTagPrefix + "node-template/resources/"
	// FuseResource is the extended resource the fuse device plugin advertises.
	FuseResource = "github.com/fuse"
	// maxASGTags is the EC2 Auto Scaling limit of tags per group.
	maxASGTags = 50
)

// ASGTag is one Auto Scaling Group tag.
type ASGTag struct {
	Key               string
	Value             string
	PropagateAtLaunch bool
}

// CAClusterTag is the tag key that ties an ASG to one cluster; its value is "owned" and the Cluster Autoscaler's
// IAM policy allows writes only on groups carrying it.
func CAClusterTag(clusterName string) string { return caTagPrefix + clusterName }

// PoolNodeLabels are the labels a pool's nodes set on themselves at join, besides the per-instance ones the join
// script adds (zone, region, instance type): the pool's own labels plus dynk8s's pool and capacity-type labels.
func PoolNodeLabels(pool NodePoolConfig) map[string]string {
	labels := make(map[string]string, len(pool.Labels)+2)
	for k, v := range pool.Labels {
		labels[k] = v
	}
	labels[LabelPool] = pool.Name
	labels[LabelCapacityType] = CapacityOnDemand
	if pool.Spot {
		labels[LabelCapacityType] = CapacitySpot
	}
	return labels
}

// templateLabels are the labels the Cluster Autoscaler's template node of the pool must carry to match real nodes:
// the kubelet's own labels plus the static ones the join script sets. The zone is left out on purpose: a pool spans
// several zones, and the autoscaler derives the zone of its template node from the group itself.
func templateLabels(region string, pool NodePoolConfig) map[string]string {
	labels := PoolNodeLabels(pool)
	labels["kubernetes.io/arch"] = kubeArch(pool.Arch)
	labels["kubernetes.io/os"] = "linux"
	labels["topology.kubernetes.io/region"] = region
	if len(pool.InstanceTypes) > 0 {
		// The autoscaler sizes a group by its first instance type; the label follows the same choice.
		labels["node.kubernetes.io/instance-type"] = pool.InstanceTypes[0]
	}
	return labels
}

// ASGTags are all tags of a pool's Auto Scaling Group, sorted by key: identification tags (propagated to
// instances), the two auto-discovery tags and the node-template tags that let the autoscaler scale the group up
// from zero for pods that need the pool's labels, tolerate its taints or request github.com/fuse.
func ASGTags(cfg *Config, pool NodePoolConfig) []ASGTag {
	tags := []ASGTag{
		{Key: "Name", Value: cfg.ClusterName + "-" + pool.Name, PropagateAtLaunch: true},
		{Key: "dynk8s:cluster", Value: cfg.ClusterName, PropagateAtLaunch: true},
		{Key: "dynk8s:pool", Value: pool.Name, PropagateAtLaunch: true},
		{Key: caTagEnabled, Value: "true"},
		{Key: CAClusterTag(cfg.ClusterName), Value: "owned"},
	}
	for k, v := range templateLabels(cfg.Region, pool) {
		tags = append(tags, ASGTag{Key: caNodeTemplateLabel + k, Value: v})
	}
	for _, t := range pool.Taints {
		tags = append(tags, ASGTag{Key: caNodeTemplateTaint + t.Key, Value: t.Value + ":" + t.Effect})
	}
	if cfg.Fuse.Enabled {
		tags = append(tags, ASGTag{Key: caNodeTemplateResource + FuseResource, Value: strconv.Itoa(cfg.Fuse.Capacity)})
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i].Key < tags[j].Key })
	return tags
}

// kubeArch maps the EC2/config architecture to the kubernetes.io/arch value.
func kubeArch(arch string) string {
	if arch == "x86_64" {
		return "amd64"
	}
	return arch
}

package infra

// Labels every dynk8s pool node sets on itself through the kubelet's --node-labels (both are outside the
// kubernetes.io/k8s.io namespaces, so NodeRestriction allows them). The in-cluster parts select on them: the
// Cluster Autoscaler stays off nodes with LabelPool, stale-node cleanup only ever deletes nodes with LabelPool, and
// the spot drain handler runs only where LabelCapacityType is CapacitySpot.
const (
	LabelPool         = "dynk8s.io/pool"
	LabelCapacityType = "dynk8s.io/capacity-type"

	CapacitySpot     = "spot"
	CapacityOnDemand = "on-demand"
)

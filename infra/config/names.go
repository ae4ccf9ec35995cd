package config

import (
	"slices"
	"strings"
)

// stackResourceNames are the Name tags (after "<clusterName>-") the stack gives its own resources: the network's,
// the gateway's and the IAM and SSM names. A pool's instances, launch template and group are named
// "<clusterName>-<pool>", so a pool named like one of these would put another resource's Name on its instances: the
// gateway's own Name tag is part of the condition the nodes' wake-up permission checks, and an operator who looks
// the gateway up by Name would find a build node. infra's TestPoolNamesNeverTakeAStackName keeps the list complete.
var stackResourceNames = []string{
	"bake", "cluster-autoscaler", "gateway", "gateway-sg", "igw", "join-token", "join-token-rotator", "node",
	"node-agent", "node-cleanup", "node-sg", "rt", "vpc", "wireguard-gateway", "wireguard-gateway-key",
}

// subnetNamePrefix starts the Name of each zone's subnet: "<clusterName>-subnet-<zone>".
const subnetNamePrefix = "subnet-"

// IsStackResourceName reports whether "<clusterName>-<name>" is the Name of one of the stack's own resources.
func IsStackResourceName(name string) bool {
	return slices.Contains(stackResourceNames, name) || strings.HasPrefix(name, subnetNamePrefix)
}

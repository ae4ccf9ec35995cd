package config

import (
	"maps"
	"slices"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// Resources are a container's CPU and memory, as Kubernetes quantities; an empty one is not set.
type Resources struct {
	CPU, Memory string
}

// Quantities are the set ones, by the resource's name in a container's requests or limits.
func (r Resources) Quantities() map[string]string {
	q := map[string]string{}
	if r.CPU != "" {
		q["cpu"] = r.CPU
	}
	if r.Memory != "" {
		q["memory"] = r.Memory
	}
	return q
}

// The stack's DaemonSets that run on pool nodes (infra/addons declares them with these): their names in
// kube-system and their containers' requests and limits.
const (
	FusePluginName         = "fuse-device-plugin"
	TerminationHandlerName = "aws-node-termination-handler"
)

// The containers' requests and limits of the fuse device plugin and of the termination handler.
//
// The fuse plugin has no CPU limit. A CPU limit is a CFS quota on the container's cgroup and, when every container
// of the pod has one, on the pod's (kubernetes pkg/kubelet/cm/helpers_linux.go, ResourceConfigForPod), and the
// runtime's `runc init` joins the cgroup before it sets the container up (opencontainers/runc
// libcontainer/process_linux.go, initProcess.start: "Do this before syncing with child"): at 50m, 5 ms of CPU
// each 100 ms, the sandbox's and the container's setup and the plugin's own start were throttled on a new node,
// the stretch that holds its build pod (in the box: the sandbox 0.65 s, the container's start 1.0-1.5 s, its
// registration 0.3 s after, against 0.2, 0.1 and 0.01 s without the limit). At rest the plugin waits on its
// kubelet's gRPC stream; its request reserves its share, and the memory limit still bounds it, as kubeadm's CoreDNS
// sets a memory limit and no CPU limit (cmd/kubeadm/app/phases/addons/dns/manifests.go).
var (
	FusePluginRequests         = Resources{CPU: "10m", Memory: "16Mi"}
	FusePluginLimits           = Resources{Memory: "64Mi"}
	TerminationHandlerRequests = Resources{CPU: "50m", Memory: "64Mi"}
	TerminationHandlerLimits   = Resources{CPU: "100m", Memory: "128Mi"}
)

// PoolDaemonSet is one of the stack's DaemonSets whose pods run on pool nodes, as far as the scheduler and the
// Cluster Autoscaler weigh it on a pool's node (the autoscaler counts a DaemonSet's pods on a template node, so
// they take from what a pending pod can have): where it runs and what it requests. infra/addons declares each
// with these values, and a test there compares what it declares with PoolDaemonSets.
type PoolDaemonSet struct {
	// Name is the DaemonSet's, in kube-system.
	Name string
	// NodeSelector is its pods' node selector; each also requires kube.LabelPool to exist (a pool node).
	NodeSelector map[string]string
	// Tolerates are the taints its pods tolerate (with operator Exists for a taint without value, Equal else).
	Tolerates []kube.Taint
	// Requests and Limits are its one container's.
	Requests, Limits Resources
}

// PoolDaemonSets are the stack's DaemonSets on pool nodes: the fuse device plugin per architecture of the pools
// (with fuse; each tolerating its architecture's pools' taints), the termination handler (when enabled; every
// pool's), in name order.
func (c *Config) PoolDaemonSets() []PoolDaemonSet {
	if len(c.NodePools) == 0 {
		return nil
	}
	var out []PoolDaemonSet
	if c.Fuse.Enabled {
		// One per architecture, tolerating the taints of that architecture's pools.
		byArch := map[string][]NodePool{}
		for _, p := range c.NodePools {
			byArch[p.Arch.Label()] = append(byArch[p.Arch.Label()], p)
		}
		for _, arch := range slices.Sorted(maps.Keys(byArch)) {
			out = append(out, PoolDaemonSet{Name: FusePluginName + "-" + arch,
				NodeSelector: map[string]string{kube.LabelArch: arch, kube.LabelOS: "linux"},
				Tolerates:    PoolTolerations(byArch[arch]), Requests: FusePluginRequests, Limits: FusePluginLimits})
		}
	}
	if c.TerminationHandler.Enabled {
		out = append(out, PoolDaemonSet{Name: TerminationHandlerName,
			NodeSelector: map[string]string{kube.LabelOS: "linux"}, Tolerates: PoolTolerations(c.NodePools),
			Requests: TerminationHandlerRequests, Limits: TerminationHandlerLimits})
	}
	slices.SortFunc(out, func(a, b PoolDaemonSet) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// PoolTolerations are the taints the stack's pool DaemonSets tolerate: every pool's and the fuse startup taint
// (the plugin's pod must run on a node before its startup taint is lifted), each once, sorted.
func PoolTolerations(pools []NodePool) []kube.Taint {
	all := [][]kube.Taint{{kube.FuseStartupTaint}}
	for _, p := range pools {
		all = append(all, p.Taints)
	}
	return kube.SortedTaints(all...)
}

package kube

import "time"

// JoinTimeout is how long a node's boot may take to prepare and join: the join unit's hard timeout, which backs up
// the boot's own 12-minute deadline. The Cluster Autoscaler's --max-node-provision-time must exceed it, or the
// autoscaler gives up on nodes that would still join; a launch lifecycle hook's heartbeat must outlast it. Here,
// in the leaf, so that the config's validation and the node's renderer read the same value without one importing
// the other.
const JoinTimeout = 14 * time.Minute

// MaxDNSServers is what a resolv.conf holds (glibc's MAXNS); the kubelet hands pods with dnsPolicy Default the
// first three servers of the node's resolver list and drops the rest.
const MaxDNSServers = 3

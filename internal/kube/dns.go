package kube

// MaxDNSServers is what a resolv.conf holds (glibc's MAXNS); the kubelet hands pods with dnsPolicy Default the
// first three servers of the node's resolver list and drops the rest.
const MaxDNSServers = 3

package cloudinit

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// The node's host settings beyond the join itself: what kubeadm patches into the kubelet's configuration, and (in
// the files below) the node's DNS, routes and metadata lockdown. Each is a file of its own and, where something must
// run, a unit of its own, so join.sh stays about the join.

// kubeadmPatchDir is the JoinConfiguration's patches.directory: under /etc/kubernetes, which kubeadm reset leaves
// alone (it removes only its own files there), so a retried join finds the patches again.
const kubeadmPatchDir = "/etc/kubernetes/patches"

// resolvedResolvConf is systemd-resolved's list of the real upstream servers. Fedora resolves through resolved,
// whose /etc/resolv.conf names only the 127.0.0.53 stub, which means nothing inside a pod.
const resolvedResolvConf = "/run/systemd/resolve/resolv.conf"

// kubeletPatch is a JSON merge patch (RFC 7386) of the node's KubeletConfiguration: the per-node settings that the
// cluster's kubelet-config ConfigMap would otherwise decide. kubeadm join applies it (target kubeletconfiguration,
// `kubeadm join --help` at v1.31 and later) to the config it writes to /var/lib/kubelet/config.yaml. A merge patch,
// not kubeadm's default strategic one: KubeletConfiguration is not a type with strategic-merge metadata.
//
// resolvConf: kubeadm picks resolved's file itself only when the cluster's kubelet-config leaves resolvConf unset
// (cmd/kubeadm/app/componentconfigs/kubelet.go, mutateResolverConfig); a cluster initialised on a host without
// resolved may pin /etc/resolv.conf, which on Fedora hands pods with dnsPolicy Default the unusable stub.
type kubeletPatch struct {
	ResolvConf string `json:"resolvConf"`
}

// hostFiles are the node's files beyond the join's own.
func hostFiles(in NodeInput) ([]writeFile, error) {
	patch, err := yaml.Marshal(kubeletPatch{ResolvConf: resolvedResolvConf})
	if err != nil {
		return nil, fmt.Errorf("kubelet patch: %w", err)
	}
	_ = in
	return []writeFile{
		{Path: kubeadmPatchDir + "/kubeletconfiguration+merge.yaml", Content: string(patch), Permissions: "0644"},
	}, nil
}

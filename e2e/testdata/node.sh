#!/usr/bin/env bash
# The node of TestKubeletJoin: run by the test in new network, mount and UTS namespaces (unshare), it plays the parts
# of an EC2 instance that the agent does not: the instance's network interface and hostname, containerd listening
# where CRI-O would (the socket the rendered JoinConfiguration names), and the kubelet unit that the kubeadm drop-in
# of the kubelet package starts (there is no systemd here). The agent itself is run by the test, through nsenter.
#
# Everything it mounts lives and dies with its mount namespace: /etc/kubernetes is NODE_ETC_KUBERNETES (the
# etc/kubernetes under the agent's DYNK8S_ROOT, so that its "already joined" check sees what kubeadm wrote),
# /var/lib/kubelet and /run/crio are directories under NODE_DIR (the mount points must exist on the host). It
# stops containerd and the kubelet on SIGTERM and exits when both have.
set -euo pipefail
: "${NODE_DIR:?}" "${NODE_ETC_KUBERNETES:?}" "${NODE_IP:?}" "${NODE_HOSTNAME:?}" "${KUBELET_WAIT_SECONDS:?}"
d=$NODE_DIR

# The instance's interface with its private IP (the kubelet checks that --node-ip is local). No dummy driver in
# every kernel: a veth pair whose two ends both stay in this namespace.
ip link set lo up
ip link add eth0 type veth peer name eth1
ip addr add "$NODE_IP/24" dev eth0
ip link set eth0 up
ip link set eth1 up
# What the join unit's sysctl step sets on a node (kubeadm's preflight checks it); this namespace's own value.
sysctl -qw net.ipv4.ip_forward=1
hostname "$NODE_HOSTNAME"
# The instance's own name resolves locally, as EC2's resolver would answer it; kubeadm's preflight looks it up, and
# this namespace has no route to any name server.
printf '127.0.0.1 localhost\n%s %s\n' "$NODE_IP" "$NODE_HOSTNAME" >"$d/hosts"

mount --bind "$NODE_ETC_KUBERNETES" /etc/kubernetes
mount --bind "$d/var-lib-kubelet" /var/lib/kubelet
mount --bind "$d/run-crio" /run/crio
mount --bind "$d/hosts" /etc/hosts
# The kubelet writes /var/log/pods and /var/log/containers whatever its config says.
mount -t tmpfs tmpfs /var/log

containerd --config "$d/containerd.toml" >"$d/containerd.log" 2>&1 &
containerd_pid=$!

# What the kubelet package's kubeadm drop-in (10-kubeadm.conf) runs once `kubeadm join` has written its files.
(
  deadline=$((SECONDS + KUBELET_WAIT_SECONDS))
  until [[ -f /var/lib/kubelet/config.yaml && -f /var/lib/kubelet/kubeadm-flags.env &&
    -f /etc/kubernetes/bootstrap-kubelet.conf ]]; do
    ((SECONDS < deadline)) || { echo "node.sh: kubeadm wrote no kubelet files in $KUBELET_WAIT_SECONDS s" >&2; exit 1; }
    sleep 0.2
  done
  # shellcheck disable=SC1091
  . /var/lib/kubelet/kubeadm-flags.env
  # shellcheck disable=SC2086 # KUBELET_KUBEADM_ARGS is a list of flags, as systemd splits it
  exec kubelet --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
    --kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml $KUBELET_KUBEADM_ARGS
) >"$d/kubelet.log" 2>&1 &
kubelet_pid=$!

stop() {
  kill -TERM "$kubelet_pid" "$containerd_pid" 2>/dev/null || true
}
trap stop TERM INT
: >"$d/ready"
wait "$kubelet_pid" "$containerd_pid" || true
# wait returns early on a trapped signal: wait again for both to be gone.
wait || true

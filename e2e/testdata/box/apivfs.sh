#!/usr/bin/env bash
# Run by dynk8s-box-apivfs.service (see there).
set -euo pipefail
: "${BOX_CGROUP_ROOT:?}"
mount --bind /proc/sys/net /proc/sys/net
mount -o remount,bind,rw /proc/sys/net
for d in /sys/fs/cgroup/*/; do
  c=$(basename "$d")
  if [[ $c == unified ]] || ! mountpoint -q "$d"; then continue; fi
  # name=systemd is the box's own, and writable; the kubelet wants its cgroup root in every hierarchy.
  [[ $c == systemd ]] || mount -o remount,bind,rw "$d"
  mkdir -p "$d$BOX_CGROUP_ROOT"
done
# The kubelet sets kernel-wide settings when they differ from its own (pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables), and stops when it cannot; a VM's kubelet may, a box's must not change the shared host's. The
# box's view shows them as a kubelet leaves them (the others it checks already have its values here).
for kv in vm/overcommit_memory=1 kernel/panic=10 kernel/panic_on_oops=1; do
  f=/run/dynk8s-box/sysctl/${kv%%=*}
  mkdir -p "${f%/*}"
  echo "${kv#*=}" >"$f"
  mount --bind "$f" "/proc/sys/${kv%%=*}"
done

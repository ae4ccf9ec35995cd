#!/usr/bin/env bash
# Joins this EC2 instance to the on-prem cluster with kubeadm; run at first boot by dynk8s-join.service.
# On a node that already joined it does nothing. Every network step retries under one deadline (default 12 min, well
# inside the Cluster Autoscaler's 15 min max-node-provision-time); on failure it logs one reason and exits 1.
# Test hooks: DYNK8S_ROOT prefixes /etc and /run, DYNK8S_JOIN_ENV names the config, and lib.sh's endpoints.
set -euo pipefail
umask 077
LOG_TAG=dynk8s-join
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

etc=$DYNK8S_ROOT/etc
run_dir=$DYNK8S_ROOT/run/dynk8s
join_config=$run_dir/kubeadm-join.yaml

if [[ -e $etc/kubernetes/kubelet.conf ]]; then
  log "already joined ($etc/kubernetes/kubelet.conf exists); nothing to do"
  exit 0
fi
load_env "${DYNK8S_JOIN_ENV:-$etc/dynk8s/join.env}" DYNK8S_API_SERVER_ENDPOINT DYNK8S_CLUSTER_NAME \
  DYNK8S_JOIN_TOKEN_PARAMETER DYNK8S_PACKAGES DYNK8S_POOL_NAME DYNK8S_REPOS DYNK8S_SYSTEM_PACKAGES \
  DYNK8S_SYSTEM_REPOS
deadline_start 720
INSTANCE_ID='' ZONE='' REGION='' NODE_IP='' INSTANCE_TYPE='' TOKEN=''
trap 'rm -f "$join_config"' EXIT
log "joining pool $DYNK8S_POOL_NAME to cluster $DYNK8S_CLUSTER_NAME at $DYNK8S_API_SERVER_ENDPOINT"

identity() {
  imds INSTANCE_ID meta-data/instance-id && imds ZONE meta-data/placement/availability-zone &&
    imds REGION meta-data/placement/region && imds NODE_IP meta-data/local-ipv4 &&
    imds INSTANCE_TYPE meta-data/instance-type
}

# expect NAME REGEX: the runtime values go into YAML unquoted, so each must match its strict form.
expect() {
  [[ ${!1} =~ $2 ]] || fail "IMDS returned an unexpected $1: '${!1}'"
}

# One dnf transaction with only the repos it needs: the upstream Kubernetes and CRI-O repos (small metadata), plus
# Fedora's (tens of MB of metadata) when the image lacks a system dependency such as container-selinux, or when an
# attempt without them failed (a dependency the packages gained that the image does not have).
WITH_FEDORA=0
install_packages() {
  local -a repos pkgs sys fedora args=()
  local p r rc=0
  IFS=, read -ra repos <<<"$DYNK8S_REPOS"
  IFS=, read -ra pkgs <<<"$DYNK8S_PACKAGES"
  IFS=, read -ra sys <<<"$DYNK8S_SYSTEM_PACKAGES"
  for p in "${sys[@]}"; do
    rpm -q --whatprovides "$p" >/dev/null 2>&1 || { pkgs+=("$p") && WITH_FEDORA=1; }
  done
  if ((WITH_FEDORA)); then IFS=, read -ra fedora <<<"$DYNK8S_SYSTEM_REPOS" && repos+=("${fedora[@]}"); fi
  for r in "${repos[@]}"; do args+=("--repo=$r"); done
  set_timeout 0
  timeout -k 10 "$TMO" dnf install -y --setopt=install_weak_deps=False "${args[@]}" "${pkgs[@]}" || rc=$?
  ((rc == 0)) && return 0
  LAST_ERROR="dnf install exited $rc"
  if ((!WITH_FEDORA)); then
    WITH_FEDORA=1
    LAST_ERROR+="; the next attempt adds Fedora's repositories"
  fi
  return 1
}

token() {
  ssm_parameter TOKEN "$DYNK8S_JOIN_TOKEN_PARAMETER" "$REGION"
}

# -k: this only proves that the tunnel and the API server answer (any HTTP status); kubeadm then pins the CA by hash.
api_server() {
  set_timeout 10
  fetch "" -k -o /dev/null --max-time "$TMO" "https://$DYNK8S_API_SERVER_ENDPOINT/readyz" || return 1
  log "API server answered HTTP $STATUS"
}

render() {
  local t v
  t=$(<"$etc/dynk8s/kubeadm-join.yaml.tmpl") || fail "cannot read $etc/dynk8s/kubeadm-join.yaml.tmpl"
  for v in TOKEN NODE_IP INSTANCE_ID INSTANCE_TYPE REGION ZONE DYNK8S_ROOT; do t=${t//@@$v@@/"${!v}"}; done
  [[ $t != *@@* ]] || fail "kubeadm-join.yaml.tmpl has a placeholder this script does not know"
  mkdir -p "$run_dir"
  printf '%s\n' "$t" >"$join_config"
}

join() {
  local rc=0
  set_timeout 0
  timeout -k 10 "$TMO" kubeadm join --config "$join_config" || rc=$?
  ((rc == 0)) && return 0
  LAST_ERROR="kubeadm join exited $rc (its output is above)"
  # A failed join leaves files that fail the next attempt's preflight checks.
  set_timeout 60
  timeout -k 5 "$TMO" kubeadm reset --force >/dev/null 2>&1 || log "kubeadm reset after the failed join failed too"
  return 1
}

retry "read instance identity from IMDS" identity
expect INSTANCE_ID '^i-[0-9a-f]{8}([0-9a-f]{9})?$'
expect ZONE '^[a-z]{2}(-[a-z0-9]+)+$'
expect REGION '^[a-z]{2}(-[a-z]+)+-[0-9]+$'
expect NODE_IP '^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}$'
expect INSTANCE_TYPE '^[a-z0-9-]+\.[a-z0-9-]+$'
log "instance $INSTANCE_ID ($INSTANCE_TYPE) in $ZONE, node IP $NODE_IP"

retry "install $DYNK8S_PACKAGES" install_packages
# CRI-O's package ships a bridge CNI config that would give every node the same pod range; the cluster CNI owns it.
rm -f -- "$etc"/cni/net.d/*crio*bridge*.conflist
systemctl enable --now crio.service || fail "crio.service did not start (journalctl -u crio)"
systemctl enable kubelet.service || fail "could not enable kubelet.service"

retry "read the join token from SSM parameter $DYNK8S_JOIN_TOKEN_PARAMETER" token
[[ $TOKEN =~ ^[a-z0-9]{6}\.[a-z0-9]{16}$ ]] ||
  fail "SSM parameter $DYNK8S_JOIN_TOKEN_PARAMETER does not hold a bootstrap token ([a-z0-9]{6}.[a-z0-9]{16})"

retry "reach the API server at $DYNK8S_API_SERVER_ENDPOINT" api_server
render
retry "kubeadm join" join
log "joined the cluster as $INSTANCE_ID"

#!/usr/bin/env bash
# Boots this EC2 instance into the on-prem cluster in two phases: prepare (kernel modules, packages, CRI-O, image
# pre-pull: nothing that needs the cluster) and join (join token, API server probe, kubeadm join). dynk8s-join.service
# runs it at every boot until the node has joined; the Auto Scaling target lifecycle state in IMDS picks the phases:
#   Warmed:*   the instance is entering a warm pool: prepare, complete the launch lifecycle action, and let the group
#              stop it (EC2 Auto Scaling user guide, "Use lifecycle hooks with a warm pool");
#   InService  prepare unless an earlier boot did, then join, then complete the launch lifecycle action, which holds
#              the instance in Pending:Wait again when it leaves the warm pool (same guide).
# kops' nodeup does the same (upup/pkg/fi/nodeup/command.go, getAWSConfigurationMode, kubernetes/kops).
# Every network step retries under one deadline (default 12 min, inside the Cluster Autoscaler's 15 min
# max-node-provision-time). On failure it logs one reason and exits 1, and leaves the instance to the autoscaler
# (on_failure says why it is never handed back to its group).
# Each phase is timed; the timeline goes to the log and to /run/dynk8s/timeline.json.
# Test hooks: DYNK8S_ROOT prefixes /etc, /run and /var, DYNK8S_PROC replaces /proc, DYNK8S_JOIN_ENV names the
# config, and lib.sh's endpoints.
set -euo pipefail
LOG_TAG=dynk8s-join
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

etc=$DYNK8S_ROOT/etc
run_dir=$DYNK8S_ROOT/run/dynk8s
prepared_marker=$DYNK8S_ROOT/var/lib/dynk8s/prepared
# warm_marker: this instance has prepared and completed its lifecycle action in the warm pool since it last started.
warm_marker=$DYNK8S_ROOT/run/dynk8s/warm-ready
join_config=$run_dir/kubeadm-join.yaml
proc=${DYNK8S_PROC:-/proc}

if [[ -e $etc/kubernetes/kubelet.conf ]]; then
  log "already joined ($etc/kubernetes/kubelet.conf exists); nothing to do"
  exit 0
fi
load_env "${DYNK8S_JOIN_ENV:-$etc/dynk8s/join.env}" DYNK8S_API_SERVER_ENDPOINT DYNK8S_CLUSTER_NAME \
  DYNK8S_CRI_SOCKET DYNK8S_GATEWAY_INSTANCE_ID DYNK8S_JOIN_TOKEN_PARAMETER DYNK8S_KERNEL_MODULES DYNK8S_LAUNCH_HOOK \
  DYNK8S_PACKAGES DYNK8S_POOL_NAME DYNK8S_PREPULL_IMAGES DYNK8S_REPOS DYNK8S_SYSTEM_PACKAGES DYNK8S_SYSTEM_REPOS \
  DYNK8S_UPDATE_REPOS
deadline_start 720
INSTANCE_ID='' ZONE='' NODE_IP='' INSTANCE_TYPE='' LIFECYCLE='' TOKEN='' GROUP=''
MODE='' RESULT=failed REASON='' PREPULL_PID=''
now_ms START_MS
trap 'finish' EXIT

# finish: runs on every exit. It removes the rendered JoinConfiguration (it holds the token), stops a pre-pull still
# running, and writes the timeline.
finish() {
  [[ $RESULT != waiting ]] || return 0
  rm -f "$join_config"
  if [[ -n $PREPULL_PID ]]; then kill "$PREPULL_PID" 2>/dev/null || true; fi
  phase_cut
  timeline || log "could not write $run_dir/timeline.json"
}

# timeline: one log line with every phase, for `aws ec2 get-console-output` (the kernel log's copy too), and the same
# as JSON.
timeline() {
  local end p line up="" level=5 # up: seconds since boot, now
  now_ms end
  line="timeline: result=$RESULT mode=${MODE:-none} total=$(seconds $((end - START_MS)))s"
  for p in "${PHASES[@]}"; do line+=" ${p%%=*}=$(seconds "${p#*=}")s"; done
  log "$line"
  [[ $RESULT != failed ]] || level=3
  kmsg "$level" "$line"
  if [[ -r $proc/uptime ]]; then up=$(<"$proc/uptime") && up=${up%% *}; fi
  mkdir -p "$run_dir"
  python3 -c '
import json, sys
keys = ("instanceId", "lifecycleState", "mode", "result", "reason", "totalMs", "uptime")
doc = dict(zip(keys, sys.argv[1:8]))
doc["totalSeconds"] = int(doc.pop("totalMs")) / 1000
up = doc.pop("uptime")
doc["startedSecondsAfterBoot"] = round(float(up) - doc["totalSeconds"], 1) if up else None
doc["phases"] = [{"name": n, "seconds": int(ms) / 1000} for n, ms in (a.split("=", 1) for a in sys.argv[8:])]
json.dump(doc, sys.stdout, indent=2, sort_keys=True)
print()
' "$INSTANCE_ID" "$LIFECYCLE" "$MODE" "$RESULT" "$REASON" "$((end - START_MS))" "$up" "${PHASES[@]}" \
    >"$run_dir/timeline.json.new" && mv -f "$run_dir/timeline.json.new" "$run_dir/timeline.json"
}

# on_failure (called by fail): the instance is never handed back to its group (marked Unhealthy, or its lifecycle
# action abandoned) to be replaced. What stops a boot on its deadline (the join token, the tunnel or the API server,
# the package repositories, kubeadm join) is most often a fault every replacement meets too, and an instance the group
# replaces is one the Cluster Autoscaler never times out: each replacement is younger than max-node-provision-time,
# so the autoscaler neither removes it nor lowers the group, and the group replaces instance after instance for as
# long as the pod is pending. Left in place, the instance stays unregistered: the autoscaler then times the scale-up
# out (event ScaleUpTimedOut), backs the group off (5 minutes, doubling up to 30: --initial-node-group-backoff-duration,
# --max-node-group-backoff-duration), tries other groups for the pods meanwhile, and removes the instance once it has
# been unregistered for max-node-provision-time, lowering the desired capacity (cluster-autoscaler,
# clusterstate.updateScaleRequests and static_autoscaler.removeOldUnregisteredNodes). A launch hook's action is
# completed with CONTINUE all the same: its heartbeat would end with the default result, ABANDON, and the group
# would replace the instance just as a hand-back does.
COMPLETING=''
on_failure() {
  RESULT=failed REASON=$1
  phase_cut
  [[ -n $DYNK8S_LAUNCH_HOOK && -n $INSTANCE_ID && -z $COMPLETING ]] || return 0
  COMPLETING=1
  DEADLINE=$((SECONDS + 30))
  if complete_lifecycle CONTINUE; then
    ((NO_ACTION)) || log "completed the lifecycle action of hook $DYNK8S_LAUNCH_HOOK with CONTINUE: the group keeps this instance, and the autoscaler removes it at max-node-provision-time"
  else
    log "could not complete the lifecycle action of hook $DYNK8S_LAUNCH_HOOK: $LAST_ERROR"
  fi
}

identity() {
  imds INSTANCE_ID meta-data/instance-id && imds ZONE meta-data/placement/availability-zone &&
    imds REGION meta-data/placement/region && imds DOMAIN meta-data/services/domain &&
    imds NODE_IP meta-data/local-ipv4 && imds INSTANCE_TYPE meta-data/instance-type && lifecycle_state
}

# lifecycle_state: an instance outside any group has no target lifecycle state (404); without a launch hook that means
# InService. With a hook the group sets it before the instance boots, so it must be there.
lifecycle_state() {
  imds LIFECYCLE meta-data/autoscaling/target-lifecycle-state && return 0
  [[ $STATUS == 404 ]] || return 1
  if [[ -n $DYNK8S_LAUNCH_HOOK ]]; then
    LAST_ERROR+=" (a group with launch hook $DYNK8S_LAUNCH_HOOK sets it)" && return 1
  fi
  LIFECYCLE=InService
  log "IMDS has no target lifecycle state; going on as InService"
}

# expect NAME REGEX: the runtime values go into YAML and requests unquoted, so each must match its strict form.
expect() {
  [[ ${!1} =~ $2 ]] || fail "IMDS returned an unexpected $1: '${!1}'"
}

list() {
  IFS=, read -ra "$1" <<<"$2"
}

# Fedora's repositories (tens of MB of metadata each) are used only when the image lacks something (rpm -q,
# modprobe), and its release repository first: the image is the release's GA image.
# repo_args ARRAY LIST: appends --repo=ID for each ID of the comma-separated LIST to the array named ARRAY.
repo_args() {
  local -n into=$1
  local -a ids
  local id
  list ids "$2"
  for id in "${ids[@]}"; do into+=("--repo=$id"); done
}

dnf_install() {
  local rc=0
  set_timeout 0
  timeout -k 10 "$TMO" dnf install -y --setopt=install_weak_deps=False --setopt=tsflags=nodocs \
    --setopt=max_parallel_downloads=10 "$@" || rc=$?
  ((rc == 0)) && return 0
  LAST_ERROR="dnf install exited $rc"
  return 1
}

# kernel_modules: br_netfilter (bridge-based CNIs, kube-proxy on bridged traffic) and overlay (CRI-O's storage) may be
# missing from a cloud kernel; Fedora's kernel-modules-extra of the running kernel has the rest of the modules (it
# requires kernel-modules of the same release, kernel.spec). Only then is it installed. kubeadm join checks neither
# module (cmd/kubeadm/app/preflight/checks.go at v1.34.4, JoinNodeChecks), so a module still missing is logged, not
# fatal. The sysctls (some need br_netfilter) are applied once the modules are in: cloud-init wrote them after
# systemd-sysctl ran at this first boot. Tolerant (-e): an unknown key must not stop the boot.
kernel_modules() {
  local -a modules missing=() still=() repos=()
  local m
  list modules "$DYNK8S_KERNEL_MODULES"
  for m in "${modules[@]}"; do modprobe "$m" 2>/dev/null || missing+=("$m"); done
  if ((${#missing[@]})); then
    log "kernel modules missing: ${missing[*]}; installing kernel-modules-extra-$(uname -r) from Fedora's repositories"
    # A GA image runs the release's kernel, whose modules the release repository has; a newer kernel's are in updates.
    repo_args repos "$DYNK8S_SYSTEM_REPOS"
    if ! dnf_install "${repos[@]}" "kernel-modules-extra-$(uname -r)"; then
      repo_args repos "$DYNK8S_UPDATE_REPOS"
      dnf_install "${repos[@]}" "kernel-modules-extra-$(uname -r)" ||
        log "installing kernel-modules-extra failed: $LAST_ERROR"
    fi
    for m in "${missing[@]}"; do modprobe "$m" 2>/dev/null || still+=("$m"); done
  fi
  if ((${#still[@]})); then
    log "still missing kernel modules: ${still[*]} (kubeadm join does not need them; bridge CNIs need br_netfilter, CRI-O's overlay storage needs overlay)"
  fi
  sysctl -q -e --system || true
}

# install_packages: kubelet, kubeadm, cri-tools and CRI-O from the pinned upstream repos, and the Fedora dependencies
# the image lacks (rpm -q: container-selinux, iptables, nftables), in one dnf transaction. The upstream repos' priority
# (1, Fedora's 99) keeps a Fedora package of the same name from winning on version (dnf.conf(5), priority). Fedora's
# release repository joins only when the image lacks one of those; after a failed attempt the next adds Fedora's
# repositories and their updates, for a dependency the image lacks and none foresaw, or a newer image than GA.
MISSING=() WITH_UPDATES=0
install_packages() {
  local -a pkgs args=()
  list pkgs "$DYNK8S_PACKAGES"
  repo_args args "$DYNK8S_REPOS"
  if ((${#MISSING[@]} || WITH_UPDATES)); then repo_args args "$DYNK8S_SYSTEM_REPOS"; fi
  if ((WITH_UPDATES)); then repo_args args "$DYNK8S_UPDATE_REPOS"; fi
  dnf_install "${args[@]}" "${pkgs[@]}" "${MISSING[@]}" && return 0
  if ((!WITH_UPDATES)); then
    WITH_UPDATES=1
    LAST_ERROR+="; the next attempt adds Fedora's repositories and their updates"
  fi
  return 1
}

packages() {
  local -a sys
  local p
  list sys "$DYNK8S_SYSTEM_PACKAGES"
  for p in "${sys[@]}"; do rpm -q --whatprovides "$p" >/dev/null 2>&1 || MISSING+=("$p"); done
  if ((${#MISSING[@]})); then
    log "the image lacks ${MISSING[*]} (rpm -q): Fedora's release repository joins the transaction"
  else
    log "the image has ${sys[*]} (rpm -q): no Fedora repository metadata needed"
  fi
  retry "install ${DYNK8S_PACKAGES//,/ }${MISSING[*]:+ ${MISSING[*]}}" install_packages
}

crio() {
  # CRI-O's package ships a bridge CNI config that would give every node the same pod range; the cluster CNI owns it.
  rm -f -- "$etc"/cni/net.d/*crio*bridge*.conflist
  systemctl enable --now crio.service || fail "crio.service did not start (journalctl -u crio)"
  systemctl enable kubelet.service || fail "could not enable kubelet.service"
}

# prepull: in the background, so that the join goes on meanwhile; a failed pull is logged and never fails the boot
# (the kubelet pulls what is still missing). Each pull is bounded by the deadline.
prepull() {
  local -a images
  local img start end rc failed=0 child
  list images "$DYNK8S_PREPULL_IMAGES"
  if ! command -v crictl >/dev/null; then
    log "pre-pull skipped: no crictl"
    return 0
  fi
  now_ms start
  trap '[[ -z ${child:-} ]] || kill "$child" 2>/dev/null; exit 143' TERM
  for img in "${images[@]}"; do
    set_timeout 300
    rc=0
    timeout -k 5 "$TMO" crictl --runtime-endpoint "$DYNK8S_CRI_SOCKET" pull "$img" >/dev/null 2>&1 &
    child=$!
    wait "$child" || rc=$?
    child=
    if ((rc != 0)); then
      failed=$((failed + 1))
      log "pre-pull of $img failed (exit $rc); the kubelet pulls it when needed"
    fi
  done
  now_ms end
  printf '%s\n' "$((end - start))" >"$run_dir/pre-pull.ms"
  log "phase=pre-pull took=$(seconds $((end - start)))s (${#images[@]} images, $failed failed)"
}

start_prepull() {
  mkdir -p "$run_dir"
  rm -f "$run_dir/pre-pull.ms"
  prepull &
  PREPULL_PID=$!
}

wait_prepull() {
  [[ -n $PREPULL_PID ]] || return 0
  wait "$PREPULL_PID" || true
  PREPULL_PID=
  if [[ -s $run_dir/pre-pull.ms ]]; then PHASES+=("pre-pull=$(<"$run_dir/pre-pull.ms")"); fi
}

start_crio() {
  systemctl start crio.service || fail "crio.service did not start (journalctl -u crio)"
}

prepare() {
  phase kernel kernel_modules
  phase packages packages
  phase crio crio
  start_prepull
  mkdir -p "${prepared_marker%/*}"
  printf '%s\n' "$DYNK8S_PACKAGES" >"$prepared_marker"
}

# join_requirements: what kubeadm join's preflight fails on (cmd/kubeadm/app/preflight/checks.go and checks_linux.go
# at v1.34.4: JoinNodeChecks, addExecChecks, addIPv4Checks/addIPv6Checks), checked here so that the log names it.
join_requirements() {
  local host=${DYNK8S_API_SERVER_ENDPOINT%:*} key='' file='' exe missing=()
  for exe in ip iptables mount nsenter; do command -v "$exe" >/dev/null || missing+=("$exe"); done
  ((${#missing[@]} == 0)) || fail "kubeadm join needs ${missing[*]} on PATH (preflight InPathCheck)"
  if [[ $host =~ ^[0-9.]+$ ]]; then
    key=net.ipv4.ip_forward file=$proc/sys/net/ipv4/ip_forward
  elif [[ $host == \[*\] ]]; then
    key=net.ipv6.conf.default.forwarding file=$proc/sys/net/ipv6/conf/default/forwarding
  fi
  [[ -n $key ]] || return 0
  is_one "$file" || sysctl -q -w "$key=1" || true
  is_one "$file" || fail "kubeadm join needs $key = 1 (preflight FileContent check), and it is not"
}

is_one() {
  local v=''
  [[ -r $1 ]] && v=$(<"$1")
  [[ $v == 1 ]]
}

# The token rotator in the cluster writes the parameter; until its first run (a fresh install) the parameter is
# missing or holds a placeholder, and a token it wrote may have expired if it stopped running: each is a reason to
# retry, never to join with what is there.
token() {
  TOKEN=
  if ! ssm_parameter TOKEN "$DYNK8S_JOIN_TOKEN_PARAMETER"; then
    [[ $LAST_ERROR != *ParameterNotFound* ]] || LAST_ERROR+=" (not created yet)"
    return 1
  fi
  [[ $TOKEN =~ ^[a-z0-9]{6}\.[a-z0-9]{16}$ ]] && return 0
  TOKEN=
  LAST_ERROR="it holds no bootstrap token ([a-z0-9]{6}.[a-z0-9]{16}) yet: the cluster's token rotator has not written one"
  return 1
}

# -k: this only proves that the tunnel and the API server answer (any HTTP status); kubeadm then pins the CA by hash.
api_server() {
  set_timeout 10
  fetch "" -k -o /dev/null --max-time "$TMO" "https://$DYNK8S_API_SERVER_ENDPOINT/readyz" || return 1
  log "API server answered HTTP $STATUS"
}

# render: the JoinConfiguration holds the token, so it is written under umask 077 (only here: other files, such as
# those dnf's scriptlets and kubeadm write, keep their modes).
render() {
  local t v
  t=$(<"$etc/dynk8s/kubeadm-join.yaml.tmpl") || fail "cannot read $etc/dynk8s/kubeadm-join.yaml.tmpl"
  for v in TOKEN NODE_IP INSTANCE_ID INSTANCE_TYPE REGION ZONE DYNK8S_ROOT; do t=${t//@@$v@@/"${!v}"}; done
  [[ $t != *@@* ]] || fail "kubeadm-join.yaml.tmpl has a placeholder this script does not know"
  mkdir -p "$run_dir"
  (umask 077 && printf '%s\n' "$t" >"$join_config")
}

JOIN_ATTEMPTS=0
join() {
  local rc=0
  if ((JOIN_ATTEMPTS++ > 0)); then
    # The token may have expired or been rotated since the last attempt read it: use what SSM holds now.
    token || return 1
    render
  fi
  set_timeout 0
  timeout -k 10 "$TMO" kubeadm join --config "$join_config" || rc=$?
  ((rc == 0)) && return 0
  LAST_ERROR="kubeadm join exited $rc (its output is above)"
  # A failed join leaves files that fail the next attempt's preflight checks.
  set_timeout 60
  timeout -k 5 "$TMO" kubeadm reset --force >/dev/null 2>&1 || log "kubeadm reset after the failed join failed too"
  return 1
}

join_cluster() {
  phase checks ready_to_join
  phase token retry "read the join token from SSM parameter $DYNK8S_JOIN_TOKEN_PARAMETER" token
  phase api-server retry "reach the API server at $DYNK8S_API_SERVER_ENDPOINT" api_server
  render
  phase kubeadm-join retry "kubeadm join" join
  log "joined the cluster as $INSTANCE_ID"
  stop_timer
}

# ready_to_join: what must hold before kubeadm join starts the kubelet.
ready_to_join() {
  join_requirements
  swap_off
  lock_metadata
}

# swap_off: the kubelet refuses to start with swap on (failSwapOn). Only now, not while preparing: a warm pool
# instance that hibernates needs its swap for that.
swap_off() {
  swapoff -a || fail "could not turn swap off (swapoff -a): the kubelet refuses to start with swap on"
}

# lock_metadata: the kubelet requires dynk8s-imds-lock.service (its drop-in), so kubeadm join's start of the kubelet
# would load the lockdown anyway; starting it here first makes a failure this script's, with its reason, instead of
# a kubelet that never starts. The lock's unit is ordered after nothing this unit waits for, so waiting is safe.
lock_metadata() {
  systemctl start dynk8s-imds-lock.service ||
    fail "the instance metadata lockdown did not load (journalctl -u dynk8s-imds-lock): no kubelet may run without it"
}

# stop_timer: a joined node needs no timer; the join unit's Condition would skip its runs, but a skipped run leaves
# the timer's base where it was, so it would fire every 15 s for the node's life. --no-block: nothing may make the
# join wait on another unit's job.
stop_timer() {
  [[ -e $etc/systemd/system/dynk8s-join.timer ]] || return 0
  systemctl disable --now --no-block dynk8s-join.timer || log "could not stop dynk8s-join.timer (harmless: its runs are skipped)"
}

group() {
  [[ -n $GROUP ]] && return 0
  autoscaling DescribeAutoScalingInstances InstanceIds.member.1="$INSTANCE_ID" -- describe-auto-scaling-instances \
    --instance-ids "$INSTANCE_ID" --query 'AutoScalingInstances[0].AutoScalingGroupName' || return 1
  if ((CURL_SIGNS)); then xml_text GROUP AutoScalingGroupName || GROUP=''; else GROUP=$BODY; fi
  [[ $GROUP =~ ^[^[:space:]]+$ && $GROUP != None ]] || { GROUP='' && LAST_ERROR="no group has $INSTANCE_ID" && return 1; }
}

# template_version VAR PATH: VAR gets the launch template version at PATH (ElementTree, from the answer's root) of
# an Auto Scaling answer in BODY; the CLI's text output is the version itself.
template_version() {
  local v
  if ((CURL_SIGNS)); then
    v=$(printf '%s' "$BODY" | python3 -c '
import sys, xml.etree.ElementTree as ET
root = ET.fromstring(sys.stdin.read())
for e in root.iter():
    e.tag = e.tag.rsplit("}", 1)[-1]
print(root.findtext(sys.argv[1]) or "")
' "$2" 2>/dev/null) || v=''
  else
    v=$BODY
  fi
  [[ $v =~ ^[0-9]+$ ]] || { LAST_ERROR="no launch template version in the answer ('$v')" && return 1; }
  printf -v "$1" '%s' "$v"
}

# stale_template: STALE=1 when this instance, prepared in the warm pool, was launched from an older version of its
# group's launch template than the group launches now. A `pulumi up` since then may have changed what its user data
# baked in (the gateway to wake, the CA pin, the Kubernetes version), and a warm instance keeps the user data it was
# launched with (EC2 Auto Scaling User Guide, "Update the instances in a warm pool").
STALE=0
stale_template() {
  local mine current
  group || return 1
  autoscaling DescribeAutoScalingInstances InstanceIds.member.1="$INSTANCE_ID" -- describe-auto-scaling-instances \
    --instance-ids "$INSTANCE_ID" --query 'AutoScalingInstances[0].LaunchTemplate.Version' || return 1
  template_version mine ./DescribeAutoScalingInstancesResult/AutoScalingInstances/member/LaunchTemplate/Version ||
    return 1
  autoscaling DescribeAutoScalingGroups AutoScalingGroupNames.member.1="$GROUP" -- describe-auto-scaling-groups \
    --auto-scaling-group-names "$GROUP" --query 'AutoScalingGroups[0].LaunchTemplate.Version' || return 1
  template_version current ./DescribeAutoScalingGroupsResult/AutoScalingGroups/member/LaunchTemplate/Version ||
    return 1
  log "launched from version $mine of the launch template; the group launches version $current"
  if ((mine < current)); then STALE=1; fi
  return 0
}

# hand_back_stale: a stale warm instance abandons its launch hook's action, so the group terminates it and
# launches another (from the warm pool, or fresh with the current user data). One question each: an unanswered one
# is no reason to give up a join that may well work.
hand_back_stale() {
  if ! stale_template; then
    log "could not compare launch template versions ($LAST_ERROR); joining with the user data it has"
    return 1
  fi
  ((STALE)) || return 1
  RESULT=stale
  if [[ -n $DYNK8S_LAUNCH_HOOK ]] && complete_lifecycle ABANDON && ((!NO_ACTION)); then
    log "prepared from an older launch template: abandoned the lifecycle action of hook $DYNK8S_LAUNCH_HOOK, the group replaces this instance"
  elif set_unhealthy; then
    log "prepared from an older launch template: marked this instance Unhealthy, the group replaces it"
  else
    log "prepared from an older launch template, and could not hand it back ($LAST_ERROR): joining with the user data it has"
    RESULT=failed
    return 1
  fi
}

# complete_lifecycle RESULT: CONTINUE or ABANDON the launch hook's action for this instance. NO_ACTION says that
# none was waiting.
NO_ACTION=0
complete_lifecycle() {
  NO_ACTION=0
  group || return 1
  autoscaling CompleteLifecycleAction AutoScalingGroupName="$GROUP" LifecycleHookName="$DYNK8S_LAUNCH_HOOK" \
    InstanceId="$INSTANCE_ID" LifecycleActionResult="$1" -- complete-lifecycle-action \
    --auto-scaling-group-name "$GROUP" --lifecycle-hook-name "$DYNK8S_LAUNCH_HOOK" --instance-id "$INSTANCE_ID" \
    --lifecycle-action-result "$1" && return 0
  # A reboot with no transition in progress has no action waiting: nothing to complete.
  if [[ $LAST_ERROR == *"No active Lifecycle Action"* ]]; then
    log "no lifecycle action of hook $DYNK8S_LAUNCH_HOOK waits for this instance"
    NO_ACTION=1
    return 0
  fi
  return 1
}

lifecycle_continue() {
  [[ -n $DYNK8S_LAUNCH_HOOK ]] || return 0
  phase lifecycle retry "complete the lifecycle action of hook $DYNK8S_LAUNCH_HOOK" complete_lifecycle CONTINUE
}

# dynk8s-join.timer runs this every 15 s while a Running or Hibernated warm instance waits: one IMDS read, and
# nothing to say until the group puts the instance in service.
if [[ -e $warm_marker ]] && imds LIFECYCLE meta-data/autoscaling/target-lifecycle-state 2>/dev/null &&
  [[ $LIFECYCLE == Warmed:* ]]; then
  RESULT=waiting
  exit 0
fi
log "booting pool $DYNK8S_POOL_NAME of cluster $DYNK8S_CLUSTER_NAME (API server $DYNK8S_API_SERVER_ENDPOINT)"
phase identity retry "read instance identity from IMDS" identity
expect INSTANCE_ID '^i-[0-9a-f]{8}([0-9a-f]{9})?$'
expect ZONE '^[a-z]{2}(-[a-z0-9]+)+$'
expect REGION '^[a-z]{2}(-[a-z]+)+-[0-9]+$'
expect DOMAIN '^[a-z0-9-]+(\.[a-z0-9-]+)+$'
expect NODE_IP '^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}$'
expect INSTANCE_TYPE '^[a-z0-9-]+\.[a-z0-9-]+$'
expect LIFECYCLE '^(InService|Standby|Detached|Terminated|Warmed:(Stopped|Running|Hibernated|Terminated))$'
log "instance $INSTANCE_ID ($INSTANCE_TYPE) in $ZONE, node IP $NODE_IP, target lifecycle state $LIFECYCLE"

case $LIFECYCLE in
Warmed:Terminated | Terminated | Detached | Standby)
  RESULT=skipped
  log "target lifecycle state $LIFECYCLE: nothing to do"
  ;;
Warmed:*)
  MODE=prepare
  [[ -n $DYNK8S_LAUNCH_HOOK ]] ||
    log "no launch hook: the group may stop this instance before it is prepared (the next boot finishes the job)"
  prepare
  wait_prepull
  lifecycle_continue
  touch "$warm_marker"
  RESULT=prepared
  log "prepared in the warm pool; the group stops, hibernates or keeps it, and it joins when it enters service"
  ;;
InService)
  MODE='join'
  # Prepared in the warm pool: on this boot (Running, Hibernated) or an earlier one (Stopped).
  if [[ -e $warm_marker || -e $prepared_marker ]] && hand_back_stale; then exit 0; fi
  # The gateway may be asleep: it boots while this node prepares.
  "$(dirname "${BASH_SOURCE[0]}")/wake-gateway.sh" "$DYNK8S_GATEWAY_INSTANCE_ID" &
  if [[ -e $prepared_marker ]]; then
    log "prepared on an earlier boot ($prepared_marker)"
    phase crio start_crio
  else
    prepare
  fi
  join_cluster
  wait_prepull
  lifecycle_continue
  RESULT=joined
  ;;
esac

#!/usr/bin/env bash
# Stops this WireGuard gateway when it has been idle for DYNK8S_IDLE_STOP_SECONDS: no instance of the stack's node
# pools pending or running (EC2 DescribeInstances on the pools' tags, the one call the gateway role may make), and no
# packet forwarded through wg0 (the counters of the gateway's nftables table). Run once a minute by
# dynk8s-gateway-idle.timer. The instance's shutdown behaviour is "stop", so `systemctl poweroff` stops it, and the
# first node that boots starts it again. Every run logs its decision; an unanswered question keeps the gateway up.
#
# Why the forward counters and not WireGuard's own: `wg show wg0 transfer` and `latest-handshakes` keep moving on an
# idle tunnel, as both ends send a keepalive every 25 s (PersistentKeepalive) and re-handshake every two minutes while
# they do. Keepalives and handshakes are the gateway's own UDP packets, never forwarded, so a forward counter that did
# not move means that nothing crossed between the VPC and on-prem.
#
# State lives in /run (tmpfs): a boot starts a fresh window, so a gateway a node just started stays up at least
# DYNK8S_IDLE_STOP_SECONDS. Test hooks: DYNK8S_ROOT prefixes /etc and /run, DYNK8S_IDLE_ENV names the config, and
# lib.sh's endpoints.
set -euo pipefail
umask 077
LOG_TAG=dynk8s-gateway-idle
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=aws.sh
. "$(dirname "${BASH_SOURCE[0]}")/aws.sh"

load_env "${DYNK8S_IDLE_ENV:-$DYNK8S_ROOT/etc/dynk8s/gateway-idle.env}" DYNK8S_CLUSTER_NAME DYNK8S_IDLE_STOP_SECONDS \
  DYNK8S_NFT_TABLE
[[ $DYNK8S_IDLE_STOP_SECONDS =~ ^[1-9][0-9]*$ ]] ||
  fail "DYNK8S_IDLE_STOP_SECONDS=$DYNK8S_IDLE_STOP_SECONDS is not a positive whole number of seconds"
# A run ends well before the timer's next one.
deadline_start 45
state_file=$DYNK8S_ROOT/run/dynk8s/gateway-idle.state
now=$(date +%s)
REGION='' POOL_INSTANCES=''

# The state: when the gateway was last seen in use, and the forward counters' packet total then (-1: unknown).
last_active=$now last_packets=-1
if [[ -r $state_file ]]; then
  read -r saved_active saved_packets <"$state_file" || true
  if [[ ${saved_active:-} =~ ^[0-9]+$ && ${saved_packets:-} =~ ^-?[0-9]+$ ]]; then
    last_active=$saved_active last_packets=$saved_packets
  else
    log "ignoring malformed state in $state_file; the idle window starts now"
  fi
fi

# pool_instances: the stack's pool instances that are pending or running, as "<id> (<state>) " words. Pool instances
# carry dynk8s:cluster and dynk8s:pool (the gateway has no pool tag); the states are filtered by EC2 and again here.
# One instance is enough to stay up, so it reads pages until one shows an instance or no NextToken is left: a
# filtered page may be empty while more follow ("Pagination in the Amazon EC2 API", EC2 developer guide). Pages
# without end are no answer.
pool_instances() {
  local id state found token='' page
  POOL_INSTANCES=''
  for ((page = 1; page <= 20; page++)); do
    ec2_call DescribeInstances MaxResults=5 \
      Filter.1.Name=tag:dynk8s:cluster "Filter.1.Value.1=$DYNK8S_CLUSTER_NAME" \
      Filter.2.Name=tag-key Filter.2.Value.1=dynk8s:pool \
      Filter.3.Name=instance-state-name Filter.3.Value.1=pending Filter.3.Value.2=running \
      ${token:+"NextToken=$token"} || return 1
    found=$(printf '%s' "$BODY" | ec2_xml instanceState) ||
      { LAST_ERROR="EC2 DescribeInstances: the answer is not XML" && return 1; }
    POOL_INSTANCES=$(while read -r id state; do
      if [[ $state == pending || $state == running ]]; then printf '%s (%s) ' "$id" "$state"; fi
    done <<<"$found")
    token=$(printf '%s' "$BODY" | ec2_xml nextToken) || token=''
    if [[ -n $POOL_INSTANCES || -z $token ]]; then return 0; fi
  done
  LAST_ERROR="EC2 DescribeInstances: still a NextToken after $((page - 1)) pages"
  return 1
}

# forwarded_packets: the packets forwarded into and out of wg0 so far, or -1 when the table is not loaded (the tunnel
# is down, so nothing can cross it).
forwarded_packets() {
  local json
  if ! json=$(nft -j list counters table inet "$DYNK8S_NFT_TABLE" 2>/dev/null); then
    echo -1
    return
  fi
  printf '%s' "$json" | python3 -c '
import json, sys
doc = json.load(sys.stdin)
counters = [e["counter"] for e in doc.get("nftables", []) if "counter" in e]
if not counters:
    sys.exit(1)
print(sum(c["packets"] for c in counters))
' || fail "nft lists no counters in table inet $DYNK8S_NFT_TABLE"
}

retry "read the region and the partition's domain from IMDS" aws_location
retry --soft "list the pool instances of cluster $DYNK8S_CLUSTER_NAME" pool_instances ||
  fail "cannot tell whether a pool instance runs ($LAST_ERROR); the gateway stays up"
packets=$(forwarded_packets)

busy=()
if [[ -n $POOL_INSTANCES ]]; then busy+=("pool instances ${POOL_INSTANCES% }"); fi
if ((packets >= 0 && packets != last_packets)); then busy+=("packets forwarded through wg0 (counter $last_packets -> $packets)"); fi
if ((${#busy[@]})); then last_active=$now; fi
idle=$((now - last_active))

mkdir -p "${state_file%/*}"
printf '%s %s\n' "$last_active" "$packets" >"$state_file.new"
mv -f "$state_file.new" "$state_file"

if ((${#busy[@]})); then
  log "staying up: ${busy[*]}"
elif ((idle < DYNK8S_IDLE_STOP_SECONDS)); then
  log "staying up: idle for ${idle}s of ${DYNK8S_IDLE_STOP_SECONDS}s (no pool instance pending or running, no packet forwarded)"
else
  log "stopping: idle for ${idle}s (limit ${DYNK8S_IDLE_STOP_SECONDS}s): no pool instance pending or running and no packet forwarded through wg0; a booting node starts the gateway again"
  systemctl poweroff || fail "systemctl poweroff failed"
fi

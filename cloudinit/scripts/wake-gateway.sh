#!/usr/bin/env bash
# wake-gateway.sh GATEWAY_INSTANCE_ID: makes sure the stack's WireGuard gateway runs, which stops itself when the
# pools have been idle (gateway-idle.sh). join.sh starts it in the background first thing, so the gateway boots while
# this node installs its packages; the join then waits for the API server through the tunnel as before.
# ec2:StartInstances is idempotent on a running instance; an instance that is still stopping refuses to start
# (IncorrectInstanceState), so that, throttling and transport errors are retried until the deadline. A refusal that a
# retry cannot change (no permission, no such instance) fails at once. An empty id means the gateway never sleeps
# (gateway.idleStop 0). Exit status: 0 when the gateway is pending or running; the join does not depend on it, but
# its log says why the tunnel stays down.
#
# A gateway that answers "was running, now running" may be powering itself off: its idle check ran before this node
# existed, and EC2 shows an instance running until its OS halts, so that start changed nothing. The start is then
# repeated through a settle window longer than a poweroff takes, until EC2 shows the gateway stopping (refused,
# retried) and then starting from stopped. A gateway still running at the end of the window stays up: its idle
# check now sees this node.
# Test hooks: lib.sh's endpoints, DYNK8S_DEADLINE_SECONDS, DYNK8S_WAKE_SETTLE_SECONDS (the window, 180 s) and
# DYNK8S_WAKE_INTERVAL_SECONDS (between starts, 20 s).
set -euo pipefail
umask 077
LOG_TAG=dynk8s-wake-gateway
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

gateway=${1-}
if [[ -z $gateway ]]; then
  log "the gateway never sleeps (gateway.idleStop 0): nothing to wake"
  exit 0
fi
[[ $gateway =~ ^i-[0-9a-f]{8}([0-9a-f]{9})?$ ]] || fail "'$gateway' is not an EC2 instance id"
# Inside the join's own 12-minute deadline: a gateway that cannot start by then fails the join anyway.
deadline_start 600
REGION='' PREVIOUS=''
settle=${DYNK8S_WAKE_SETTLE_SECONDS:-180} interval=${DYNK8S_WAKE_INTERVAL_SECONDS:-20}
[[ $settle =~ ^[0-9]+$ && $interval =~ ^[1-9][0-9]*$ ]] ||
  fail "DYNK8S_WAKE_SETTLE_SECONDS=$settle or DYNK8S_WAKE_INTERVAL_SECONDS=$interval is not a whole number of seconds"

start() {
  local id state previous
  if ! ec2_call StartInstances "InstanceId.1=$gateway"; then
    case $EC2_ERROR in
    IncorrectInstanceState) LAST_ERROR="gateway $gateway is not in a state it can start from (stopping): $LAST_ERROR" ;;
    UnauthorizedOperation | AuthFailure | InvalidInstanceID.* | OptInRequired)
      fail "cannot start gateway $gateway: $LAST_ERROR" ;;
    esac
    return 1
  fi
  read -r id state < <(printf '%s' "$BODY" | ec2_xml currentState) || true
  read -r _ previous < <(printf '%s' "$BODY" | ec2_xml previousState) || true
  PREVIOUS=${previous:-}
  case ${state:-} in
  pending | running) log "gateway $id was ${previous:-in an unknown state}, now $state" ;;
  *)
    LAST_ERROR="StartInstances answered state '${state:-none}' for '${id:-no instance}'"
    return 1
    ;;
  esac
}

retry "read the region and the partition's domain from IMDS" aws_location
retry "start the WireGuard gateway $gateway" start
if [[ $PREVIOUS == running ]]; then
  until_settled=$((SECONDS + settle))
  while ((SECONDS + interval <= until_settled)); do
    sleep "$interval"
    retry "start the WireGuard gateway $gateway again" start
    if [[ $PREVIOUS != running ]]; then exit 0; fi
  done
  log "gateway $gateway stayed running for ${settle}s: it is up"
fi

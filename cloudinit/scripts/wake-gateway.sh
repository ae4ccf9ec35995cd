#!/usr/bin/env bash
# wake-gateway.sh GATEWAY_INSTANCE_ID: makes sure the stack's WireGuard gateway runs, which stops itself when the
# pools have been idle (gateway-idle.sh). join.sh starts it in the background first thing, so the gateway boots while
# this node installs its packages; the join then waits for the API server through the tunnel as before.
# ec2:StartInstances is idempotent on a running instance; an instance that is still stopping refuses to start
# (IncorrectInstanceState), so that, throttling and transport errors are retried until the deadline. A refusal that a
# retry cannot change (no permission, no such instance) fails at once. An empty id means the gateway never sleeps
# (gateway.idleStop 0). Exit status: 0 when the gateway is pending or running; the join does not depend on it, but
# its log says why the tunnel stays down.
# Test hooks: lib.sh's endpoints and DYNK8S_DEADLINE_SECONDS.
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
REGION=''

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

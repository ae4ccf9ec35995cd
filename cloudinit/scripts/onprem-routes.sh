#!/usr/bin/env bash
# Caps the path MTU toward the on-prem ranges at the tunnel's; run at every boot by dynk8s-onprem-routes.service,
# before the join and the kubelet (routes do not persist). The instance's interface runs at MTU 9001 and the tunnel
# at wireguard.mtu, so a larger packet with don't-fragment set toward on-prem dies at the gateway. With the route's
# MTU, host TCP advertises an MSS that fits, and the CNI's tunnel devices (IPIP, VXLAN) fragment or tell their
# senders the path MTU. The routes go via the default route's gateway and device, as the VPC routes them anyway.
# Test hooks: DYNK8S_ROOT prefixes /etc, DYNK8S_NETWORK_ENV names the config.
set -euo pipefail
LOG_TAG=dynk8s-onprem-routes
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

load_env "${DYNK8S_NETWORK_ENV:-$DYNK8S_ROOT/etc/dynk8s/network.env}" DYNK8S_ONPREM_CIDRS DYNK8S_TUNNEL_MTU
deadline_start 120
GW='' DEV=''

# default_route sets GW and DEV from "default via 10.200.0.1 dev ens5 proto dhcp src ... metric 100".
default_route() {
  local -a f=()
  local i
  read -ra f < <(ip -4 route show default) || true
  for ((i = 0; i + 1 < ${#f[@]}; i++)); do
    case ${f[i]} in
    via) GW=${f[i + 1]} ;;
    dev) DEV=${f[i + 1]} ;;
    esac
  done
  [[ $GW =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ && $DEV =~ ^[A-Za-z0-9_.-]{1,15}$ ]] && return 0
  LAST_ERROR="no IPv4 default route with a gateway yet (ip -4 route show default: '${f[*]}')"
  return 1
}

retry "find the default route" default_route
IFS=, read -ra cidrs <<<"$DYNK8S_ONPREM_CIDRS"
for c in "${cidrs[@]}"; do
  ip route replace "$c" via "$GW" dev "$DEV" mtu "$DYNK8S_TUNNEL_MTU" ||
    fail "could not route $c via $GW dev $DEV with MTU $DYNK8S_TUNNEL_MTU"
done
log "routes to ${cidrs[*]} via $GW dev $DEV capped at MTU $DYNK8S_TUNNEL_MTU"

#!/usr/bin/env bash
# Keeps the instance metadata service, and with it the node role's credentials, from pods and from non-root users of
# the host: run by dynk8s-imds-lock.service, which the kubelet requires (so it fails closed: no kubelet without it)
# and the agent's join starts before kubeadm join. The ruleset (imds-lock.nft) allows root and the users the renderer lists;
# this adds EC2 Instance Connect's user when the image has it, since sshd looks an operator's pushed key up in the
# metadata as that user.
# Test hooks: DYNK8S_ROOT prefixes /etc.
set -euo pipefail
LOG_TAG=dynk8s-imds-lock
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ruleset=$DYNK8S_ROOT/etc/dynk8s/imds-lock.nft
[[ -r $ruleset ]] || fail "$ruleset is missing"
nft -f "$ruleset" || fail "nft could not load $ruleset"
also=
if uid=$(id -u ec2-instance-connect 2>/dev/null); then
  [[ $uid =~ ^[1-9][0-9]*$ ]] || fail "id -u ec2-instance-connect gave '$uid'"
  nft add element inet dynk8s_imds_lock imds_users "{ $uid }" ||
    fail "nft could not allow ec2-instance-connect ($uid)"
  also=" and ec2-instance-connect ($uid)"
fi
log "instance metadata locked: only root, the users in $ruleset$also reach it; no pod network at all"

#!/usr/bin/env bash
# Installs the gateway's packages (wireguard-tools, nftables) from Fedora's repositories and then starts the tunnel;
# run by dynk8s-gateway-packages.service at every boot. A package already there is not fetched again, so after the
# first boot this only checks. A mirror hiccup is retried under a deadline; past it the script exits 1 with the reason
# and systemd starts it again (Restart=on-failure), so the gateway never stays without its tunnel.
# Test hooks: DYNK8S_ROOT prefixes /etc, DYNK8S_GATEWAY_ENV names the config.
set -euo pipefail
LOG_TAG=dynk8s-gateway-packages
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

load_env "${DYNK8S_GATEWAY_ENV:-$DYNK8S_ROOT/etc/dynk8s/gateway-packages.env}" DYNK8S_PACKAGES DYNK8S_SYSTEM_REPOS \
  DYNK8S_UNIT
deadline_start 600
IFS=, read -ra wanted <<<"$DYNK8S_PACKAGES"
missing=()
for p in "${wanted[@]}"; do
  rpm -q --whatprovides "$p" >/dev/null 2>&1 || missing+=("$p")
done

# install: the first attempt reads only the release repository's metadata (the image is the release's GA image, whose
# packages it matches); the next ones every enabled repository, updates included.
repos=()
IFS=, read -ra release <<<"$DYNK8S_SYSTEM_REPOS"
for r in "${release[@]}"; do repos+=("--repo=$r"); done
install() {
  local rc=0
  set_timeout 0
  timeout -k 10 "$TMO" dnf install -y --setopt=install_weak_deps=False "${repos[@]}" "${missing[@]}" || rc=$?
  ((rc == 0)) && return 0
  LAST_ERROR="dnf install exited $rc"
  repos=()
  return 1
}

if ((${#missing[@]})); then
  retry "install ${missing[*]}" install
  log "installed ${missing[*]}"
else
  log "${wanted[*]} already installed"
fi
# --no-block: the tunnel's own start (its key from SSM) has its own timeout and retries.
systemctl daemon-reload || fail "systemctl daemon-reload failed"
systemctl enable --now --no-block "$DYNK8S_UNIT" || fail "could not enable and start $DYNK8S_UNIT"

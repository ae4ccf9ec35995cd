#!/usr/bin/env bash
# Puts the gateway's WireGuard private key from SSM into /etc/wireguard/wg0.key (0600); run as ExecStartPre of
# wg-quick@wg0, whose PostUp loads the file. The key stays on disk so that a reboot or an EC2 auto-recovery while SSM
# is unreachable still brings the tunnel up; when SSM answers, its value wins, so a rotated key needs only a restart.
# Test hooks: DYNK8S_ROOT prefixes /etc, DYNK8S_KEY_ENV names the config, and lib.sh's endpoints.
set -euo pipefail
umask 077
LOG_TAG=dynk8s-wg-key
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=aws.sh
. "$(dirname "${BASH_SOURCE[0]}")/aws.sh"

key_file=$DYNK8S_ROOT/etc/wireguard/wg0.key
load_env "${DYNK8S_KEY_ENV:-$DYNK8S_ROOT/etc/dynk8s/wg-key.env}" DYNK8S_KEY_PARAMETER
# With a key on disk, SSM gets a short try so that the tunnel is not held up for long.
if [[ -s $key_file ]]; then deadline_start 45; else deadline_start 600; fi
KEY=''

key() {
  imds REGION meta-data/placement/region && imds DOMAIN meta-data/services/domain &&
    ssm_parameter KEY "$DYNK8S_KEY_PARAMETER"
}

if retry --soft "read the WireGuard key from SSM parameter $DYNK8S_KEY_PARAMETER" key; then
  # 32 bytes of standard base64: 43 characters whose last carries 2 zero bits, then one "=".
  [[ $KEY =~ ^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$ ]] ||
    fail "SSM parameter $DYNK8S_KEY_PARAMETER does not hold a WireGuard key (32 bytes, base64)"
  if [[ -s $key_file && $(<"$key_file") == "$KEY" ]]; then
    log "key in $key_file is current"
    exit 0
  fi
  mkdir -p "${key_file%/*}"
  printf '%s\n' "$KEY" >"$key_file.new"
  mv -f "$key_file.new" "$key_file"
  log "wrote the key from SSM to $key_file"
elif [[ -s $key_file ]]; then
  log "SSM unreachable ($LAST_ERROR); keeping the key already in $key_file"
else
  fail "no WireGuard key: SSM parameter $DYNK8S_KEY_PARAMETER could not be read ($LAST_ERROR) and $key_file is absent"
fi

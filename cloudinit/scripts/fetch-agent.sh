#!/usr/bin/env bash
# dynk8s-agent.service: installs the node agent, /usr/local/bin/dynk8s-node, from the stack's S3 bucket, pinned by
# S3 version id and sha256 (docs/agent-delivery.md), the way kops' bootstrap fetches nodeup. The instance role's
# credentials come from IMDSv2 and reach curl on stdin (-K -), never its argv. Nothing is installed unless the
# download's sha256 is the pinned one. Transport and HTTP errors are retried until the deadline; a wrong hash is
# not, since a version's bytes never change. Inputs: the unit's EnvironmentFile (cloudinit.Agent).
#
# The controller's init container runs it too (infra/addons, the controller's Deployment), with no IMDS: there
# DYNK8S_AWS_REGION is set, the IAM user's key comes from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY,
# DYNK8S_S3_ENDPOINT is the region's S3 endpoint (the stack writes it for the region's partition) and
# DYNK8S_AGENT_DEST is where the binary goes (an emptyDir). It serves on-prem nodes of either architecture, so it
# gives each pin once per architecture, DYNK8S_AGENT_KEY_AMD64, DYNK8S_AGENT_KEY_ARM64 and so on, and the machine's
# (uname -m) is taken.
set -euo pipefail
if [[ -z ${DYNK8S_AGENT_KEY:-} ]]; then
  case $(uname -m) in
  x86_64) ARCH=AMD64 ;;
  aarch64 | arm64) ARCH=ARM64 ;;
  *) printf 'dynk8s-agent: FAILED: no binary for a %s machine\n' "$(uname -m)" >&2 && exit 1 ;;
  esac
  for pin in KEY VERSION_ID SHA256; do
    name=DYNK8S_AGENT_${pin}_$ARCH
    if [[ -n ${!name:-} ]]; then printf -v "DYNK8S_AGENT_$pin" '%s' "${!name}"; fi
  done
fi
: "${DYNK8S_AGENT_BUCKET:?}" "${DYNK8S_AGENT_KEY:?}" "${DYNK8S_AGENT_VERSION_ID:?}" "${DYNK8S_AGENT_SHA256:?}"
: "${DYNK8S_AGENT_DEADLINE_SECONDS:?}"
IMDS=${DYNK8S_IMDS_ENDPOINT:-http://169.254.169.254}
DEST=${DYNK8S_AGENT_DEST:-${DYNK8S_ROOT:-}/usr/local/bin/dynk8s-node}
NAME=${DEST##*/}
DEADLINE=$((SECONDS + DYNK8S_AGENT_DEADLINE_SECONDS))
TMP='' TOKEN='' CREDS='' CURLRC='' REGION='' URL=''
trap 'rm -f "$TMP"' EXIT
log() { printf 'dynk8s-agent: %s\n' "$*" >&2; }
sha() { local s && s=$(sha256sum "$1") && printf '%s' "${s%% *}"; }
# md PATH: one IMDSv2 metadata path (the token on stdin: -H @-).
md() { curl -sSf --max-time 5 -H @- "$IMDS/latest/meta-data/$1" <<<"X-aws-ec2-metadata-token: $TOKEN"; }
# field NAME: a string field of the credentials document (a flat JSON object; the values have no quote or escape).
field() { [[ $CREDS =~ \"$1\"[[:space:]]*:[[:space:]]*\"([^\"]+)\" ]] && printf '%s' "${BASH_REMATCH[1]}"; }
if [[ -x $DEST && $(sha "$DEST") == "$DYNK8S_AGENT_SHA256" ]]; then
  log "$NAME $DYNK8S_AGENT_SHA256 is installed" && exit 0
fi
if [[ -n ${DYNK8S_AWS_REGION:-} ]]; then
  : "${AWS_ACCESS_KEY_ID:?}" "${AWS_SECRET_ACCESS_KEY:?}" "${DYNK8S_S3_ENDPOINT:?}"
fi
# credentials: sets REGION, URL and CURLRC (curl's config: the key, and the session token when there is one), from
# the environment (DYNK8S_AWS_REGION set) or from IMDSv2; REASON says why it failed.
credentials() {
  if [[ -n ${DYNK8S_AWS_REGION:-} ]]; then
    REGION=$DYNK8S_AWS_REGION
    URL="$DYNK8S_S3_ENDPOINT/$DYNK8S_AGENT_BUCKET/$DYNK8S_AGENT_KEY?versionId=$DYNK8S_AGENT_VERSION_ID"
    CURLRC=$(printf 'user = "%s:%s"\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY")
    [[ -z ${AWS_SESSION_TOKEN:-} ]] || CURLRC+=$(printf '\nheader = "x-amz-security-token: %s"' "$AWS_SESSION_TOKEN")
    return 0
  fi
  TOKEN=$(curl -sSf --max-time 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$IMDS/latest/api/token" 2>&1) ||
    { REASON="IMDSv2 token: $TOKEN" && return 1; }
  local domain='' role=''
  if ! { REGION=$(md placement/region 2>&1) && domain=$(md services/domain 2>&1) &&
    role=$(md iam/security-credentials/ 2>&1) && CREDS=$(md "iam/security-credentials/${role%%$'\n'*}" 2>&1); }; then
    REASON="IMDS: $REGION$domain$role$CREDS" && return 1
  fi
  URL="${DYNK8S_S3_ENDPOINT:-https://s3.$REGION.$domain}/$DYNK8S_AGENT_BUCKET/$DYNK8S_AGENT_KEY?versionId=$DYNK8S_AGENT_VERSION_ID"
  CURLRC=$(printf 'user = "%s:%s"\nheader = "x-amz-security-token: %s"' "$(field AccessKeyId)" \
    "$(field SecretAccessKey)" "$(field Token)")
}
# fetch: one attempt; REASON says why it failed.
fetch() {
  local status=''
  credentials || return 1
  TMP=$(mktemp "$DEST.XXXXXX")
  status=$(printf '%s\n' "$CURLRC" | curl -sS -K - --aws-sigv4 "aws:amz:$REGION:s3" \
    --max-time $((DEADLINE - SECONDS > 1 ? DEADLINE - SECONDS : 1)) -o "$TMP" -w '%{http_code}' "$URL" 2>&1) ||
    { REASON="GET $URL: ${status:-curl failed}" && return 1; }
  # S3's error document, as it came (its start, on one line): the bootstrap parses nothing but the credentials.
  [[ $status == 200 ]] || { REASON="GET $URL: HTTP $status: $(head -c 300 "$TMP" | tr -d '\n')" && return 1; }
}
delay=1
for ((attempt = 1; ; attempt++)); do
  REASON=''
  if fetch; then break; fi
  rm -f "$TMP"
  if ((SECONDS + delay >= DEADLINE)); then
    log "FAILED: gave up after $attempt attempts (deadline ${DYNK8S_AGENT_DEADLINE_SECONDS}s): $REASON" && exit 1
  fi
  log "attempt $attempt failed: $REASON; retrying in ${delay}s"
  sleep "$delay"
  delay=$((delay * 2 < 10 ? delay * 2 : 10))
done
got=$(sha "$TMP")
[[ -s $TMP ]] || { log "FAILED: the download is empty (a plan's stand-in?): nothing installed" && exit 1; }
if [[ $got != "$DYNK8S_AGENT_SHA256" ]]; then
  log "FAILED: the download's sha256 is $got, not the pinned $DYNK8S_AGENT_SHA256: nothing installed" && exit 1
fi
chmod 0755 "$TMP" && mv -f "$TMP" "$DEST"
log "installed $NAME $got (s3://$DYNK8S_AGENT_BUCKET/$DYNK8S_AGENT_KEY version $DYNK8S_AGENT_VERSION_ID)"

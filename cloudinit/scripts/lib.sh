# shellcheck shell=bash
# Shared by the dynk8s boot scripts (sourced, never run). Every endpoint can be overridden so the scripts also run
# outside EC2 (tests point them at a fake IMDS, a fake or moto SSM, and a temp root via DYNK8S_ROOT).
# Secrets (role credentials, the join token, the gateway key) stay in shell variables: they reach curl on stdin
# and files only under umask 077, never argv or the log.

DYNK8S_ROOT=${DYNK8S_ROOT:-}
IMDS=${DYNK8S_IMDS_ENDPOINT:-http://169.254.169.254}
LOG_TAG=${LOG_TAG:-dynk8s}
LAST_ERROR=
IMDS_TOKEN=

log() {
  printf '%s: %s\n' "$LOG_TAG" "$*" >&2
  # Under systemd stderr already goes to the journal and the console (see the unit); elsewhere copy to the journal.
  if [[ -z ${JOURNAL_STREAM:-} ]] && command -v logger >/dev/null; then
    logger -t "$LOG_TAG" -- "$*" 2>/dev/null || true
  fi
}

# fail logs the one reason the script stops and exits non-zero.
fail() {
  log "FAILED: $*"
  exit 1
}

# load_env FILE KEY...: reads the KEY=value lines the renderer wrote, without executing anything. Exactly the
# KEYs given must be there, and values may only use the characters the renderer allows.
load_env() {
  local file=$1 line k
  shift
  [[ -r $file ]] || fail "config $file is missing or unreadable"
  while IFS= read -r line || [[ -n $line ]]; do
    [[ -z $line || $line == \#* ]] && continue
    [[ $line =~ ^([A-Z0-9_]+)=([][A-Za-z0-9_.,:/*@+=-]*)$ ]] || fail "config $file: malformed line: $line"
    k=${BASH_REMATCH[1]}
    [[ " $* " == *" $k "* ]] || fail "config $file: unknown key $k"
    printf -v "$k" '%s' "${BASH_REMATCH[2]}"
  done <"$file"
  for k in "$@"; do
    [[ -n ${!k+set} ]] || fail "config $file: $k is missing"
  done
}

deadline_start() {
  local s=${DYNK8S_DEADLINE_SECONDS:-$1}
  [[ $s =~ ^[0-9]+$ ]] || fail "DYNK8S_DEADLINE_SECONDS=$s is not a whole number of seconds"
  DEADLINE_SECONDS=$s
  DEADLINE=$((SECONDS + s))
}

# set_timeout N: TMO = N seconds capped by what is left before the deadline (N=0: all of it), at least 1.
set_timeout() {
  TMO=$((DEADLINE - SECONDS))
  if (($1 > 0 && $1 < TMO)); then TMO=$1; fi
  if ((TMO < 1)); then TMO=1; fi
}

# retry [--soft] DESC CMD...: runs CMD until it succeeds, sleeping with exponential backoff (capped, 5 s by default)
# and stopping when the next attempt could not start before the deadline: then fail, or with --soft return 1.
# CMD explains a failed attempt in LAST_ERROR.
retry() {
  local soft=0 desc attempt=1 delay=${DYNK8S_BACKOFF_INITIAL_MS:-1000} max=${DYNK8S_BACKOFF_MAX_MS:-5000} rc pause
  if [[ $1 == --soft ]]; then soft=1 && shift; fi
  desc=$1
  shift
  while true; do
    LAST_ERROR=
    rc=0
    "$@" || rc=$?
    if ((rc == 0)); then
      ((attempt == 1)) || log "$desc: succeeded on attempt $attempt"
      return 0
    fi
    LAST_ERROR=${LAST_ERROR:-exit status $rc}
    if (((DEADLINE - SECONDS) * 1000 <= delay)); then
      ((soft)) && return 1
      fail "$desc: gave up after $attempt attempts (deadline ${DEADLINE_SECONDS}s): $LAST_ERROR"
    fi
    printf -v pause '%d.%03d' $((delay / 1000)) $((delay % 1000))
    log "$desc: attempt $attempt failed: $LAST_ERROR; retrying in ${pause}s"
    sleep "$pause"
    attempt=$((attempt + 1))
    delay=$((delay * 2 < max ? delay * 2 : max))
  done
}

# fetch STDIN CURL-ARG...: one HTTP request; BODY and STATUS get the response. A transport error returns 1 with curl's
# message in LAST_ERROR; an HTTP error status is the caller's to judge.
fetch() {
  local input=$1 out rc=0
  shift
  out=$(printf '%s' "$input" | curl -sS -w '\n%{http_code}' "$@" 2>&1) || rc=$?
  STATUS=${out##*$'\n'}
  BODY=${out%$'\n'*}
  if ((rc != 0)); then
    if [[ $out =~ curl:\ \([0-9]+\)[^$'\n']* ]]; then LAST_ERROR=${BASH_REMATCH[0]}; else LAST_ERROR="curl exit $rc"; fi
    return 1
  fi
}

# json_get PATH...: prints each dotted PATH of the JSON document on stdin on its own line (empty when absent) and
# fails if the input is not JSON or a PATH is absent.
json_get() {
  python3 -c '
import json, sys
doc, missing = json.load(sys.stdin), 0
for path in sys.argv[1:]:
    v = doc
    for k in path.split("."):
        v = v.get(k) if isinstance(v, dict) else None
    missing += v is None
    print("" if v is None else v)
sys.exit(1 if missing else 0)
' "$@" 2>/dev/null
}

# imds VAR PATH: GET an IMDSv2 path (after "latest/") into VAR, taking a session token first.
imds() {
  set_timeout 5
  if [[ -z $IMDS_TOKEN ]]; then
    fetch "" -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 21600' --max-time "$TMO" "$IMDS/latest/api/token" ||
      return 1
    [[ $STATUS == 200 && -n $BODY ]] || { LAST_ERROR="IMDSv2 token: HTTP $STATUS" && return 1; }
    IMDS_TOKEN=$BODY
  fi
  fetch "" -H "X-aws-ec2-metadata-token: $IMDS_TOKEN" --max-time "$TMO" "$IMDS/latest/$2" || return 1
  if [[ $STATUS == 401 ]]; then IMDS_TOKEN=; fi
  [[ $STATUS == 200 ]] || { LAST_ERROR="IMDS $2: HTTP $STATUS" && return 1; }
  printf -v "$1" '%s' "$BODY"
}

# role_credentials: the instance role's temporary credentials from IMDS into CREDS (key id, secret, session token).
role_credentials() {
  local role json
  imds role meta-data/iam/security-credentials/ || return 1
  role=${role%%$'\n'*}
  [[ $role =~ ^[A-Za-z0-9+=,.@_-]+$ ]] || { LAST_ERROR="IMDS names no instance role" && return 1; }
  imds json "meta-data/iam/security-credentials/$role" || return 1
  mapfile -t CREDS < <(printf '%s' "$json" | json_get AccessKeyId SecretAccessKey Token)
  if ((${#CREDS[@]} != 3)) || [[ ! "${CREDS[*]}" =~ ^[A-Za-z0-9/+=_-]+\ [A-Za-z0-9/+=_-]+\ [A-Za-z0-9/+=_-]+$ ]]; then
    LAST_ERROR="IMDS credentials of role $role are incomplete" && return 1
  fi
}

# signed_config: curl --config text with the role's key as the SigV4 user and its session token header, for curl's
# stdin, so that no secret is on a command line.
signed_config() {
  printf 'user = "%s:%s"\nheader = "x-amz-security-token: %s"\n' "${CREDS[0]}" "${CREDS[1]}" "${CREDS[2]}"
}

# ssm_parameter VAR NAME REGION: SSM GetParameter (decrypted) signed with the instance role's credentials.
ssm_parameter() {
  local name=$2 region=$3 request value
  role_credentials || return 1
  request=$(python3 -c 'import json, sys; print(json.dumps({"Name": sys.argv[1], "WithDecryption": True}))' "$name")
  set_timeout 10
  fetch "$(signed_config)" --config - --aws-sigv4 "aws:amz:$region:ssm" --max-time "$TMO" \
    -H 'Content-Type: application/x-amz-json-1.1' -H 'X-Amz-Target: AmazonSSM.GetParameter' \
    --data-binary "$request" "${DYNK8S_SSM_ENDPOINT:-https://ssm.$region.amazonaws.com}/" || return 1
  if [[ $STATUS != 200 ]]; then
    value=$(printf '%s' "$BODY" | json_get __type message || true)
    LAST_ERROR="SSM GetParameter $name: HTTP $STATUS ${value//$'\n'/ }"
    return 1
  fi
  value=$(printf '%s' "$BODY" | json_get Parameter.Value) || { LAST_ERROR="SSM answer has no Parameter.Value" && return 1; }
  printf -v "$1" '%s' "$value"
}

# ec2_call REGION ACTION NAME=VALUE...: one call of the EC2 Query API (form-encoded POST, API version 2016-11-15,
# SigV4 with the instance role's credentials); BODY holds the XML answer. On an error answer EC2_ERROR is its code
# (e.g. IncorrectInstanceState) and LAST_ERROR says what failed; a transport error leaves EC2_ERROR empty.
ec2_call() {
  local region=$1 action=$2 request
  shift 2
  EC2_ERROR=
  role_credentials || return 1
  request=$(python3 -c 'import sys, urllib.parse
print(urllib.parse.urlencode([tuple(a.split("=", 1)) for a in sys.argv[1:]]))' "Action=$action" Version=2016-11-15 "$@") ||
    { LAST_ERROR="EC2 $action: cannot encode the request" && return 1; }
  set_timeout 10
  fetch "$(signed_config)" --config - --aws-sigv4 "aws:amz:$region:ec2" --max-time "$TMO" \
    -H 'Content-Type: application/x-www-form-urlencoded; charset=utf-8' \
    --data-binary "$request" "${DYNK8S_EC2_ENDPOINT:-https://ec2.$region.amazonaws.com}/" || return 1
  [[ $STATUS == 200 ]] && return 0
  EC2_ERROR=$(printf '%s' "$BODY" | ec2_xml error) || EC2_ERROR=
  LAST_ERROR="EC2 $action: HTTP $STATUS ${EC2_ERROR:-(no error code)}: $(printf '%s' "$BODY" | ec2_xml message || true)"
  EC2_ERROR=${EC2_ERROR:-HTTP$STATUS}
  return 1
}

# ec2_xml WHAT: reads an EC2 XML answer on stdin. "error" and "message" print the first error's code and message;
# "instanceState" or "currentState" print "<instance-id> <state name>" for each instance of the answer's
# instancesSet elements (DescribeInstances, StartInstances). Fails on input that is not XML.
ec2_xml() {
  python3 -c '
import sys, xml.etree.ElementTree as ET
root = ET.fromstring(sys.stdin.read())
for e in root.iter():
    e.tag = e.tag.rsplit("}", 1)[-1]
what = sys.argv[1]
if what in ("error", "message"):
    err = next(root.iter("Error"), None)
    if err is None:
        sys.exit(1)
    print(err.findtext("Code" if what == "error" else "Message") or "")
else:
    for instances in root.iter("instancesSet"):
        for item in instances.findall("item"):
            print(item.findtext("instanceId"), item.findtext(what + "/name"))
' "$1" 2>/dev/null
}

# shellcheck shell=bash
# Shared by the dynk8s boot scripts (sourced, never run; the gateway's AWS calls are in aws.sh). Every endpoint can
# be overridden so the scripts also run outside EC2 (tests point them at a fake IMDS, a fake or moto SSM, and a temp
# root via DYNK8S_ROOT).
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

# fail logs the one reason the script stops and exits non-zero, to the kernel log too (console).
fail() {
  log "FAILED: $*"
  kmsg 3 "FAILED: $*"
  exit 1
}

# kmsg LEVEL MESSAGE: one line to the kernel log (printk level LEVEL: 3 error, 5 notice), which reaches every console
# the kernel registered, the EC2 serial console of `aws ec2 get-console-output` included. The unit's journal+console
# follows /dev/console, the last console= of the kernel command line, and Fedora 43's aarch64 EC2 images name
# ttyAMA0 there, a PL011 that Graviton does not have (its UART is a 16550, ttyS0, which the kernel still registers
# from the ACPI SPCR table). Best effort: a kernel log that cannot be written loses only this copy.
kmsg() {
  local dev=${DYNK8S_ROOT}/dev/kmsg
  [[ -w $dev ]] || return 0
  printf '<%d>%s: %s\n' "$1" "$LOG_TAG" "${2:0:900}" >>"$dev" 2>/dev/null || true
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

# imds VAR PATH: GET an IMDSv2 path (after "latest/") into VAR, taking a session token first.
imds() {
  set_timeout 5
  if [[ -z $IMDS_TOKEN ]]; then
    fetch "" -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 21600' --max-time "$TMO" "$IMDS/latest/api/token" ||
      return 1
    [[ $STATUS == 200 && -n $BODY ]] || { LAST_ERROR="IMDSv2 token: HTTP $STATUS" && return 1; }
    IMDS_TOKEN=$BODY
  fi
  # The token goes to curl on stdin (-H @-: headers read from a file, curl 7.55+), not on its argv.
  fetch "X-aws-ec2-metadata-token: $IMDS_TOKEN" -H @- --max-time "$TMO" "$IMDS/latest/$2" || return 1
  if [[ $STATUS == 401 ]]; then IMDS_TOKEN=; fi
  [[ $STATUS == 200 ]] || { LAST_ERROR="IMDS $2: HTTP $STATUS" && return 1; }
  printf -v "$1" '%s' "$BODY"
}

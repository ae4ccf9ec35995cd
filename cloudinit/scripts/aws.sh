# shellcheck shell=bash
# The AWS calls of the gateway's scripts (sourced after lib.sh, never run): SigV4 through curl or the aws CLI, form
# encoding, JSON and XML answers. The node's boot makes its AWS calls in the agent (cmd/dynk8s-node), so the node's
# user data carries only lib.sh.

# LAST_ERROR, BODY and STATUS are lib.sh's: its retry reads what these functions leave there.
: "${LAST_ERROR?aws.sh is sourced after lib.sh}"

# form_encode VAR KEY=VALUE...: VAR gets an application/x-www-form-urlencoded body (RFC 3986 unreserved characters
# kept, every other byte percent-encoded).
form_encode() {
  local var=$1 out='' pair key value c i LC_ALL=C
  shift
  for pair in "$@"; do
    key=${pair%%=*} value=${pair#*=}
    out+=${out:+&}$key=
    for ((i = 0; i < ${#value}; i++)); do
      c=${value:i:1}
      if [[ $c == [A-Za-z0-9._~-] ]]; then out+=$c; else printf -v c '%%%02X' "'$c" && out+=$c; fi
    done
  done
  printf -v "$var" '%s' "$out"
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

# AWS calls sign with the instance role (curl --aws-sigv4, curl >= 7.75) or, where the image's curl cannot sign, go
# through the aws CLI, which reads the same role from IMDS. REGION and DOMAIN (the partition's DNS suffix, from
# IMDS meta-data/services/domain: amazonaws.com, amazonaws.com.cn, ...) must be set. Endpoints can be overridden for
# tests: DYNK8S_SSM_ENDPOINT, DYNK8S_EC2_ENDPOINT.
REGION=''
DOMAIN=
AWS_CLI=${DYNK8S_AWS_CLI:-aws}
CURL_SIGNS=

# aws_signer: decides once how AWS calls are signed, or fails with the reason. The probe signs a request to a local
# file, which needs no network; a curl without SigV4 rejects the option itself.
aws_signer() {
  [[ -n $CURL_SIGNS ]] && return 0
  if curl -sS --aws-sigv4 aws:amz:probe:probe --user probe:probe -o /dev/null file:///dev/null 2>/dev/null; then
    CURL_SIGNS=1
  elif command -v "$AWS_CLI" >/dev/null; then
    CURL_SIGNS=0
    log "curl cannot sign AWS requests (no --aws-sigv4: curl older than 7.75 or built without it); using $AWS_CLI"
  else
    fail "curl cannot sign AWS requests (no --aws-sigv4: curl older than 7.75 or built without it) and there is no $AWS_CLI CLI to fall back to"
  fi
}

# aws_location: REGION and DOMAIN from IMDS.
aws_location() {
  imds REGION meta-data/placement/region && imds DOMAIN meta-data/services/domain
}

endpoint() {
  local override=DYNK8S_${1^^}_ENDPOINT
  printf '%s' "${!override:-https://$1.$REGION.$DOMAIN}"
}

# role_credentials: CREDS gets the instance role's key ID, secret key and session token from IMDS, once: they stay
# valid for far longer than a boot takes, and a 403 answer drops them for the next attempt.
CREDS=()
role_credentials() {
  local role json
  ((${#CREDS[@]} == 3)) && return 0
  imds role meta-data/iam/security-credentials/ || return 1
  role=${role%%$'\n'*}
  [[ $role =~ ^[A-Za-z0-9+=,.@_-]+$ ]] || { LAST_ERROR="IMDS names no instance role" && return 1; }
  imds json "meta-data/iam/security-credentials/$role" || return 1
  mapfile -t CREDS < <(printf '%s' "$json" | json_get AccessKeyId SecretAccessKey Token)
  if ((${#CREDS[@]} != 3)) || [[ ! "${CREDS[*]}" =~ ^[A-Za-z0-9/+=_-]+\ [A-Za-z0-9/+=_-]+\ [A-Za-z0-9/+=_-]+$ ]]; then
    CREDS=()
    LAST_ERROR="IMDS credentials of role $role are incomplete" && return 1
  fi
}

# aws_query SERVICE TARGET-OR-EMPTY CONTENT-TYPE BODY: one POST signed with the instance role's credentials, which
# reach curl on stdin, never argv. BODY and STATUS get the answer.
aws_query() {
  local service=$1 target=$2 type=$3 body=$4 config
  local -a headers=(-H "Content-Type: $type")
  role_credentials || return 1
  [[ -z $target ]] || headers+=(-H "X-Amz-Target: $target")
  config="user = \"${CREDS[0]}:${CREDS[1]}\""$'\n'"header = \"x-amz-security-token: ${CREDS[2]}\""
  set_timeout 10
  fetch "$config" --config - --aws-sigv4 "aws:amz:$REGION:$service" --max-time "$TMO" "${headers[@]}" \
    --data-binary "$body" "$(endpoint "$service")/" || return 1
  if [[ $STATUS == 403 ]]; then CREDS=(); fi
}

# aws_cli ARG...: the aws CLI with the region and any endpoint override; BODY gets its output.
aws_cli() {
  local service=$1 rc=0 override=DYNK8S_${1^^}_ENDPOINT
  local -a args=("$@" --region "$REGION" --output text)
  [[ -z ${!override:-} ]] || args+=(--endpoint-url "${!override}")
  set_timeout 20
  BODY=$(timeout -k 5 "$TMO" "$AWS_CLI" "${args[@]}" 2>&1) || rc=$?
  ((rc == 0)) && return 0
  LAST_ERROR="$AWS_CLI $service $2 exited $rc: ${BODY//$'\n'/ }"
  return 1
}

# ssm_parameter VAR NAME: SSM GetParameter (decrypted) with the instance role.
ssm_parameter() {
  local name=$2 request value
  aws_signer
  if ((!CURL_SIGNS)); then
    aws_cli ssm get-parameter --name "$name" --with-decryption --query Parameter.Value || return 1
    printf -v "$1" '%s' "$BODY"
    return 0
  fi
  request=$(python3 -c 'import json, sys; print(json.dumps({"Name": sys.argv[1], "WithDecryption": True}))' "$name")
  aws_query ssm AmazonSSM.GetParameter application/x-amz-json-1.1 "$request" || return 1
  if [[ $STATUS != 200 ]]; then
    value=$(printf '%s' "$BODY" | json_get __type message || true)
    LAST_ERROR="SSM GetParameter $name: HTTP $STATUS ${value//$'\n'/ }"
    return 1
  fi
  value=$(printf '%s' "$BODY" | json_get Parameter.Value) || { LAST_ERROR="SSM answer has no Parameter.Value" && return 1; }
  printf -v "$1" '%s' "$value"
}

# ec2_call ACTION NAME=VALUE...: one call of the EC2 Query API (form-encoded POST, API version 2016-11-15, signed by
# curl with the instance role's credentials; REGION and DOMAIN must be set); BODY holds the XML answer. On an error
# answer EC2_ERROR is its code (e.g. IncorrectInstanceState) and LAST_ERROR says what failed; a transport error
# leaves EC2_ERROR empty. Its callers run on the gateway and beside the join, in the background: without curl's
# SigV4 it fails with that reason rather than fall back to the aws CLI.
ec2_call() {
  local action=$1 form
  shift
  EC2_ERROR=
  aws_signer
  ((CURL_SIGNS)) || { LAST_ERROR="EC2 $action: curl cannot sign AWS requests" && return 1; }
  form_encode form "Action=$action" Version=2016-11-15 "$@"
  aws_query ec2 "" 'application/x-www-form-urlencoded; charset=utf-8' "$form" || return 1
  [[ $STATUS == 200 ]] && return 0
  EC2_ERROR=$(printf '%s' "$BODY" | ec2_xml error) || EC2_ERROR=
  LAST_ERROR="EC2 $action: HTTP $STATUS ${EC2_ERROR:-(no error code)}: $(printf '%s' "$BODY" | ec2_xml message || true)"
  EC2_ERROR=${EC2_ERROR:-HTTP$STATUS}
  return 1
}

# ec2_xml WHAT: reads an EC2 XML answer on stdin. "error" and "message" print the first error's code and message;
# "instanceState" or "currentState" print "<instance-id> <state name>" for each instance of the answer's
# instancesSet elements (DescribeInstances, StartInstances); "nextToken" prints the answer's NextToken, or nothing.
# Fails on input that is not XML.
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
elif what == "nextToken":
    print(root.findtext("nextToken") or "")
else:
    for instances in root.iter("instancesSet"):
        for item in instances.findall("item"):
            print(item.findtext("instanceId"), item.findtext(what + "/name"))
' "$1" 2>/dev/null
}

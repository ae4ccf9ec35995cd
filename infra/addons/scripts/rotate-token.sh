#!/usr/bin/env bash
# Issues a fresh kubeadm join token and hands it to the nodes: a bootstrap token Secret in kube-system that expires
# by itself, then the SSM SecureString the nodes read at boot, overwritten. Run by the join token rotator's CronJob
# (about every third of the token's lifetime) and once at install or on an emergency rotation (its Job).
#
# The previous token is left alone: a node that read it a moment ago still joins with it, and the controller
# manager's token cleaner deletes it when its expiration passes. The Secret format is the one the API server's
# bootstrap token authenticator and kubeadm read:
# https://kubernetes.io/docs/reference/access-authn-authz/bootstrap-tokens/ (token-id, token-secret, expiration as
# RFC 3339 UTC, the two usages, auth-extra-groups with kubeadm's node group).
#
# SSM is called directly with curl's SigV4 signing (curl 7.75 or newer), the request format of the SSM API
# (https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_PutParameter.html). The token secret and the
# AWS key secret never reach a command line or the log: they go to jq, kubectl and curl on stdin only.
#
# Environment: SSM_PARAMETER (the parameter name), KMS_KEY_ID (the key the parameter is encrypted with: a key ARN, or
# alias/aws/ssm for SSM's default; PutParameter is given it every time, so no overwrite leaves the key to SSM),
# AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, TOKEN_TTL_SECONDS; optional: NAMESPACE (default kube-system),
# SSM_ENDPOINT (default the region's), and whatever kubectl reads (in a pod: the service account; elsewhere
# KUBECONFIG).
set -euo pipefail
umask 077

log() { printf 'rotate-token: %s\n' "$*" >&2; }
fail() {
	log "FAILED: $*"
	exit 1
}

: "${SSM_PARAMETER:?SSM_PARAMETER is not set}" "${AWS_REGION:?AWS_REGION is not set}"
: "${KMS_KEY_ID:?KMS_KEY_ID is not set}"
: "${AWS_ACCESS_KEY_ID:?AWS_ACCESS_KEY_ID is not set}" "${AWS_SECRET_ACCESS_KEY:?AWS_SECRET_ACCESS_KEY is not set}"
: "${TOKEN_TTL_SECONDS:?TOKEN_TTL_SECONDS is not set}"
namespace=${NAMESPACE:-kube-system}
endpoint=${SSM_ENDPOINT:-https://ssm.$AWS_REGION.amazonaws.com}

# Strict shapes: the values below go into a curl config file and JSON documents, so none may carry a quote or a
# backslash.
[[ $TOKEN_TTL_SECONDS =~ ^[1-9][0-9]*$ ]] || fail "TOKEN_TTL_SECONDS='$TOKEN_TTL_SECONDS' is not a positive number"
[[ $AWS_REGION =~ ^[a-z]{2}(-[a-z]+)+-[0-9]+$ ]] || fail "AWS_REGION='$AWS_REGION' is not a region name"
[[ $SSM_PARAMETER =~ ^/[A-Za-z0-9_./-]+$ ]] || fail "SSM_PARAMETER='$SSM_PARAMETER' is not a parameter path"
[[ $KMS_KEY_ID =~ ^(arn:[a-z-]+:kms:[a-z0-9-]+:[0-9]{12}:)?(key|alias)/[A-Za-z0-9/_-]+$ ]] ||
	fail "KMS_KEY_ID='$KMS_KEY_ID' is not a KMS key ARN or alias"
[[ $AWS_ACCESS_KEY_ID =~ ^[A-Z0-9]{16,128}$ ]] || fail "AWS_ACCESS_KEY_ID is not an access key id"
[[ $AWS_SECRET_ACCESS_KEY =~ ^[A-Za-z0-9/+=]+$ ]] || fail "AWS_SECRET_ACCESS_KEY is not an access key secret"
for tool in kubectl curl jq; do
	command -v "$tool" >/dev/null || fail "$tool is not installed"
done

# random N: N characters of [a-z0-9], uniformly: tr keeps only those bytes of the kernel's random ones.
random() {
	local s
	s=$(head -c 1024 /dev/urandom | LC_ALL=C tr -dc 'a-z0-9')
	((${#s} >= $1)) || fail "could not draw $1 random characters"
	printf '%s' "${s:0:$1}"
}

id=$(random 6)
secret=$(random 16)
now=$(date -u +%s)
expiration=$(jq -rn --argjson t "$((now + TOKEN_TTL_SECONDS))" '$t | todate')
name=bootstrap-token-$id

# 1. The Secret first: a token in SSM that the cluster does not know yet would fail every join that reads it.
printf '%s' "$secret" | jq -R --arg id "$id" --arg ns "$namespace" --arg exp "$expiration" '{
	apiVersion: "v1",
	kind: "Secret",
	metadata: {
		name: ("bootstrap-token-" + $id),
		namespace: $ns,
		labels: {
			"app.kubernetes.io/name": "dynk8s-join-token",
			"app.kubernetes.io/part-of": "dynk8s",
			"app.kubernetes.io/managed-by": "dynk8s-join-token-rotator"
		}
	},
	type: "bootstrap.kubernetes.io/token",
	stringData: {
		"description": ("dynk8s node join token, issued by the join token rotator; expires " + $exp),
		"token-id": $id,
		"token-secret": .,
		"expiration": $exp,
		"usage-bootstrap-authentication": "true",
		"usage-bootstrap-signing": "true",
		"auth-extra-groups": "system:bootstrappers:dynk8s:pool-nodes"
	}
}' | kubectl create --filename - --output name >/dev/null || fail "could not create Secret $namespace/$name"
log "created Secret $namespace/$name, expiring $expiration"

# 2. Then SSM. The body and the credentials go to curl as its config on stdin.
body=$(printf '%s.%s' "$id" "$secret" | jq -cR --arg name "$SSM_PARAMETER" --arg key "$KMS_KEY_ID" \
	'{Name: $name, Value: ., Type: "SecureString", KeyId: $key, Overwrite: true}')
quoted=${body//\\/\\\\}
quoted=${quoted//\"/\\\"}
config="user = \"$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY\""$'\n'"data-binary = \"$quoted\""
rc=0
out=$(printf '%s' "$config" | curl -sS --max-time 30 --config - --aws-sigv4 "aws:amz:$AWS_REGION:ssm" \
	-H 'Content-Type: application/x-amz-json-1.1' -H 'X-Amz-Target: AmazonSSM.PutParameter' \
	-w '\n%{http_code}' "$endpoint/" 2>&1) || rc=$?
status=${out##*$'\n'}
answer=${out%$'\n'*}
if ((rc != 0)) || [[ $status != 200 ]]; then
	# The answer is an error document or curl's message; neither holds the token.
	fail "SSM PutParameter $SSM_PARAMETER: curl exit $rc, HTTP $status: ${answer//$'\n'/ }" \
		"(Secret $namespace/$name stays unused until it expires)"
fi
version=$(printf '%s' "$answer" | jq -r '.Version // empty' 2>/dev/null || true)
log "wrote token $id to SSM parameter $SSM_PARAMETER (version ${version:-unknown}); the previous token expires on its own"

#!/usr/bin/env bash
# Approves the kubelet client certificate of a dynk8s pool node, and only that: run by the Deployment
# dynk8s-node-csr-approver in kube-system (infra/addons/approver.go puts this file into a ConfigMap).
#
# The join tokens the rotator issues authenticate with BOOTSTRAP_GROUP, a group of dynk8s's own that kubeadm's
# auto-approval binding (kubeadm:node-autoapprove-bootstrap) does not name, so the controller manager's approver
# leaves their CSRs alone: its check is only that the requester may create nodeclient CSRs and that the common name
# starts with system:node: (kubernetes pkg/controller/certificates/approver/sarapprove.go), which would give a token
# holder a certificate for any node name. This script approves a CSR of that group only when all of these hold:
#   - its signer is kubernetes.io/kube-apiserver-client-kubelet and its usages are a kubelet client's;
#   - its request is a PKCS#10 request whose subject is exactly O=system:nodes and CN=system:node:<instance id>,
#     with no other attribute and no extension (read by the strict DER reader below: the stock image has no
#     openssl, and the CN is what the certificate will authenticate as);
#   - EC2 says that instance is pending or running, carries this cluster's dynk8s:cluster tag, belongs to an Auto
#     Scaling group (aws:autoscaling:groupName) and to one of POOLS (its dynk8s:pool tag);
#   - no Node of that name exists, and no CSR has been approved by this script for that name before.
# Anything else of the group is denied, with the reason in the CSR's Denied condition and in the log. A CSR that EC2
# cannot be asked about stays pending and is judged again a little later: the approver fails closed, and a kubelet
# whose CSR is never approved does not join (kubeadm join fails at kubelet-start). CSRs of other groups and signers
# (on-prem kubelets, certificate renewals, serving certificates) are not this script's and are never touched.
#
# What the API server cannot tell: the address a CSR came from (a CertificateSigningRequest records the requester's
# user, groups and uid, not its connection), so the instance's private IP is not compared; see docs/security.md,
# "Node identity", for what a token holder can still do.
#
# Environment: BOOTSTRAP_GROUP, CLUSTER_NAME, POOLS (space-separated pool names); the AWS CLI reads
# AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION (an IAM user allowed ec2:DescribeInstances);
# EC2_ENDPOINT_URL, when set, points it at a stand-in (tests); APPROVER_ONCE=1 judges what one watch delivers and
# exits (tests). kubectl uses the pod's service account.
set -euo pipefail

log() { printf 'approve-csr: %s\n' "$*"; }

: "${BOOTSTRAP_GROUP:?BOOTSTRAP_GROUP must name the group of the join tokens}"
: "${CLUSTER_NAME:?CLUSTER_NAME must name the cluster}" "${POOLS:?POOLS must name the pools}"
[[ $BOOTSTRAP_GROUP =~ ^system:bootstrappers:[a-z0-9:-]+$ ]] || {
	log "BOOTSTRAP_GROUP='$BOOTSTRAP_GROUP' is not a bootstrap token group" >&2
	exit 2
}
for tool in kubectl aws jq base64 od sed; do
	command -v "$tool" >/dev/null || {
		log "$tool is not installed" >&2
		exit 2
	}
done

readonly SIGNER=kubernetes.io/kube-apiserver-client-kubelet
# RETRY_SECONDS spaces the three judgements in a row of a CSR that EC2 could not be asked about; WATCH_SECONDS is
# how long one watch runs before the next one lists the pending CSRs again.
readonly RETRY_SECONDS=3 WATCH_SECONDS=300

# subject_of: the request's subject as JSON {"cn":[...],"o":[...],"other":N}, from the base64 of the PEM request
# in $1; fails with a reason on stderr for anything but a well-formed request with a plain subject and no
# attributes. The DER reader takes definite lengths up to 65535 bytes, the form every CSR of a kubelet has.
subject_of() {
	local der
	der=$(printf '%s' "$1" | base64 -d 2>/dev/null | sed '/^-----/d' | base64 -d 2>/dev/null | od -An -v -tu1) ||
		{
			echo "the request is not base64 PEM" >&2
			return 1
		}
	# shellcheck disable=SC2016 # jq's own variables
	printf '%s' "$der" | jq -cs '
		def tlv($b; $i):
			$b[$i] as $tag | $b[$i + 1] as $n
			| (if $tag == null or $n == null then error("truncated")
				elif $n < 128 then [$i + 2, $n]
				elif $n == 129 and $b[$i + 2] >= 128 then [$i + 3, $b[$i + 2]]
				elif $n == 130 and $b[$i + 2] >= 1 then [$i + 4, $b[$i + 2] * 256 + $b[$i + 3]]
				else error("unsupported length") end) as [$s, $l]
			| if $s + $l > ($b | length) then error("truncated") else {tag: $tag, s: $s, e: ($s + $l)} end;
		def kids($b):
			. as $t
			| def from($i):
				if $i == $t.e then empty
				else tlv($b; $i) as $c | if $c.e > $t.e then error("overrun") else $c, from($c.e) end end;
			[from($t.s)];
		def want($tag): if .tag == $tag then . else error("tag \(.tag), want \($tag)") end;
		def text($b):
			if .tag != 12 and .tag != 19 then error("a subject value of tag \(.tag)") else . end
			| $b[.s:.e] | if all(.[]; . >= 32 and . < 127) then implode else error("a non-ASCII subject value") end;
		. as $b
		| tlv($b; 0) | want(48)
		| if .e != ($b | length) then error("trailing bytes") else . end
		| kids($b) | if length != 3 then error("not a PKCS#10 request") else .[0] end
		| want(48) | kids($b) as $info
		| if ($info | length) != 4 then error("not a PKCS#10 request body") else . end
		| ($info[0] | want(2) | $b[.s:.e]) as $version
		| if $version != [0] then error("version \($version)") else . end
		| ($info[3] | want(160) | if .e != .s then error("attributes or extensions") else . end)
		| [$info[1] | want(48) | kids($b)[] | want(49) | kids($b)[] | want(48) | kids($b)
			| if length != 2 then error("an attribute of \(length) parts") else . end
			| {oid: (.[0] | want(6) | $b[.s:.e]), value: (.[1] | text($b))}] as $attrs
		| {cn: [$attrs[] | select(.oid == [85, 4, 3]) | .value],
			o: [$attrs[] | select(.oid == [85, 4, 10]) | .value],
			other: ([$attrs[] | select(.oid != [85, 4, 3] and .oid != [85, 4, 10])] | length)}
	' 2>&1 | sed 's/^jq: error ([^)]*): //' | {
		read -r out
		[[ $out == '{'* ]] || {
			echo "the request is no plain PKCS#10 request: $out" >&2
			return 1
		}
		printf '%s\n' "$out"
	}
}

# instance_facts: "<group> <pool>" of instance $1 when EC2 says it is pending or running and carries this cluster's
# tag; "" when EC2 knows no such instance; fails, with the CLI's message on stderr, when EC2 cannot be asked.
instance_facts() {
	local out errors=${TMPDIR:-/tmp}/describe-instances.err
	if out=$(aws ${EC2_ENDPOINT_URL:+--endpoint-url "$EC2_ENDPOINT_URL"} ec2 describe-instances \
		--instance-ids "$1" \
		--filters "Name=instance-state-name,Values=pending,running" "Name=tag:dynk8s:cluster,Values=$CLUSTER_NAME" \
		--query "Reservations[].Instances[].[Tags[?Key=='aws:autoscaling:groupName'].Value|[0], Tags[?Key=='dynk8s:pool'].Value|[0]]" \
		--output text 2>"$errors"); then
		printf '%s\n' "$out"
		return 0
	fi
	if grep -q 'InvalidInstanceID.NotFound' "$errors"; then
		return 0
	fi
	cat "$errors" >&2
	return 1
}

# condition NAME TYPE REASON MESSAGE: sets the Approved or Denied condition through the approval subresource, on
# the CSR as the API server has it now (as kubectl certificate approve does, with a reason of our own).
condition() {
	kubectl get csr "$1" --output json | jq -c --arg type "$2" --arg reason "$3" --arg message "$4" '
		.status.conditions = ((.status.conditions // []) + [{type: $type, status: "True", reason: $reason,
			message: $message}])' |
		kubectl replace --raw "/apis/certificates.k8s.io/v1/certificatesigningrequests/$1/approval" --filename - \
			>/dev/null
}

deny() {
	log "deny $1: $2"
	condition "$1" Denied DynK8sNotALiveInstance "dynk8s-node-csr-approver: $2" || log "could not deny $1" >&2
}

# approved_before NODE: whether a CSR approved by this script names NODE (the approval message names it).
approved_before() {
	kubectl get csr --output json | jq -e --arg node "$1" '
		any(.items[].status.conditions[]?; .type == "Approved" and .reason == "DynK8sLiveInstance"
			and (.message | endswith(" node " + $node)))' >/dev/null
}

# judge: decides one CSR of the group, given as {name, request, usages} on one line of JSON. Returns 1 when the
# CSR must be judged again (EC2 could not be asked), else 0.
judge() {
	local name request usages subject cn o other node facts group pool err
	name=$(jq -r .name <<<"$1")
	request=$(jq -r .request <<<"$1")
	usages=$(jq -c '.usages | sort' <<<"$1")
	case $usages in
	'["client auth","digital signature"]' | '["client auth","digital signature","key encipherment"]') ;;
	*)
		deny "$name" "usages $usages are not a kubelet client certificate's"
		return 0
		;;
	esac
	if ! subject=$(subject_of "$request" 2>&1); then
		deny "$name" "$subject"
		return 0
	fi
	cn=$(jq -c .cn <<<"$subject")
	o=$(jq -c .o <<<"$subject")
	other=$(jq -r .other <<<"$subject")
	if [[ $o != '["system:nodes"]' || $other != 0 ]]; then
		deny "$name" "the subject's organizations are $o with $other other attributes, want exactly [\"system:nodes\"]"
		return 0
	fi
	node=$(jq -r 'if length == 1 then .[0] else "" end' <<<"$cn")
	node=${node#system:node:}
	if ! [[ $node =~ ^i-[0-9a-f]{8}([0-9a-f]{9})?$ ]]; then
		deny "$name" "the common name $cn is not system:node:<instance id>"
		return 0
	fi
	if kubectl get node "$node" --output name >/dev/null 2>&1; then
		deny "$name" "a Node named $node exists already"
		return 0
	fi
	if approved_before "$node"; then
		deny "$name" "a certificate for $node was approved before"
		return 0
	fi
	if ! facts=$(instance_facts "$node" 2>&1); then
		err=${facts//$'\n'/ }
		log "cannot ask EC2 about $node for $name; it stays pending: $err" >&2
		return 1
	fi
	read -r group pool <<<"$facts" || true
	if [[ -z $group || $group == None ]]; then
		deny "$name" "$node is no pending or running instance of an Auto Scaling group of cluster $CLUSTER_NAME"
		return 0
	fi
	if [[ " $POOLS " != *" $pool "* ]]; then
		deny "$name" "$node of group $group is in pool '$pool', not one of this stack's ($POOLS)"
		return 0
	fi
	log "approve $name: $node is a live instance of group $group, pool $pool"
	condition "$name" Approved DynK8sLiveInstance \
		"dynk8s-node-csr-approver: live instance of group $group, pool $pool, node $node" || {
		log "could not approve $name" >&2
		return 1
	}
}

# pending: the pending CSRs of the group from the watch on stdin, one line of {name, request, usages} each.
pending() {
	# shellcheck disable=SC2016 # jq's own variables
	jq --unbuffered -c --arg signer "$SIGNER" --arg group "$BOOTSTRAP_GROUP" '
		select(.spec.signerName == $signer
			and ((.spec.groups // []) | index($group)) and ((.status.conditions // []) | length) == 0
			and (.status.certificate // "") == "")
		| {name: .metadata.name, request: .spec.request, usages: (.spec.usages // [])}'
}

# As PID 1 of its container, bash would ignore SIGTERM without a trap, and the pod would wait for SIGKILL.
trap 'exit 143' TERM
log "judging kubelet client CSRs of $BOOTSTRAP_GROUP for cluster $CLUSTER_NAME, pools $POOLS"
while :; do
	# Each watch first lists every pending CSR, then follows new ones; it ends after WATCH_SECONDS (kubectl's
	# request timeout) and is renewed, so that a CSR left pending because EC2 could not be asked is judged again.
	while read -r csr; do
		for ((try = 1; ; try++)); do
			judge "$csr" && break
			((try < 3)) || break
			sleep "$RETRY_SECONDS"
		done
	done < <(kubectl get csr --watch --output json --request-timeout "${WATCH_SECONDS}s" | pending)
	[[ ${APPROVER_ONCE:-} == 1 ]] && exit 0
	sleep 1
done

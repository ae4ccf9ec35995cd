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
#   - its request is exactly one CERTIFICATE REQUEST PEM block with nothing around it, so that the bytes read here
#     are the bytes the API server and the signer read (they take the first block pem.Decode finds and skip any
#     text around it: kubernetes pkg/apis/certificates ParseCSR);
#   - that block is a PKCS#10 request whose subject is exactly O=system:nodes and CN=system:node:<instance id>, with
#     no other attribute and no extension (read by the strict DER reader below: the stock image has no openssl, and
#     the CN is what the certificate will authenticate as);
#   - EC2 says that instance is pending or running, carries this cluster's dynk8s:cluster tag, belongs to an Auto
#     Scaling group (aws:autoscaling:groupName) and to one of POOLS (its dynk8s:pool tag);
#   - no Node of that name exists, no CSR has been approved by this script for that name before, and no older
#     pending CSR claims the same name (the oldest claim of a name wins; the others are denied).
# Anything else of the group is denied, with the reason in the CSR's Denied condition and in the log. When EC2
# cannot be asked, the CSRs it would decide stay pending and are judged again a little later: the approver fails
# closed, and a kubelet whose CSR is never approved does not join (kubeadm join fails at kubelet-start). CSRs of
# other groups and signers (on-prem kubelets, certificate renewals, serving certificates) are never touched.
#
# It judges in rounds, so that a flood of CSRs cannot hold a real join back: each round lists the CSRs once, reads
# at most READS_PER_ROUND new pending requests of the group, the oldest and the newest half each, in one jq run (a
# request is read once in the approver's life), asks EC2 once for all live instances of the cluster, writes its
# approvals first, then at most DENIALS_PER_ROUND denials, and starts the next round at once while requests or
# denials are left. A round starts on every change a watch reports, and
# every RESYNC_SECONDS without one.
#
# What the API server cannot tell: the address a CSR came from (a CertificateSigningRequest records the requester's
# user, groups and uid, not its connection), so the instance's private IP is not compared; see docs/security.md,
# "Node identity", for what a token holder can still do.
#
# Environment: BOOTSTRAP_GROUP, CLUSTER_NAME, POOLS (space-separated pool names); the AWS CLI reads
# AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION (an IAM user allowed ec2:DescribeInstances);
# EC2_ENDPOINT_URL, when set, points it at a stand-in (tests); APPROVER_ONCE=1 judges the CSRs there are, in as many
# rounds as their denials take, and exits (tests). kubectl uses the pod's service account.
set -euo pipefail

log() { printf 'approve-csr: %s\n' "$*"; }

: "${BOOTSTRAP_GROUP:?BOOTSTRAP_GROUP must name the group of the join tokens}"
: "${CLUSTER_NAME:?CLUSTER_NAME must name the cluster}" "${POOLS:?POOLS must name the pools}"
[[ $BOOTSTRAP_GROUP =~ ^system:bootstrappers:[a-z0-9:-]+$ ]] || {
	log "BOOTSTRAP_GROUP='$BOOTSTRAP_GROUP' is not a bootstrap token group" >&2
	exit 2
}
for tool in kubectl aws jq base64 od sed mkfifo mktemp; do
	command -v "$tool" >/dev/null || {
		log "$tool is not installed" >&2
		exit 2
	}
done

readonly SIGNER=kubernetes.io/kube-apiserver-client-kubelet
# RETRY_SECONDS is the pause before the next round when a round could not finish (EC2 or the API server could not be
# asked); RESYNC_SECONDS the longest time between two rounds; WATCH_SECONDS how long one watch runs before the next.
readonly RETRY_SECONDS=3 RESYNC_SECONDS=30 WATCH_SECONDS=300
# A kubelet's request (an ECDSA P-256 key, the subject, no extensions) is under 700 bytes of base64; a request much
# larger than that is no kubelet's and is denied unread. DENIALS_PER_ROUND bounds the writes between two rounds,
# READS_PER_ROUND the requests read in one.
readonly MAX_REQUEST_BYTES=4096 DENIALS_PER_ROUND=20 READS_PER_ROUND=50
# PEM_BLOCK is what a request must be, whole: one block, no headers, no text before or after it (a trailing line
# break is what pem.EncodeToMemory writes).
readonly PEM_BLOCK=$'^-----BEGIN CERTIFICATE REQUEST-----\n[A-Za-z0-9+/=\n]+\n-----END CERTIFICATE REQUEST-----$'

WORK=$(mktemp -d "${TMPDIR:-/tmp}/approve-csr.XXXXXX")
readonly WORK
declare -A READ   # CSR uid: "node <name>", or "deny <reason>", once its request was read
declare -A DENIED # CSR uid: 1 once its denial was written

# der_of: sets DER to the DER bytes of the base64 request in $1 as decimal numbers on one line; sets REASON and fails
# unless the request is exactly one CERTIFICATE REQUEST PEM block (PEM_BLOCK). Three programs a request: a flood
# of requests is read at the speed of forks.
der_of() {
	local pem body
	if ((${#1} > MAX_REQUEST_BYTES)); then
		REASON="the request is ${#1} bytes of base64, more than a kubelet's request ($MAX_REQUEST_BYTES)"
		return 1
	fi
	pem=$(base64 -d <<<"$1" 2>/dev/null) || {
		REASON="the request is not base64"
		return 1
	}
	[[ $pem =~ $PEM_BLOCK ]] || {
		REASON="the request is not exactly one CERTIFICATE REQUEST PEM block"
		return 1
	}
	body=${pem#*$'\n'}
	body=${body%$'\n'*}
	DER=$(base64 -d <<<"$body" 2>/dev/null | od -An -v -tu1) || {
		REASON="the request's PEM block is not base64"
		return 1
	}
	DER=${DER//$'\n'/ }
}

# VERDICTS reads lines "<uid>\t<DER bytes as decimal numbers>" and prints for each one "<uid>\tnode <name>" when
# the request is a well-formed PKCS#10 request whose subject is exactly O=system:nodes, CN=system:node:<instance id>
# with no other attribute and no extension, else "<uid>\tdeny <reason>". The DER reader takes definite lengths up to
# 65535 bytes, the form every CSR of a kubelet has.
# shellcheck disable=SC2016 # jq's own variables
readonly VERDICTS='
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
	def subject:
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
			other: ([$attrs[] | select(.oid != [85, 4, 3] and .oid != [85, 4, 10])] | length)};
	def verdict:
		if .o != ["system:nodes"] or .other != 0 then
			"deny the subject\u0027s organizations are \(.o | tojson) with \(.other) other attributes, want exactly [\"system:nodes\"]"
		elif (.cn | length) == 1 and (.cn[0] | test("^system:node:i-[0-9a-f]{8}([0-9a-f]{9})?$")) then
			"node \(.cn[0] | ltrimstr("system:node:"))"
		else "deny the common name \(.cn | tojson) is not system:node:<instance id>" end;
	split("\t") | .[0] as $uid
	| ([.[1] | splits(" ") | select(. != "") | tonumber]) as $b
	| "\($uid)\t" + (try ($b | subject | verdict) catch "deny the request is no plain PKCS#10 request: \(.)")
'

# live_instances: "<id> <group> <pool>" per line for every pending or running instance that carries this cluster's
# tag, in one call (a flood of CSRs naming instances costs no EC2 call each); fails, with the CLI's message on
# stderr, when EC2 cannot be asked.
live_instances() {
	local errors=$WORK/describe-instances.err
	aws ${EC2_ENDPOINT_URL:+--endpoint-url "$EC2_ENDPOINT_URL"} ec2 describe-instances \
		--filters "Name=instance-state-name,Values=pending,running" "Name=tag:dynk8s:cluster,Values=$CLUSTER_NAME" \
		--query "Reservations[].Instances[].[InstanceId, Tags[?Key=='aws:autoscaling:groupName'].Value|[0], Tags[?Key=='dynk8s:pool'].Value|[0]]" \
		--output text 2>"$errors" || {
		cat "$errors" >&2
		return 1
	}
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

# round: one judgement of every pending CSR of the group. Returns 0 when it is done, 1 when it could not finish (the
# API server or EC2 could not be asked: the CSRs left stay pending), 2 when denials are left for the next round.
round() {
	local list=$WORK/list.json pending=$WORK/pending.tsv name uid usages request line verdict node err
	local -A approved=() claimed=() facts=()
	local -a order=() denials=()
	kubectl get csr --output json >"$list" || {
		log "cannot list the CSRs; trying again" >&2
		return 1
	}
	# The pending CSRs of the group, oldest first: name, uid, usages, request.
	# shellcheck disable=SC2016 # jq's own variables
	jq -r --arg signer "$SIGNER" --arg group "$BOOTSTRAP_GROUP" '
		[.items[] | select(.spec.signerName == $signer
			and ((.spec.groups // []) | index($group)) and ((.status.conditions // []) | length) == 0
			and (.status.certificate // "") == "")]
		| sort_by(.metadata.creationTimestamp // "", .metadata.name)[]
		| [.metadata.name, (.metadata.uid // .metadata.name),
			((.spec.usages // []) | sort | join(",") | if . == "" then "-" else . end), .spec.request] | @tsv' "$list" >"$pending"
	# The names this script approved before, as long as their CSRs are kept (the controller manager deletes approved
	# CSRs after an hour: kubernetes pkg/controller/certificates/cleaner).
	while read -r node; do
		[[ -n $node ]] && approved[$node]=1
	done < <(jq -r '.items[].status.conditions[]? | select(.type == "Approved" and .reason == "DynK8sLiveInstance")
		| .message | capture(" node (?<n>i-[0-9a-f]+)$").n' "$list")

	# Read the requests not read before, at most READS_PER_ROUND of them, the oldest and the newest half each (a
	# kubelet's request made before a flood and one made after it are both read in the next round): the cheap
	# refusals here, the subjects in one jq run.
	local -a unread=()
	local -A reading=()
	while IFS=$'\t' read -r name uid usages request; do
		order+=("$name"$'\t'"$uid")
		[[ -n ${READ[$uid]:-} ]] || unread+=("$uid")
	done <"$pending"
	local i n=${#unread[@]} half=$((READS_PER_ROUND / 2)) status=0
	for ((i = 0; i < n; i++)); do
		if ((n <= READS_PER_ROUND || i < half || i >= n - half)); then
			reading[${unread[i]}]=1
		fi
	done
	((n <= READS_PER_ROUND)) || status=2
	: >"$WORK/der.tsv"
	while IFS=$'\t' read -r name uid usages request; do
		[[ -n ${reading[$uid]:-} ]] || continue
		case $usages in
		'client auth,digital signature' | 'client auth,digital signature,key encipherment') ;;
		*)
			# shellcheck disable=SC2016 # jq's own variable
			READ[$uid]="deny usages $(jq -cn --arg u "$usages" '$u | split(",") - ["-"]') are not a kubelet client certificate's"
			continue
			;;
		esac
		if ! der_of "$request"; then
			READ[$uid]="deny $REASON"
			continue
		fi
		printf '%s\t%s\n' "$uid" "$DER" >>"$WORK/der.tsv"
	done <"$pending"
	if [[ -s $WORK/der.tsv ]]; then
		while IFS=$'\t' read -r uid verdict; do
			READ[$uid]=$verdict
		done < <(jq -r -R "$VERDICTS" "$WORK/der.tsv")
	fi

	# Ask EC2 once, for all the claims of a name; then approve, and queue the denials.
	local need_ec2=0
	for line in "${order[@]}"; do
		uid=${line#*$'\t'}
		[[ ${READ[$uid]:-} == node\ * ]] && need_ec2=1
	done
	local rc=0 ec2=1 id group pool
	if ((need_ec2)); then
		if err=$(live_instances 2>&1 >"$WORK/instances.txt"); then
			while read -r id group pool; do
				[[ -n $id ]] && facts[$id]="$group $pool"
			done <"$WORK/instances.txt"
		else
			log "cannot ask EC2 about the instances the pending CSRs name; they stay pending: ${err//$'\n'/ }" >&2
			ec2=0 rc=1
		fi
	fi
	for line in "${order[@]}"; do
		name=${line%%$'\t'*} uid=${line#*$'\t'}
		[[ -n ${DENIED[$uid]:-} ]] && continue
		verdict=${READ[$uid]:-}
		[[ -n $verdict ]] || continue # not read yet: a later round reads it
		if [[ $verdict == deny\ * ]]; then
			denials+=("$name"$'\t'"$uid"$'\t'"${verdict#deny }")
			continue
		fi
		((ec2)) || continue
		node=${verdict#node }
		if [[ -n ${claimed[$node]:-} ]]; then
			denials+=("$name"$'\t'"$uid"$'\t'"an older pending CSR, ${claimed[$node]}, claims $node")
			continue
		fi
		claimed[$node]=$name
		if [[ -n ${approved[$node]:-} ]]; then
			denials+=("$name"$'\t'"$uid"$'\t'"a certificate for $node was approved before")
			continue
		fi
		read -r group pool <<<"${facts[$node]:-}" || true
		if [[ -z $group || $group == None ]]; then
			denials+=("$name"$'\t'"$uid"$'\t'"$node is no pending or running instance of an Auto Scaling group of cluster $CLUSTER_NAME")
			continue
		fi
		if [[ " $POOLS " != *" $pool "* ]]; then
			denials+=("$name"$'\t'"$uid"$'\t'"$node of group $group is in pool '$pool', not one of this stack's ($POOLS)")
			continue
		fi
		# Asked last, just before the approval: a Node of that name may have registered since the round began.
		if kubectl get node "$node" --output name >/dev/null 2>&1; then
			denials+=("$name"$'\t'"$uid"$'\t'"a Node named $node exists already")
			continue
		fi
		log "approve $name: $node is a live instance of group $group, pool $pool"
		if condition "$name" Approved DynK8sLiveInstance \
			"dynk8s-node-csr-approver: live instance of group $group, pool $pool, node $node"; then
			approved[$node]=1
		else
			log "could not approve $name" >&2
			rc=1
		fi
	done
	local written=0 reason
	for line in "${denials[@]}"; do
		if ((written == DENIALS_PER_ROUND)); then
			status=2
			break
		fi
		IFS=$'\t' read -r name uid reason <<<"$line"
		log "deny $name: $reason"
		if condition "$name" Denied DynK8sNotALiveInstance "dynk8s-node-csr-approver: $reason"; then
			DENIED[$uid]=1
		else
			log "could not deny $name" >&2
		fi
		written=$((written + 1))
	done
	# Forget what was read of CSRs that are no longer pending.
	local -A now=()
	for line in "${order[@]}"; do
		now[${line#*$'\t'}]=1
	done
	for uid in "${!READ[@]}"; do
		[[ -n ${now[$uid]:-} ]] || unset "READ[$uid]" "DENIED[$uid]"
	done
	((rc == 0)) || return "$rc"
	return "$status"
}

# As PID 1 of its container, bash would ignore SIGTERM without a trap, and the pod would wait for SIGKILL.
trap 'exit 143' TERM
trap '[[ -z ${WATCHER:-} ]] || kill "$WATCHER" 2>/dev/null || true; rm -rf "$WORK"' EXIT
trap 'log "failed at line $LINENO: $BASH_COMMAND" >&2' ERR
log "judging kubelet client CSRs of $BOOTSTRAP_GROUP for cluster $CLUSTER_NAME, pools $POOLS"
if [[ ${APPROVER_ONCE:-} == 1 ]]; then
	status=2
	while ((status == 2)); do
		status=0
		round || status=$?
	done
	exit 0
fi
# The watch only wakes the rounds up: each change it reports is a line on the FIFO. It runs from before the first
# round, so a CSR created while a round runs starts the next one.
mkfifo "$WORK/events"
(
	while :; do
		kubectl get csr --watch-only --output name --request-timeout "${WATCH_SECONDS}s" || sleep 1
	done
) >"$WORK/events" &
WATCHER=$!
exec 3<"$WORK/events"
while :; do
	status=0
	round || status=$?
	case $status in
	1) sleep "$RETRY_SECONDS" ;;
	2) ;;
	*)
		# Until the next change, or RESYNC_SECONDS; then take whatever else came in the same breath.
		read -r -t "$RESYNC_SECONDS" -u 3 _ || true
		while read -r -t 0.2 -u 3 _; do :; done
		;;
	esac
done

#!/bin/sh
# Stale-node cleanup for dynk8s pool nodes, run every few minutes by the CronJob dynk8s-stale-node-cleanup in
# kube-system (infra/addons/cleanup.go puts this file into a ConfigMap).
#
# The Cluster Autoscaler terminates instances but never deletes their Node objects, and an on-prem cluster has no
# cloud controller manager to do it, so the Node of every terminated instance stays NotReady for good. Such nodes
# count towards the autoscaler's unready limits (above 45% unready it stops acting) and clutter the cluster.
#
# A Node is deleted only when all of these hold:
#   - it carries the label POOL_LABEL, which every dynk8s pool node sets, and its providerID is an AWS one
#     (aws:///<zone>/<instance-id>), so an on-prem node is never touched even if someone labels it;
#   - that zone is in AWS_DEFAULT_REGION, the one region whose EC2 it asks;
#   - its Ready condition is False or Unknown;
#   - that condition last changed more than NOT_READY_AFTER_SECONDS ago;
#   - and EC2 says the instance is gone: ec2:DescribeInstances answers terminated or shutting-down, or no longer
#     knows the instance id (InvalidInstanceID.NotFound, about an hour after termination).
# The Node of an instance that still exists (pending, running, stopping, stopped) is never deleted, however long it
# has been NotReady: a tunnel outage makes every node NotReady, and a kubelet does not re-create its Node once it has
# registered (kubernetes/kubernetes#71398), so deleting it would strand a live instance. When EC2 cannot be asked the
# node is kept and the run fails.
#
# Environment: POOL_LABEL (label key), NOT_READY_AFTER_SECONDS (positive integer); the AWS CLI reads
# AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION (an IAM user allowed ec2:DescribeInstances and
# nothing else); EC2_ENDPOINT_URL, when set, points it at a stand-in (tests). kubectl uses the pod's service account.
# The exit status is 1 when a node could not be judged or deleted, so that the Job shows the failure.
set -eu

: "${POOL_LABEL:?POOL_LABEL must name the pool label key}"
: "${NOT_READY_AFTER_SECONDS:?NOT_READY_AFTER_SECONDS must be set}"
case $NOT_READY_AFTER_SECONDS in
'' | *[!0-9]* | 0)
	echo "NOT_READY_AFTER_SECONDS must be a positive integer, got '$NOT_READY_AFTER_SECONDS'" >&2
	exit 2
	;;
esac

# epoch_seconds prints the Unix time of a timestamp as the API server writes it (RFC 3339 in UTC, whole seconds:
# 2006-01-02T15:04:05Z). It uses shell arithmetic only, so it does not depend on which date(1) the image has.
epoch_seconds() {
	case $1 in
	[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]Z) ;;
	*) return 1 ;;
	esac
	y=${1%%-*}
	rest=${1#*-}
	mo=${rest%%-*}
	rest=${rest#*-}
	d=${rest%%T*}
	rest=${rest#*T}
	h=${rest%%:*}
	rest=${rest#*:}
	mi=${rest%%:*}
	rest=${rest#*:}
	s=${rest%Z}
	# Without the leading zero, shell arithmetic does not read "08" as a bad octal number.
	mo=${mo#0} d=${d#0} h=${h#0} mi=${mi#0} s=${s#0}
	# Days since 1970-01-01 from a proleptic Gregorian date (H. Hinnant's days_from_civil), with the year
	# starting in March so that the leap day comes last.
	if [ "$mo" -le 2 ]; then
		y=$((y - 1))
	fi
	era=$((y / 400))
	yoe=$((y - era * 400))
	doy=$(((153 * ((mo + 9) % 12) + 2) / 5 + d - 1))
	doe=$((yoe * 365 + yoe / 4 - yoe / 100 + doy))
	echo $((((era * 146097 + doe - 719468) * 86400) + h * 3600 + mi * 60 + s))
}

# instance_state prints the EC2 state of instance $1 (pending, running, ..., terminated), or "gone" when EC2 no
# longer knows it; it fails, with the CLI's message on stderr, when EC2 cannot be asked.
instance_state() {
	errors=${TMPDIR:-/tmp}/describe-instances.err
	if out=$(aws ${EC2_ENDPOINT_URL:+--endpoint-url "$EC2_ENDPOINT_URL"} ec2 describe-instances \
		--instance-ids "$1" --query 'Reservations[].Instances[].State.Name' --output text 2>"$errors"); then
		echo "${out:-gone}"
		return 0
	fi
	if grep -q 'InvalidInstanceID.NotFound' "$errors"; then
		echo gone
		return 0
	fi
	cat "$errors" >&2
	return 1
}

now=$(date -u +%s)
# One line per pool node: name|providerID|Ready status|Ready lastTransitionTime. "|" rather than blanks, because
# read merges adjacent blanks and an empty providerID would shift the fields.
nodes=$(kubectl get nodes --selector "$POOL_LABEL" --output \
	'jsonpath={range .items[*]}{.metadata.name}{"|"}{.spec.providerID}{"|"}{range .status.conditions[?(@.type=="Ready")]}{.status}{"|"}{.lastTransitionTime}{end}{"\n"}{end}')

failed=0
while IFS='|' read -r name provider status since; do
	[ -n "$name" ] || continue
	case $provider in
	aws://*) ;;
	*)
		echo "skip $name: providerID '$provider' is not an AWS one"
		continue
		;;
	esac
	case $status in
	True) continue ;;
	False | Unknown) ;;
	*)
		echo "skip $name: no Ready condition yet"
		continue
		;;
	esac
	if ! since_epoch=$(epoch_seconds "$since"); then
		echo "node $name: cannot read the Ready condition's lastTransitionTime '$since'" >&2
		failed=1
		continue
	fi
	age=$((now - since_epoch))
	if [ "$age" -le "$NOT_READY_AFTER_SECONDS" ]; then
		echo "keep $name: Ready=$status for ${age}s, not more than ${NOT_READY_AFTER_SECONDS}s"
		continue
	fi
	# Only this region's EC2 is asked, and it knows no other region's instance: a zone of another region (another
	# stack's node) would look gone. A zone is the region and a letter, or a Local Zone, the region and -<city>-...
	zone=${provider#aws:///}
	zone=${zone%%/*}
	if [ -n "${AWS_DEFAULT_REGION:-}" ]; then
		case $zone in
		"$AWS_DEFAULT_REGION"[a-z] | "$AWS_DEFAULT_REGION"-[a-z]*) ;;
		*)
			echo "skip $name: zone $zone is not in $AWS_DEFAULT_REGION, whose EC2 this cleanup asks"
			continue
			;;
		esac
	fi
	instance=${provider##*/}
	case $instance in
	i-[0-9a-f]*) ;;
	*)
		echo "node $name: providerID '$provider' names no instance" >&2
		failed=1
		continue
		;;
	esac
	if ! state=$(instance_state "$instance"); then
		echo "node $name: cannot ask EC2 about $instance; keeping it" >&2
		failed=1
		continue
	fi
	case $state in
	terminated | shutting-down | gone) ;;
	*)
		echo "keep $name: Ready=$status for ${age}s, but instance $instance is $state"
		continue
		;;
	esac
	echo "delete $name: Ready=$status for ${age}s, more than ${NOT_READY_AFTER_SECONDS}s, instance $instance $state"
	if ! kubectl delete node "$name" --wait=false; then
		echo "node $name: delete failed" >&2
		failed=1
	fi
done <<EOF
$nodes
EOF

exit "$failed"

#!/bin/sh
# Removes this node's fuse startup taint once the fuse device plugin beside it has made the node advertise the
# extended resource, then idles. Until then the Cluster Autoscaler counts the node as still starting, not as a node
# that lacks what the pending pods request, and adds no other node for them.
#
# A plugin that never advertises (an image that cannot be pulled, say) must not keep every other pod off the node:
# after GIVE_UP_SECONDS the taint goes anyway, with a warning.
#
# Environment: NODE_NAME (the downward API), TAINT_KEY, RESOURCE (github.com/fuse), POLL_SECONDS (default 2),
# GIVE_UP_SECONDS (default 300).
set -eu
trap 'exit 0' TERM INT

: "${NODE_NAME:?NODE_NAME is not set}" "${TAINT_KEY:?TAINT_KEY is not set}" "${RESOURCE:?RESOURCE is not set}"
poll=${POLL_SECONDS:-2}
give_up=${GIVE_UP_SECONDS:-300}
start=$(date +%s)
# jsonpath needs the dots of the resource name escaped: github.com/fuse -> github\.com/fuse.
resource_path=$(printf '%s' "$RESOURCE" | sed 's/\./\\./g')

# A node that cannot be read (the API server not reachable yet, while the pod network comes up) is not a node without
# the taint: the script asks again instead of idling with the taint left on.
while :; do
	if ! keys=$(kubectl get node "$NODE_NAME" --output "jsonpath={.spec.taints[?(@.key==\"$TAINT_KEY\")].key}"); then
		echo "cannot read node $NODE_NAME; trying again"
		sleep "$poll"
		continue
	fi
	[ -n "$keys" ] || break
	have=$(kubectl get node "$NODE_NAME" --output "jsonpath={.status.allocatable.$resource_path}") || have=
	if [ -n "$have" ] && [ "$have" != 0 ]; then
		echo "node $NODE_NAME offers $have $RESOURCE: removing the startup taint $TAINT_KEY"
		kubectl taint node "$NODE_NAME" "$TAINT_KEY-" || echo "removing the taint failed; trying again"
	elif [ $(($(date +%s) - start)) -ge "$give_up" ]; then
		echo "WARNING: node $NODE_NAME advertises no $RESOURCE after ${give_up} s (is the device plugin running?):" \
			"removing the startup taint $TAINT_KEY so that other pods can run"
		kubectl taint node "$NODE_NAME" "$TAINT_KEY-" || echo "removing the taint failed; trying again"
	fi
	sleep "$poll"
done
echo "node $NODE_NAME carries no $TAINT_KEY taint"
# A sidecar that exits would be restarted in a loop; this one has nothing more to do but wait to be stopped. As its
# container's PID 1, the shell (or a sleep it execs) ignores SIGTERM unless trapped, and every stop of the pod (a drain,
# the node's shutdown) would wait out the grace period: the trap ends it at once (the sleep in the background, so
# that the trap runs while it waits, and ended with it).
sleep 2147483647 &
idle=$!
trap 'kill "$idle"; exit 0' TERM INT
wait "$idle"

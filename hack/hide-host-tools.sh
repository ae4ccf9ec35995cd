#!/usr/bin/env bash
# Runs a command with host tools hidden: in a private mount namespace, /dev/null is bound over every copy on PATH of
# each tool named in HIDE (default: what the boot scripts check for or touch), so a test that still reaches one of
# them fails or skips instead of passing on what this host happens to have. Root only (unshare -m).
#
#   hack/hide-host-tools.sh go test -count=1 ./cloudinit/
#   HIDE="iptables ip mount" DYNK8S_REQUIRE_TOOLS=1 hack/hide-host-tools.sh go test -count=1 ./cloudinit/
set -euo pipefail
if [[ -z ${DYNK8S_HIDDEN:-} ]]; then
	DYNK8S_HIDDEN=1 exec unshare -m "$0" "$@"
fi
# mount itself may be hidden: bind with a copy of it.
m=$(mktemp)
cp "$(command -v mount)" "$m"
chmod +x "$m"
read -ra hide <<<"${HIDE:-iptables iptables-legacy iptables-nft nft ip modprobe sysctl aws logger systemctl dnf rpm crictl kubeadm kubectl curl jq nsenter mount}"
for t in "${hide[@]}"; do
	for p in $(type -ap "$t" 2>/dev/null); do
		"$m" --bind /dev/null "$p"
		echo "hidden $p" >&2
	done
done
rm -f "$m"
exec "$@"

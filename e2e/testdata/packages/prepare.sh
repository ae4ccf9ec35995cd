#!/usr/bin/env bash
# One instance's package phase on real dnf and rpm, in a root run by systemd-nspawn (not booted, on a throwaway
# overlay): first what a Fedora Cloud image has and the box cannot (an rpm database that provides what the packages
# require, Fedora's dnf.conf, the fedora and updates repositories, here local), then the instance's own part exactly
# as on EC2 (cloud-init's yum_add_repo writes the user data's repositories, the agent's command: a node's
# `dynk8s-node prepare`, the gateway's `dynk8s-node gateway-packages`), then what the test reads, each part after a
# "== name" line. Inputs (environment): REPOS (build-repos.sh's output), USERDATA (the user data's files under
# files/, its repositories in repos.yaml), ADD_REPOS (cloud-init's repositories step; none for the gateway), AGENT
# (the agent's command line; default the node's prepare), FEDORA (the fedora repository's directory under REPOS;
# default fedora), AFTER (commands the test runs after the agent, under "== after").
set -uo pipefail
: "${REPOS:?}" "${USERDATA:?}"
AGENT=${AGENT:-dynk8s-node prepare --config /etc/dynk8s/node.json}
fail() { echo "prepare.sh: $*" >&2 && exit 1; }

# rpm's database where Fedora keeps it (bookworm's rpm would keep it in ~/.rpmdb).
mkdir -p /etc/rpm && echo '%_dbpath /usr/lib/sysimage/rpm' >/etc/rpm/macros.dynk8s-box
if command -v dnf5 >/dev/null; then
	# Fedora's dnf5 package: /usr/bin/dnf is dnf5, and dnf.conf holds [main] only (dnf5's defaults,
	# skip_if_unavailable false among them).
	ln -sf dnf5 /usr/bin/dnf
	printf '[main]\n' >/etc/dnf/dnf.conf
else
	# dnf4: Debian's dnf.conf is Fedora's (best=False, skip_if_unavailable=True). A Fedora Cloud image has no
	# versionlock plugin: the root's goes, and the fedora repository has it as python3-dnf-plugin-versionlock.
	rm -f /usr/lib/python3/dist-packages/dnf-plugins/versionlock.py /etc/dnf/plugins/versionlock.conf
fi
# Not booted, systemd is not running: systemctl daemon-reload and start fail on both roots, and bookworm's
# systemctl (252) refuses `enable --now` where forky's (262) enables the unit and says it ignores --now. This
# wrapper, the one stand-in of the run, does what 262 does for both, and makes daemon-reload (nothing is loaded to
# reload) and start (the node's CRI-O: nothing runs here) no-ops; enable writes its links on either root.
cat >/usr/local/bin/systemctl <<-'EOF'
	#!/bin/sh
	[ "$1" = daemon-reload ] && echo "(box) daemon-reload: systemd is not running" >&2 && exit 0
	[ "$1" = start ] && echo "(box) $*: systemd is not running" >&2 && exit 0
	for a; do shift; [ "$a" = --now ] && echo "(box) ignoring --now: systemd is not running" >&2 || set -- "$@" "$a"; done
	exec /usr/bin/systemctl "$@"
EOF
chmod +x /usr/local/bin/systemctl
rpm -i --quiet "$REPOS"/image/*.rpm || fail "rpm -i of the image package failed"
mkdir -p /etc/yum.repos.d
for repo in fedora updates; do
	dir=$repo
	[ "$repo" = fedora ] && dir=${FEDORA:-fedora}
	printf '[%s]\nname=Fedora 43 %s (dynk8s e2e)\nbaseurl=file://%s/%s/\nenabled=1\ngpgcheck=1\ngpgkey=file://%s/key.asc\nskip_if_unavailable=False\n' \
		"$repo" "$repo" "$REPOS" "$dir" "$REPOS" >"/etc/yum.repos.d/$repo.repo"
done

cp -a "$USERDATA/files/." / || fail "laying out the user data's files failed"
[ -z "${ADD_REPOS:-}" ] || bash -euo pipefail -c "$ADD_REPOS" >/dev/null || fail "cloud-init's yum_add_repo failed"

echo "== agent"
start=$(date +%s.%N)
$AGENT 2>&1
rc=$?
echo "rc=$rc took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')"
echo "== rpm -qa"
rpm -qa --qf '%{NEVRA}\n' | sort
echo "== after"
bash -uo pipefail -c "${AFTER:-}" 2>&1
echo "== the end"

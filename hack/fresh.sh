#!/usr/bin/env bash
# The fresh-machine check: runs the test command (`make test`) on a clean clone of the committed HEAD,
# inside a Debian bookworm root that holds only CONTRIBUTING.md's prerequisites (git, make, ca-certificates; the Go
# toolchain bound in read-only). Whatever else the tests need, the repository must install itself (`make tools`), so
# this fails when an install step is missing, which no run on a developer's or CI's long-lived machine can see.
#
# Usage: hack/fresh.sh            (as root: mmdebstrap and systemd-nspawn need it)
#
# The root is built once with mmdebstrap (Debian package) and cached beside the other tools, keyed by its suite and
# package list; each run boots a throwaway overlay of it (systemd-nspawn --volatile=overlay), so the cached root never
# changes. Two caches make a second run faster without hiding a missing step: the host's Go module downloads are
# served read-only as the first GOPROXY (a module the host lacks comes from the real proxy, as on a fresh machine),
# and the compiled packages are kept in a build cache of this check's own (content-addressed: it can only save
# compiling, never supply a tool).
#
# Environment:
#   DYNK8S_TOOLS_DIR    the tools cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/dynk8s/tools)
#   DYNK8S_FRESH_KEEP   set to keep the work directory (clone, GOPATH) after the run, for a look
set -euo pipefail

readonly SUITE=bookworm
# CONTRIBUTING.md's prerequisites that Debian packages (the Go toolchain is bound in, as the machine has it in /usr/local/go).
readonly PACKAGES=(git make ca-certificates)
readonly BOX_GOROOT=/usr/local/go
readonly BOX_MODULES=/var/cache/dynk8s-host-modules
# The machine's trust anchors (a machine may trust a CA of its own network's, as this project's machines do), bound
# in where the box's own ca-certificates cannot rewrite them, and named by the variables Go, git and curl read.
readonly HOST_CA=/etc/ssl/certs/ca-certificates.crt
readonly BOX_CA=/run/dynk8s-host-ca-certificates.crt

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
readonly CACHE_DIR="${DYNK8S_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dynk8s/tools}"

log() {
	printf '[fresh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

die() {
	log "FAILED: $*"
	exit 1
}

[[ $(id -u) -eq 0 ]] || die "run as root: mmdebstrap and systemd-nspawn need it"

# host_tools: mmdebstrap and systemd-nspawn, from Debian.
host_tools() {
	local missing=() t
	for t in mmdebstrap:mmdebstrap systemd-nspawn:systemd-container; do
		command -v "${t%%:*}" >/dev/null || missing+=("${t##*:}")
	done
	((${#missing[@]} == 0)) && return
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# apt_args: the host's own package sources and the apt settings it reaches them with (Acquire::*), for a root that
# reaches the same sources as the host does. Without them, mmdebstrap's defaults.
apt_args() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
		[[ -s $f ]] && printf '%s\0' "$f"
	done
	for f in /etc/apt/apt.conf.d/*; do
		[[ -f $f ]] && grep -qE '^[[:space:]]*Acquire::' "$f" && printf -- '--aptopt=%s\0' "$f"
	done
	return 0
}

# build_root: the cached root, built when missing. Printed: its path.
build_root() {
	local key root tmp start=$SECONDS args=() sources=() a
	key=$(printf '%s\n' "$SUITE" "${PACKAGES[@]}" | sha256sum | cut -c1-12)
	root="$CACHE_DIR/fresh-root-$SUITE-$key"
	if [[ -x $root/usr/bin/git ]]; then
		log "root cached: $root"
		printf '%s\n' "$root"
		return
	fi
	while IFS= read -r -d '' a; do
		if [[ $a == --aptopt=* ]]; then args+=("$a"); else sources+=("$a"); fi
	done < <(apt_args)
	mkdir -p "$CACHE_DIR"
	tmp=$(mktemp -d "$CACHE_DIR/fresh-root.XXXX")
	log "building the root ($SUITE: ${PACKAGES[*]}) in $tmp"
	# A sources file is read only when it is the only source: mmdebstrap appends each given mirror.
	mmdebstrap --quiet --variant=minbase --include="$(
		IFS=,
		echo "${PACKAGES[*]}"
	)" "${args[@]}" "$SUITE" "$tmp" "${sources[@]}" >&2
	# A fresh machine runs `apt-get update` before it installs anything; so does `make tools`.
	rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin
	mv "$tmp" "$root"
	log "root built in $((SECONDS - start)) s ($(du -sh "$root" | cut -f1))"
	printf '%s\n' "$root"
}

work=
cleanup() {
	[[ -n $work && -z ${DYNK8S_FRESH_KEEP:-} ]] || return 0
	# Module files are read-only as Go writes them.
	chmod -R u+w "$work" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

main() {
	host_tools
	local root rev goroot modules proxy start gocache ca=() rc=0
	root=$(build_root)
	goroot=$(go env GOROOT)
	modules="$(go env GOMODCACHE)/cache/download"
	mkdir -p "$modules"
	proxy="file://$BOX_MODULES,$(go env GOPROXY)"
	gocache="$CACHE_DIR/fresh-gocache"
	mkdir -p "$gocache"

	rev=$(git -C "$REPO_ROOT" rev-parse HEAD)
	[[ -z $(git -C "$REPO_ROOT" status --porcelain) ]] ||
		log "note: uncommitted changes are not tested, only the committed HEAD $rev"
	work=$(mktemp -d "${TMPDIR:-/tmp}/dynk8s-fresh.XXXX")
	if [[ -s $HOST_CA ]]; then
		ca=(--bind-ro="$HOST_CA:$BOX_CA" --setenv=SSL_CERT_FILE="$BOX_CA" --setenv=GIT_SSL_CAINFO="$BOX_CA"
			--setenv=CURL_CA_BUNDLE="$BOX_CA")
	fi
	git clone --quiet --no-hardlinks --no-checkout "$REPO_ROOT" "$work/src"
	git -C "$work/src" checkout --quiet --detach "$rev"
	# The root's writable layer is a tmpfs (--volatile=overlay): the go command's work files (link outputs of the test
	# binaries, under /tmp) go to the work dir on disk instead, or a larger module fills it ("no space left on
	# device").
	mkdir -p "$work/go" "$work/tmp" && chmod 1777 "$work/tmp"

	log "make test on a clean clone of $rev, in a fresh $SUITE root (work dir $work)"
	start=$SECONDS
	systemd-nspawn --quiet --register=no --keep-unit --as-pid2 --pipe \
		--directory="$root" --volatile=overlay --capability=all --resolv-conf=copy-host \
		--bind-ro="$goroot:$BOX_GOROOT" --bind-ro="$modules:$BOX_MODULES" \
		--bind="$work/src:/src" --bind="$work/go:/root/go" --bind="$gocache:/root/.cache/go-build" \
		--bind="$work/tmp:/tmp" "${ca[@]}" \
		--setenv=HOME=/root \
		--setenv=PATH="$BOX_GOROOT/bin:/root/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		--setenv=GOTOOLCHAIN=local --setenv=GOPROXY="$proxy" --setenv=CI="${CI:-}" \
		--chdir=/src -- make test || rc=$?
	log "make test exited $rc after $((SECONDS - start)) s"
	return "$rc"
}

main "$@"

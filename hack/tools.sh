#!/usr/bin/env bash
# Builds the real tools that the e2e tests run (Pulumi CLI, its Go language host, the Kubernetes provider plugin,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubeadm, kubelet, wireguard-go) from the Go module
# proxy, and the Cluster Autoscaler and the fuse device plugin from their source (see build_autoscaler,
# build_fuse_plugin), once per version, installs the Debian packages they use
# (etcd-server; for the tunnel tests wireguard-tools, nftables, iproute2, iputils-ping; for the kubelet join test
# containerd, runc and the CNI plugins), and caches them under
# ${XDG_CACHE_HOME:-$HOME/.cache}/dynk8s/tools/<tool>-<version>/bin. Nothing is published as a binary we can
# download here, and none of these can be `go install`ed (replace directives), so each is built through a small
# generated wrapper module in a temp dir, never inside this repository's module.
#
# Usage:
#   hack/tools.sh               build whatever is missing, print per-tool timing
#   hack/tools.sh --print-path  print the bin dirs, ':'-joined, to prepend to PATH (builds nothing)
#   hack/tools.sh --check       exit 1 unless every tool is cached (builds nothing)
#   hack/tools.sh --box-root    print the box root's directory (builds nothing)
#   hack/tools.sh --box         build only the box roots (the box's and the forky root)
#   hack/tools.sh --forky-root  print the forky root's directory (builds nothing)
set -euo pipefail

readonly PULUMI_VERSION=v3.274.1
# The current Go language host is its own module, which the proxy does not serve; up to v3.65 it was a package of
# sdk/v3, and that host runs programs (here: the prebuilt dynk8s binary) for CLI v3.274.1 (a newer host is
# not served by the module proxy).
readonly LANGUAGE_GO_VERSION=v3.65.0
# The provider module has no release tags and the proxy serves exactly this master pseudo-version; it is labelled
# 4.32.0 because that is the plugin version a program on pulumi-kubernetes sdk/v4 v4.32.0 asks for.
readonly K8S_PROVIDER_VERSION=4.32.0
readonly K8S_PROVIDER_MODULE_VERSION=v4.0.0-20260115033456-f47bc2d6f199
readonly KUBE_VERSION=v1.34.4
# Staging modules (k8s.io/api, client-go, ...) are versioned v0.<minor>.<patch> alongside k8s.io/kubernetes.
readonly KUBE_STAGING_VERSION=v0.34.4
readonly KUBE_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubeadm kubelet)
# The patch the stack deploys for Kubernetes 1.34 (internal/kube's table); the e2e tests run this very build.
readonly AUTOSCALER_VERSION=1.34.5
readonly AUTOSCALER_TAG=cluster-autoscaler-$AUTOSCALER_VERSION
readonly AUTOSCALER_REPO=https://github.com/kubernetes/autoscaler
# The fuse device plugin the stack deploys (infra/addons/fuse.go), which the burst test runs for real: its upstream
# commit "Add fuse-device-plugin support for arm64", the newest. Not in the module proxy either (see
# build_fuse_plugin).
readonly FUSE_PLUGIN_COMMIT=014e1c46e8a622d387322f006b17de304fdd5015
readonly FUSE_PLUGIN_VERSION=${FUSE_PLUGIN_COMMIT:0:7}
readonly FUSE_PLUGIN_REPO=https://github.com/kuberenetes-learning-group/fuse-device-plugin

# The userspace WireGuard the tunnel tests run (the kernel here has no WireGuard module). Its module is the main
# package; the proxy serves no tagged version, and this pseudo-version is the 0.0.20250522 release
# (`wireguard-go --version`).
readonly WIREGUARD_GO_VERSION=v0.0.20250522
readonly WIREGUARD_GO_MODULE_VERSION=v0.0.0-20250521234502-f333402bd9cb
# Debian packages the e2e tests run, as command:package: etcd for the control plane; for the tunnel tests wg-quick
# and wg, nft, ip, ping, unshare and nsenter (mount namespaces) and curl (the gateway's key script).
# The AWS CLI runs the stale-node cleanup script against moto (the cleanup image ships one too).
readonly DEBIAN_TOOLS=(etcd:etcd-server wg:wireguard-tools wg-quick:wireguard-tools nft:nftables ip:iproute2
	ping:iputils-ping unshare:util-linux nsenter:util-linux curl:curl aws:awscli)

readonly CACHE_DIR="${DYNK8S_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dynk8s/tools}"

# The toolchain here cannot be swapped for a downloaded one; fail clearly instead of trying.
export GOTOOLCHAIN=local
# The wrappers are throwaway modules outside any repo: resolve their requirements freely, and take no flags
# meant for the caller's module (a -modfile would point the builds at the wrong go.mod).
export GOFLAGS="-mod=mod -buildvcs=false"

tool_dir() { # tool version
	printf '%s/%s-%s\n' "$CACHE_DIR" "$1" "$2"
}

all_bins() {
	tool_dir pulumi "$PULUMI_VERSION"
	tool_dir pulumi-language-go "$LANGUAGE_GO_VERSION"
	tool_dir pulumi-resource-kubernetes "$K8S_PROVIDER_VERSION"
	local t
	for t in "${KUBE_TOOLS[@]}"; do tool_dir "$t" "$KUBE_VERSION"; done
	tool_dir cluster-autoscaler "$AUTOSCALER_VERSION"
	tool_dir fuse-device-plugin "$FUSE_PLUGIN_VERSION"
	tool_dir wireguard-go "$WIREGUARD_GO_VERSION"
}

print_path() {
	local d out=""
	while read -r d; do out="${out:+$out:}$d/bin"; done < <(all_bins)
	printf '%s\n' "$out"
}

have() { # tool version
	[[ -x "$(tool_dir "$1" "$2")/bin/$1" ]]
}

log() {
	printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

# run_timed LABEL CMD...: low priority so the other engineers' (and CI's) compiles keep their CPU; GNU time, when
# present, reports the peak RSS of the build's largest process.
run_timed() {
	local label=$1
	shift
	local start=$SECONDS
	if [[ -x /usr/bin/time ]]; then
		/usr/bin/time -f "[tools] $label: peak RSS %M KB, %e s wall" nice -n 19 "$@"
	else
		nice -n 19 "$@"
	fi
	log "$label took $((SECONDS - start)) s"
}

# install_bin TOOL VERSION BUILT: moving the finished binary in last means an interrupted build never leaves a
# cache entry that looks complete.
install_bin() {
	local dir
	dir=$(tool_dir "$1" "$2")
	mkdir -p "$dir/bin"
	mv -f "$3" "$dir/bin/$1.tmp"
	mv -f "$dir/bin/$1.tmp" "$dir/bin/$1"
}

# apply_remote_replaces GOMOD: copies a dependency's non-local replace directives (local ones point into its own
# repository checkout, which a module zip does not have) into the wrapper's go.mod.
apply_remote_replaces() {
	local gomod=$1 old new newver
	while read -r old new newver; do
		[[ -n "$old" && "$new" != .* && "$new" != /* ]] || continue
		go mod edit -replace="$old=$new@$newver"
	done < <(replaces "$gomod")
}

# replaces GOMOD: prints "old new version" per replace directive of a go.mod.
replaces() {
	go mod edit -json "$1" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    print(r["Old"]["Path"], r["New"]["Path"], r["New"].get("Version", ""))
'
}

modcache_dir() { # module version
	go mod download -json "$1@$2" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'
}

build_pulumi() {
	if have pulumi "$PULUMI_VERSION"; then
		log "pulumi $PULUMI_VERSION cached"
		return
	fi
	local start=$SECONDS w src
	w=$(mktemp -d "$WORK/pulumi.XXXX")
	log "building pulumi $PULUMI_VERSION in $w"
	src=$(modcache_dir github.com/pulumi/pulumi/pkg/v3 "$PULUMI_VERSION")
	(
		cd "$w"
		go mod init wrap/pulumi >/dev/null 2>&1
		# cmd/pulumi is three non-test files; NewPulumiCmd lives in pulumi.go.
		cp "$src"/cmd/pulumi/{doc,main,pulumi}.go .
		chmod u+w ./*.go
		go mod edit -require="github.com/pulumi/pulumi/pkg/v3@$PULUMI_VERSION" \
			-require="github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION"
		apply_remote_replaces "$src/go.mod"
		run_timed "pulumi: go mod tidy" go mod tidy
		# The Automation API parses `pulumi version`, and version.Version is only ever set through ldflags.
		run_timed "pulumi: go build" go build -trimpath -o "$w/pulumi" \
			-ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" .
	)
	install_bin pulumi "$PULUMI_VERSION" "$w/pulumi"
	log "pulumi $PULUMI_VERSION built in $((SECONDS - start)) s"
}

build_language_go() {
	if have pulumi-language-go "$LANGUAGE_GO_VERSION"; then
		log "pulumi-language-go $LANGUAGE_GO_VERSION cached"
		return
	fi
	local start=$SECONDS w src
	w=$(mktemp -d "$WORK/langgo.XXXX")
	log "building pulumi-language-go $LANGUAGE_GO_VERSION in $w"
	src=$(modcache_dir github.com/pulumi/pulumi/sdk/v3 "$LANGUAGE_GO_VERSION")
	(
		cd "$w"
		go mod init wrap/langgo >/dev/null 2>&1
		cp "$src"/go/pulumi-language-go/main.go .
		chmod u+w main.go
		go mod edit -require="github.com/pulumi/pulumi/sdk/v3@$LANGUAGE_GO_VERSION"
		run_timed "pulumi-language-go: go mod tidy" go mod tidy
		run_timed "pulumi-language-go: go build" go build -trimpath -o "$w/pulumi-language-go" \
			-ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$LANGUAGE_GO_VERSION" .
	)
	install_bin pulumi-language-go "$LANGUAGE_GO_VERSION" "$w/pulumi-language-go"
	log "pulumi-language-go $LANGUAGE_GO_VERSION built in $((SECONDS - start)) s"
}

build_k8s_provider() {
	if have pulumi-resource-kubernetes "$K8S_PROVIDER_VERSION"; then
		log "pulumi-resource-kubernetes $K8S_PROVIDER_VERSION cached"
		return
	fi
	local start=$SECONDS w src mod=github.com/pulumi/pulumi-kubernetes/provider/v4
	w=$(mktemp -d "$WORK/k8sprov.XXXX")
	log "building pulumi-resource-kubernetes $K8S_PROVIDER_VERSION ($K8S_PROVIDER_MODULE_VERSION) in $w"
	src=$(modcache_dir "$mod" "$K8S_PROVIDER_MODULE_VERSION")/cmd/pulumi-resource-kubernetes
	(
		cd "$w"
		mkdir gen
		go mod init wrap/k8sprov >/dev/null 2>&1
		# main.go embeds schema-embed.json, which the module zip lacks: generate.go makes it from schema.json.
		cp "$src"/{main.go,schema.json,terraform-mapping.json} .
		cp "$src"/generate.go gen/
		chmod -R u+w .
		# Its only replace points the SDK at ../sdk; without it MVS picks a served sdk/v4, which is all it needs.
		go mod edit -require="$mod@$K8S_PROVIDER_MODULE_VERSION"
		run_timed "pulumi-resource-kubernetes: go mod tidy" go mod tidy
		run_timed "pulumi-resource-kubernetes: generate" env VERSION="$K8S_PROVIDER_VERSION" go run ./gen/generate.go
		rm -rf gen
		run_timed "pulumi-resource-kubernetes: go build" go build -trimpath -o "$w/pulumi-resource-kubernetes" \
			-ldflags "-s -w -X $mod/pkg/version.Version=$K8S_PROVIDER_VERSION" .
	)
	install_bin pulumi-resource-kubernetes "$K8S_PROVIDER_VERSION" "$w/pulumi-resource-kubernetes"
	log "pulumi-resource-kubernetes $K8S_PROVIDER_VERSION built in $((SECONDS - start)) s"
}

# kube_main TOOL: the main package's file in k8s.io/kubernetes.
kube_main() {
	case $1 in
	kube-apiserver) echo cmd/kube-apiserver/apiserver.go ;;
	kube-controller-manager) echo cmd/kube-controller-manager/controller-manager.go ;;
	kube-scheduler) echo cmd/kube-scheduler/scheduler.go ;;
	kubectl) echo cmd/kubectl/kubectl.go ;;
	kubeadm) echo cmd/kubeadm/kubeadm.go ;;
	kubelet) echo cmd/kubelet/kubelet.go ;;
	*) return 1 ;;
	esac
}

build_kube() {
	local missing=() t
	for t in "${KUBE_TOOLS[@]}"; do
		if have "$t" "$KUBE_VERSION"; then
			log "$t $KUBE_VERSION cached"
		else
			missing+=("$t")
		fi
	done
	((${#missing[@]})) || return 0

	local start=$SECONDS w src mod=k8s.io/kubernetes
	w=$(mktemp -d "$WORK/kube.XXXX")
	log "building ${missing[*]} $KUBE_VERSION in $w"
	src=$(modcache_dir "$mod" "$KUBE_VERSION")
	(
		cd "$w"
		go mod init wrap/kube >/dev/null 2>&1
		go mod edit -require="$mod@$KUBE_VERSION"
		# k8s.io/kubernetes replaces every staging module with ./staging/src/...; point each at its served release.
		local old new ver
		while read -r old new ver; do
			if [[ "$new" == ./staging/* ]]; then
				go mod edit -replace="$old=$old@$KUBE_STAGING_VERSION"
			elif [[ "$new" != .* && "$new" != /* ]]; then
				go mod edit -replace="$old=$new@$ver"
			fi
		done < <(replaces "$src/go.mod")
		for t in "${missing[@]}"; do
			mkdir -p "cmd/$t"
			cp "$src/$(kube_main "$t")" "cmd/$t/main.go"
			chmod u+w "cmd/$t/main.go"
		done
		run_timed "kube: go mod tidy" go mod tidy
	)
	local ld
	ld=$(kube_ldflags)
	for t in "${missing[@]}"; do
		local ts=$SECONDS
		(cd "$w" && run_timed "$t: go build" go build -trimpath -o "$w/bin/$t" -ldflags "$ld" "./cmd/$t")
		install_bin "$t" "$KUBE_VERSION" "$w/bin/$t"
		log "$t $KUBE_VERSION built in $((SECONDS - ts)) s"
	done
	log "kube tools built in $((SECONDS - start)) s"
}

# kube_ldflags: kubeadm and kubectl compare their own version with the server's, and kubeadm derives defaults from
# it; unset, gitVersion reads as v0.0.0-master.
kube_ldflags() {
	local v=${KUBE_VERSION#v} major minor pkg ld="-s -w"
	major=${v%%.*}
	minor=${v#*.}
	minor=${minor%%.*}
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	printf '%s\n' "$ld"
}

# autoscaler_src: the autoscaler's module directory. The module proxy refuses k8s.io/autoscaler/cluster-autoscaler
# (every version), so the source is a directory: $DYNK8S_AUTOSCALER_SRC (a local copy of the tag's
# cluster-autoscaler directory, set by the caller), else a shallow clone of the upstream tag. Prints the directory; a
# clone goes under $WORK.
autoscaler_src() {
	if [[ -n ${DYNK8S_AUTOSCALER_SRC:-} ]]; then
		printf '%s\n' "$DYNK8S_AUTOSCALER_SRC"
		return
	fi
	log "cloning $AUTOSCALER_REPO at $AUTOSCALER_TAG"
	git clone -q --depth 1 -b "$AUTOSCALER_TAG" "$AUTOSCALER_REPO" "$WORK/autoscaler" >&2 || return 1
	printf '%s\n' "$WORK/autoscaler/cluster-autoscaler"
}

# build_autoscaler: the Cluster Autoscaler with only the AWS provider (-tags aws), as the stack runs it. It is a
# module with its own replace directives (k8s.io/kubernetes and the staging modules), so it is built inside a copy of
# its own module directory, never inside this repository's module. About 7 min and 1.7 GB peak RSS cold.
build_autoscaler() {
	if have cluster-autoscaler "$AUTOSCALER_VERSION"; then
		log "cluster-autoscaler $AUTOSCALER_VERSION cached"
		return
	fi
	local start=$SECONDS src w
	src=$(autoscaler_src)
	[[ -f $src/go.mod ]] || {
		echo "tools.sh: no cluster-autoscaler module at $src (set DYNK8S_AUTOSCALER_SRC)" >&2
		return 1
	}
	w=$(mktemp -d "$WORK/autoscaler-build.XXXX")
	log "building cluster-autoscaler $AUTOSCALER_VERSION from $src in $w"
	# A copy: the source may be read-only, and -mod=mod may rewrite go.mod/go.sum.
	cp -R "$src/." "$w/src"
	chmod -R u+w "$w/src"
	(
		cd "$w/src"
		run_timed "cluster-autoscaler: go mod download" go mod download
		run_timed "cluster-autoscaler: go build" go build -tags aws -trimpath -ldflags "-s -w" \
			-o "$w/cluster-autoscaler" .
	)
	install_bin cluster-autoscaler "$AUTOSCALER_VERSION" "$w/cluster-autoscaler"
	log "cluster-autoscaler $AUTOSCALER_VERSION built in $((SECONDS - start)) s"
}

# fuse_plugin_src: the plugin's source directory (its main package and go.mod): $DYNK8S_FUSE_PLUGIN_SRC (a local copy
# of the commit, set by the caller), else a clone of the upstream repository at the commit. A clone goes under $WORK.
fuse_plugin_src() {
	if [[ -n ${DYNK8S_FUSE_PLUGIN_SRC:-} ]]; then
		printf '%s\n' "$DYNK8S_FUSE_PLUGIN_SRC"
		return
	fi
	log "cloning $FUSE_PLUGIN_REPO at $FUSE_PLUGIN_VERSION"
	git clone -q "$FUSE_PLUGIN_REPO" "$WORK/fuse-plugin" >&2 &&
		git -C "$WORK/fuse-plugin" checkout -q "$FUSE_PLUGIN_COMMIT" >&2 || return 1
	printf '%s\n' "$WORK/fuse-plugin"
}

# build_fuse_plugin: a static binary (no cgo), so that an image of the binary alone runs it. The module proxy refuses
# the module (named plain fuse-device-plugin); its vendor/ folder does not match its go.mod, hence -mod=mod (the
# script's GOFLAGS), which takes the dependencies from the proxy. Under a minute.
build_fuse_plugin() {
	if have fuse-device-plugin "$FUSE_PLUGIN_VERSION"; then
		log "fuse-device-plugin $FUSE_PLUGIN_VERSION cached"
		return
	fi
	local start=$SECONDS src w
	src=$(fuse_plugin_src)
	[[ -f $src/go.mod && -f $src/main.go ]] || {
		echo "tools.sh: no fuse-device-plugin source at $src (set DYNK8S_FUSE_PLUGIN_SRC)" >&2
		return 1
	}
	w=$(mktemp -d "$WORK/fuse-plugin-build.XXXX")
	log "building fuse-device-plugin $FUSE_PLUGIN_VERSION from $src in $w"
	# A copy: the source may be read-only, and -mod=mod rewrites go.sum.
	cp -R "$src/." "$w/src"
	chmod -R u+w "$w/src"
	(
		cd "$w/src"
		run_timed "fuse-device-plugin: go build" env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
			-o "$w/fuse-device-plugin" .
	)
	install_bin fuse-device-plugin "$FUSE_PLUGIN_VERSION" "$w/fuse-device-plugin"
	log "fuse-device-plugin $FUSE_PLUGIN_VERSION built in $((SECONDS - start)) s"
}

build_wireguard_go() {
	if have wireguard-go "$WIREGUARD_GO_VERSION"; then
		log "wireguard-go $WIREGUARD_GO_VERSION cached"
		return
	fi
	local start=$SECONDS w
	w=$(mktemp -d "$WORK/wggo.XXXX")
	log "building wireguard-go $WIREGUARD_GO_VERSION ($WIREGUARD_GO_MODULE_VERSION) in $w"
	(
		cd "$w"
		go mod init wrap/wireguard-go >/dev/null 2>&1
		go mod edit -require="golang.zx2c4.com/wireguard@$WIREGUARD_GO_MODULE_VERSION"
		run_timed "wireguard-go: go build" go build -trimpath -o "$w/wireguard-go" -ldflags "-s -w" \
			golang.zx2c4.com/wireguard
	)
	install_bin wireguard-go "$WIREGUARD_GO_VERSION" "$w/wireguard-go"
	log "wireguard-go $WIREGUARD_GO_VERSION built in $((SECONDS - start)) s"
}

# missing_debian: the packages of DEBIAN_TOOLS whose command is not on PATH, once each.
missing_debian() {
	local t pkgs=()
	for t in "${DEBIAN_TOOLS[@]}"; do
		command -v "${t%%:*}" >/dev/null 2>&1 && continue
		[[ " ${pkgs[*]} " == *" ${t##*:} "* ]] || pkgs+=("${t##*:}")
	done
	if ((${#pkgs[@]})); then printf '%s\n' "${pkgs[@]}"; fi
}

# apt_install PKG...: an old or missing package list gets one update.
apt_install() {
	local sudo=()
	(($(id -u) == 0)) || sudo=(sudo)
	if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >/dev/null; then
		"${sudo[@]}" apt-get update >/dev/null
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >/dev/null
	fi
}

ensure_debian() {
	local pkgs
	mapfile -t pkgs < <(missing_debian)
	if ((${#pkgs[@]} == 0)); then
		log "Debian tools present: ${DEBIAN_TOOLS[*]%%:*}"
		return
	fi
	log "installing from Debian: ${pkgs[*]}"
	apt_install "${pkgs[@]}"
}

# The kubelet join test's node runtime. CRI-O (what the nodes run) is not in Debian; containerd is, and the kubelet
# speaks CRI to either. Debian's CNI plugins live in /usr/lib/cni.
readonly CNI_BIN_DIR=/usr/lib/cni
have_node_runtime() {
	command -v containerd >/dev/null 2>&1 && command -v ctr >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 &&
		[[ -x $CNI_BIN_DIR/bridge && -x $CNI_BIN_DIR/host-local && -x $CNI_BIN_DIR/loopback ]]
}

ensure_node_runtime() {
	if have_node_runtime; then
		log "containerd $(containerd --version 2>/dev/null | awk '{print $3}'), runc and CNI plugins present"
		return
	fi
	log "installing containerd, runc, containernetworking-plugins from Debian"
	apt_install containerd runc containernetworking-plugins
}

# The box: a Debian root that boots under systemd-nspawn with real systemd and real cloud-init, where the e2e tests
# boot the stack's rendered user data (a copy or overlay per instance; this one stays clean). Fedora's packages are
# not to be had here, so the root has Debian's counterparts of what a node's boot runs: systemd and resolved,
# cloud-init (NoCloud), containerd and runc behind CRI-O's socket path, the CNI plugins, nftables and iptables, kmod,
# procps and util-linux (modprobe, sysctl, swapoff, mount, nsenter), iproute2, curl and python3 (the scripts),
# wireguard-tools for the gateway's box, and the en_US.UTF-8 locale that cloud-init's locale module sets (Fedora
# Cloud has glibc-langpack-en). And Fedora's package tools as Debian builds them, where the e2e runs the node's
# package phase for real: dnf 4 with its plugins (Fedora up to 40), rpm 4.18, and rpmbuild, rpmsign, createrepo_c
# and gnupg for the signed repositories it installs from. Cached under box-root-<hash of the list>, so a changed
# list builds a new root. mmdebstrap reads the host's own apt sources.
readonly BOX_SUITE=bookworm
readonly BOX_PACKAGES=(systemd systemd-sysv systemd-resolved dbus cloud-init containerd runc containernetworking-plugins
	nftables iptables kmod procps util-linux mount iproute2 iputils-ping curl ca-certificates python3 wireguard-tools
	conntrack ethtool socat locales dnf dnf-plugins-core rpm createrepo-c gnupg)
BOX_SOURCES=${DYNK8S_BOX_SOURCES:-/etc/apt/sources.list.d/debian.sources}

box_key() {
	printf '%s\n' "$BOX_SUITE" minbase "${BOX_PACKAGES[@]}" | sha256sum | cut -c1-12
}

box_root() {
	printf '%s/box-root-%s\n' "$CACHE_DIR" "$(box_key)"
}

# have_box: the root is complete once its marker (written last) is there.
have_box() {
	[[ -f "$(box_root)/.dynk8s-box" ]]
}

ensure_mmdebstrap() {
	if ! command -v mmdebstrap >/dev/null 2>&1 || ! command -v systemd-nspawn >/dev/null 2>&1; then
		log "installing mmdebstrap, systemd-container from Debian"
		apt_install mmdebstrap systemd-container
	fi
}

build_box() {
	if have_box; then
		log "box root $(box_root) cached"
		return
	fi
	ensure_mmdebstrap
	[[ -r $BOX_SOURCES ]] || {
		echo "tools.sh: no apt sources at $BOX_SOURCES for the box root (set DYNK8S_BOX_SOURCES)" >&2
		return 1
	}
	local root tmp start=$SECONDS list
	root=$(box_root)
	tmp="$root.tmp"
	rm -rf "$tmp"
	list=$(
		IFS=,
		printf '%s' "${BOX_PACKAGES[*]}"
	)
	log "building the box root ($BOX_SUITE minbase: $list) in $tmp"
	# The hooks run in mmdebstrap's shell, with the root as $1.
	# shellcheck disable=SC2016
	run_timed "box root: mmdebstrap" mmdebstrap --quiet --variant=minbase --include="$list" \
		--customize-hook='echo "datasource_list: [ NoCloud, None ]" >"$1/etc/cloud/cloud.cfg.d/90-dynk8s-box.cfg"' \
		--customize-hook='echo "en_US.UTF-8 UTF-8" >"$1/etc/locale.gen" && chroot "$1" locale-gen >/dev/null' \
		--customize-hook='rm -f "$1/etc/machine-id" "$1/var/lib/dbus/machine-id"' \
		"$BOX_SUITE" "$tmp" "$BOX_SOURCES"
	printf '%s\n' "${BOX_PACKAGES[@]}" >"$tmp/.dynk8s-box"
	mv -T "$tmp" "$root"
	log "box root built in $((SECONDS - start)) s: $(du -sh "$root" | cut -f1) at $root"
}

# The forky root: a second, newer Debian root, where the e2e runs a command of the node's with the newer versions
# of what the box has (no boot: forky's systemd cannot boot on a host with cgroup v1): its cloud-init (26.2
# against the box's bookworm 22.4: the image build's repositories step must parse on cloud-init before and after
# 24.1), and dnf5 with rpm 6.1 (Fedora 41 on has dnf5; Debian has no dnf5 before forky), with rpmbuild, rpmsign,
# createrepo_c and gnupg for the package phase's signed repositories. Its sources are the host's mirror with the
# suite forky, whose Release file is past its Valid-Until on a frozen mirror; DYNK8S_FORKY_SOURCES (a one-line
# `deb ...` entry) overrides them.
readonly FORKY_SUITE=forky
readonly FORKY_PACKAGES=(cloud-init dnf5 rpm createrepo-c gnupg)

forky_key() {
	printf '%s\n' "$FORKY_SUITE" minbase "${FORKY_PACKAGES[@]}" | sha256sum | cut -c1-12
}

forky_root() {
	printf '%s/forky-root-%s\n' "$CACHE_DIR" "$(forky_key)"
}

have_forky() {
	[[ -f "$(forky_root)/.dynk8s-root" ]]
}

# forky_sources: one `deb` line for forky on the first mirror of the box's sources (deb822 or one-line format).
forky_sources() {
	if [[ -n ${DYNK8S_FORKY_SOURCES:-} ]]; then
		printf '%s\n' "$DYNK8S_FORKY_SOURCES"
		return
	fi
	local uri
	uri=$(awk '$1 == "URIs:" { print $2; exit } $1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; exit } }' "$BOX_SOURCES")
	[[ -n $uri ]] || {
		echo "tools.sh: no mirror in $BOX_SOURCES for the forky root (set DYNK8S_FORKY_SOURCES)" >&2
		return 1
	}
	printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' "$uri" "$FORKY_SUITE"
}

build_forky_root() {
	if have_forky; then
		log "forky root $(forky_root) cached"
		return
	fi
	local root tmp start=$SECONDS sources list
	root=$(forky_root)
	tmp="$root.tmp"
	rm -rf "$tmp"
	sources=$(forky_sources)
	list=$(
		IFS=,
		printf '%s' "${FORKY_PACKAGES[*]}"
	)
	ensure_mmdebstrap
	log "building the forky root ($FORKY_SUITE minbase: $list) in $tmp"
	# shellcheck disable=SC2016
	run_timed "forky root: mmdebstrap" mmdebstrap --quiet --variant=minbase --include="$list" \
		--aptopt='Acquire::Check-Valid-Until "false"' --aptopt='APT::Install-Recommends "false"' \
		--customize-hook='rm -f "$1/etc/machine-id" "$1/var/lib/dbus/machine-id"' \
		"$FORKY_SUITE" "$tmp" "$sources"
	printf '%s\n' "${FORKY_PACKAGES[@]}" >"$tmp/.dynk8s-root"
	mv -T "$tmp" "$root"
	log "forky root built in $((SECONDS - start)) s: $(du -sh "$root" | cut -f1) at $root"
}

main() {
	case ${1:-} in
	--print-path)
		print_path
		return
		;;
	--box-root)
		box_root
		return
		;;
	--forky-root)
		forky_root
		return
		;;
	--check)
		local ok=0
		have pulumi "$PULUMI_VERSION" || ok=1
		have pulumi-language-go "$LANGUAGE_GO_VERSION" || ok=1
		have pulumi-resource-kubernetes "$K8S_PROVIDER_VERSION" || ok=1
		local t
		for t in "${KUBE_TOOLS[@]}"; do have "$t" "$KUBE_VERSION" || ok=1; done
		have cluster-autoscaler "$AUTOSCALER_VERSION" || ok=1
		have fuse-device-plugin "$FUSE_PLUGIN_VERSION" || ok=1
		have wireguard-go "$WIREGUARD_GO_VERSION" || ok=1
		[[ -z $(missing_debian) ]] || ok=1
		have_node_runtime || ok=1
		have_box || ok=1
		have_forky || ok=1
		return "$ok"
		;;
	--box)
		WORK=$(mktemp -d "${TMPDIR:-/tmp}/dynk8s-tools.XXXXXX")
		trap 'rm -rf "$WORK"' EXIT
		build_box
		build_forky_root
		return
		;;
	"") ;;
	*)
		echo "usage: $0 [--print-path|--check|--box-root|--forky-root|--box]" >&2
		return 2
		;;
	esac

	command -v go >/dev/null || {
		echo "tools.sh: go not found" >&2
		return 1
	}
	command -v python3 >/dev/null || {
		echo "tools.sh: python3 not found (used to read go.mod JSON)" >&2
		return 1
	}
	local start=$SECONDS
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/dynk8s-tools.XXXXXX")
	trap 'rm -rf "$WORK"' EXIT
	ensure_debian
	ensure_node_runtime
	# One build after another: the machine has two cores shared with everyone else's compiles.
	build_wireguard_go
	build_kube
	build_pulumi
	build_language_go
	build_k8s_provider
	build_autoscaler
	build_fuse_plugin
	build_box
	build_forky_root
	log "all tools ready in $((SECONDS - start)) s; PATH entries: $(print_path)"
}

main "$@"

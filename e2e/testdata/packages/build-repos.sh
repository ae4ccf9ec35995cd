#!/usr/bin/env bash
# Builds the signed rpm repositories a node's package phase installs from in the e2e (TestBoxPackagesOnRealDnf), with
# the root's own rpmbuild, rpmsign, createrepo_c and gpg, into $OUT (a directory of the host, bound rw: createrepo_c
# must not write into an overlay). Run inside the root by systemd-nspawn. The packages are thin: scripts and units
# in place of the binaries. Their metadata is upstream's, as the repositories publish it:
#   - pkgs.k8s.io (core:/stable:/v1.NN/rpm/, built on OBS): kubelet, kubeadm, kubectl at KUBE_VERSION and one patch
#     either side, release 150500.1.1; kubelet Requires iptables >= 1.4.21, kubernetes-cni >= 1.2.0 and
#     util-linux, and ships kubelet.service; kubeadm ships the kubelet drop-in 10-kubeadm.conf; cri-tools and
#     kubernetes-cni (kubernetes/release, cmd/krel/templates/latest/*.spec).
#   - CRI-O (isv:/cri-o:/stable:/vN.NN/rpm/): cri-o Requires iptables and ships crio.service and a bridge CNI config
#     (cri-o/packaging, templates/latest/cri-o/cri-o.spec).
#   - fedora and updates: container-selinux (epoch 2) and Fedora's own, newer cri-o and cri-tools, which must never
#     replace upstream's; on dnf4, the versionlock plugin (Provides dnf-command(versionlock), dnf-plugins-core.spec),
#     its files those of the root's own dnf-plugins-core; the gateway's wireguard-tools, with its wg-quick@.service
#     (Fedora's wireguard-tools.spec, 1.0.20210914-9.fc43; it Requires systemd), its files the root's own when it
#     has them.
#   - the image: what a Fedora Cloud image's rpm database provides that the packages require, and systemd's file
#     trigger (a daemon-reload after a transaction that installs units).
# Also kubernetes-unsigned (the kubernetes packages unsigned, its key kept), fedora-unsigned (wireguard-tools
# unsigned) and cri-o-old (a CRI-O stream below the pinned one), for the failures; and key.asc, the repositories'
# public key. The node boxes install from the same repositories: their kubelet and kubeadm run the real binaries.
# Inputs (environment): OUT, BOX (e2e/testdata/box, bound ro), KUBE_VERSION (1.34.4), CRIO_MINOR (1.34).
set -euo pipefail
: "${OUT:?}" "${BOX:?}" "${KUBE_VERSION:?}" "${CRIO_MINOR:?}"
work=$(mktemp -d)
arch=$(uname -m)
IFS=. read -r major minor patch <<<"$KUBE_VERSION"
previous=$major.$minor.$((patch - 1)) next=$major.$minor.$((patch + 1))
cri_old=$major.$((minor - 1))

# mkrpm DIR NAME EPOCH VERSION RELEASE ARCH REQUIRES PROVIDES SCRIPT [DEST:MODE:SOURCE ...]
#   REQUIRES and PROVIDES: ;-separated; EPOCH "-": none; SCRIPT: a raw spec block (a %post, a file trigger) or "";
#   SOURCE "stub" is a script that says it is a stand-in, "box" one that runs the box's real binary of the same name
#   where the box has it (/opt/dynk8s-box/bin), "empty" an empty file.
mkrpm() {
	local dir=$1 name=$2 epoch=$3 version=$4 release=$5 pkgarch=$6 requires=$7 provides=$8 script=$9
	shift 9
	local top=$work/build/$name-$version spec item dest mode src
	mkdir -p "$top/SOURCES" "$dir"
	spec=$top/$name.spec
	{
		echo "Name: $name"
		[[ $epoch == - ]] || echo "Epoch: $epoch"
		echo "Version: $version"
		echo "Release: $release"
		echo "Summary: $name (dynk8s e2e stand-in)"
		echo "License: Apache-2.0"
		[[ $pkgarch == noarch ]] && echo "BuildArch: noarch"
		echo "AutoReqProv: no"
		IFS=';' read -ra items <<<"$requires"
		for item in "${items[@]}"; do echo "Requires: $item"; done
		IFS=';' read -ra items <<<"$provides"
		for item in "${items[@]}"; do echo "Provides: $item"; done
		echo "%description"
		echo "$name as the e2e installs it: upstream's name, version and dependencies, thin contents."
		echo "%install"
		local n=0
		for item in "$@"; do
			IFS=: read -r dest mode src <<<"$item"
			case $src in
			stub) printf '#!/bin/sh\necho "%s: a stand-in of the e2e" >&2\n' "$name" >"$top/SOURCES/$n" ;;
			# The real binary the node box binds at /opt/dynk8s-box/bin (hack/tools.sh built it), the stub elsewhere.
			box) printf '#!/bin/sh\n[ -x /opt/dynk8s-box/bin/%s ] && exec /opt/dynk8s-box/bin/%s "$@"\necho "%s: a stand-in of the e2e" >&2\n' \
				"${dest##*/}" "${dest##*/}" "$name" >"$top/SOURCES/$n" ;;
			empty) : >"$top/SOURCES/$n" ;;
			*) cp "$src" "$top/SOURCES/$n" ;;
			esac
			echo "install -D -m $mode $top/SOURCES/$n %{buildroot}$dest"
			n=$((n + 1))
		done
		echo "%files"
		for item in "$@"; do echo "${item%%:*}"; done
		[[ -z $script ]] || printf '%s\n' "$script"
	} >"$spec"
	rpmbuild --quiet -bb --define "_topdir $top" --define '_rpmformat 4' --define '_build_id_links none' \
		--define "_rpmdir $dir" --define '_rpmfilename %{NAME}-%{VERSION}-%{RELEASE}.%{ARCH}.rpm' "$spec" 2>"$top/log" ||
		{ cat "$top/log" >&2 && return 1; }
}

units=/usr/lib/systemd/system
staged=$work/kubernetes
for v in "$previous" "$KUBE_VERSION" "$next"; do
	mkrpm "$staged" kubelet - "$v" 150500.1.1 "$arch" "iptables >= 1.4.21;kubernetes-cni >= 1.2.0;util-linux" "" \
		$'%post\nsystemctl preset kubelet.service >/dev/null 2>&1 || :' \
		/usr/bin/kubelet:0755:box "$units/kubelet.service:0644:$BOX/kubelet.service" /etc/sysconfig/kubelet:0644:empty
	mkrpm "$staged" kubeadm - "$v" 150500.1.1 "$arch" "" "" "" \
		/usr/bin/kubeadm:0755:box "$units/kubelet.service.d/10-kubeadm.conf:0644:$BOX/10-kubeadm.conf"
	mkrpm "$staged" kubectl - "$v" 150500.1.1 "$arch" "" "" "" /usr/bin/kubectl:0755:stub
done
mkrpm "$staged" kubernetes-cni - 1.7.1 150500.1.1 "$arch" "" "" "" /opt/cni/bin/.dynk8s-e2e:0644:empty
# No crictl: the agent then skips its image pre-pull (no registry here).
mkrpm "$staged" cri-tools - "$CRIO_MINOR.0" 150500.1.1 "$arch" "" "" "" /usr/share/cri-tools/.dynk8s-e2e:0644:empty
printf '{"cniVersion": "1.0.0", "name": "crio", "plugins": [{"type": "bridge"}]}\n' >"$work/bridge.conflist"
for v in "$CRIO_MINOR.3" "$CRIO_MINOR.4"; do
	mkrpm "$OUT/cri-o" cri-o - "$v" 150500.1.1 "$arch" "iptables" "" \
		$'%post\nsystemctl preset crio.service >/dev/null 2>&1 || :' \
		"$units/crio.service:0644:$BOX/crio.service" "/etc/cni/net.d/11-crio-ipv4-bridge.conflist:0644:$work/bridge.conflist"
done
mkrpm "$OUT/cri-o-old" cri-o - "$cri_old.5" 150500.1.1 "$arch" "iptables" "" "" "$units/crio.service:0644:$BOX/crio.service"

fedora_cri=$CRIO_MINOR.9
mkrpm "$OUT/fedora" container-selinux 2 2.240.0 1.fc43 noarch "" "" "" /usr/share/container-selinux/.dynk8s-e2e:0644:empty
mkrpm "$OUT/fedora" cri-o - "$fedora_cri" 1.fc43 "$arch" "iptables" "" "" "$units/crio.service:0644:$BOX/crio.service"
mkrpm "$OUT/fedora" cri-tools - "$fedora_cri" 1.fc43 "$arch" "" "" "" /usr/share/cri-tools/.dynk8s-e2e:0644:empty
plugin=/usr/lib/python3/dist-packages/dnf-plugins/versionlock.py
if [[ -f $plugin ]]; then
	mkrpm "$OUT/fedora" python3-dnf-plugin-versionlock - 4.3.1 1.fc43 noarch "" "dnf-command(versionlock)" "" \
		"$plugin:0644:$plugin" /etc/dnf/plugins/versionlock.conf:0644:/etc/dnf/plugins/versionlock.conf \
		/etc/dnf/plugins/versionlock.list:0644:empty
fi
# wireguard-tools holds the root's own wg, wg-quick and wg-quick@.service where it has them (the box root: Debian's,
# which the gateway box then runs), else stand-ins.
wg=(/usr/bin/wg:0755:/usr/bin/wg /usr/bin/wg-quick:0755:/usr/bin/wg-quick "$units/wg-quick@.service:0644:$units/wg-quick@.service")
if [[ ! -x /usr/bin/wg ]]; then
	printf '[Unit]\nDescription=WireGuard via wg-quick(8) for %%I (dynk8s e2e stand-in)\n[Service]\nType=oneshot\nExecStart=/usr/bin/wg-quick up %%i\n[Install]\nWantedBy=multi-user.target\n' >"$work/wg-quick@.service"
	wg=(/usr/bin/wg:0755:stub /usr/bin/wg-quick:0755:stub "$units/wg-quick@.service:0644:$work/wg-quick@.service")
fi
mkrpm "$OUT/fedora" wireguard-tools - 1.0.20210914 9.fc43 "$arch" "systemd" "" "" "${wg[@]}"
mkdir -p "$OUT/fedora-unsigned"
cp "$OUT/fedora"/wireguard-tools-*.rpm "$OUT/fedora-unsigned/"
mkrpm "$OUT/updates" container-selinux 2 2.245.0 1.fc43 noarch "" "" "" /usr/share/container-selinux/.dynk8s-e2e:0644:empty
mkrpm "$OUT/updates" cri-o - "$CRIO_MINOR.10" 1.fc43 "$arch" "iptables" "" "" "$units/crio.service:0644:$BOX/crio.service"
mkrpm "$OUT/updates" cri-tools - "$CRIO_MINOR.10" 1.fc43 "$arch" "" "" "" /usr/share/cri-tools/.dynk8s-e2e:0644:empty

# Fedora's systemd package runs daemon-reload after a transaction that installs units (systemd.spec,
# %transfiletriggerin); the image package plays it, with what the packages require of the image.
mkrpm "$OUT/image" dynk8s-box-image - 43 1 noarch "" \
	"/bin/sh;/usr/bin/sh;bash;coreutils;util-linux;systemd;glibc;system-release(releasever) = 43;iptables = 1.8.9;nftables = 1:1.0.6" \
	$'%transfiletriggerin -- /usr/lib/systemd/system /etc/systemd/system\nsystemctl daemon-reload >/dev/null 2>&1 || :' \
	/usr/share/dynk8s-box-image/.dynk8s-e2e:0644:empty

# The unsigned copy first, then sign.
mkdir -p "$OUT/kubernetes-unsigned" "$OUT/kubernetes"
cp "$staged"/*.rpm "$OUT/kubernetes-unsigned/"
cp "$staged"/*.rpm "$OUT/kubernetes/"
export GNUPGHOME=$work/gnupg
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key 'dynk8s e2e repositories <e2e@dynk8s.invalid>' rsa3072 sign never
fpr=$(gpg --batch --with-colons --list-secret-keys | awk -F: '$1 == "fpr" { print $10; exit }')
gpg --batch --armor --export "$fpr" >"$OUT/key.asc"
for repo in kubernetes cri-o fedora updates cri-o-old; do
	rpmsign --define "_gpg_name $fpr" --define "__gpg $(command -v gpg)" --addsign "$OUT/$repo"/*.rpm >/dev/null
done
for repo in kubernetes kubernetes-unsigned cri-o cri-o-old fedora fedora-unsigned updates; do
	createrepo_c --quiet "$OUT/$repo"
	cp "$OUT/key.asc" "$OUT/$repo/repodata/repomd.xml.key"
done
rm -rf "$work"

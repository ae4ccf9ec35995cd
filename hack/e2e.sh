#!/usr/bin/env bash
# `make e2e`: builds the real tools that are not cached yet (hack/tools.sh; about an hour cold on 2 cores (CONTRIBUTING.md), seconds
# warm), starts a throwaway etcd + kube-apiserver + kube-controller-manager on loopback (hack/start-kube.sh, which
# stops them again however the tests end), and runs the e2e-tagged tests against it. A missing tool fails the run
# instead of skipping it, unless the caller sets DYNK8S_REQUIRE_TOOLS to empty.
# TestKubeletJoin, the box tests (TestBoxNode..., TestBoxGateway...) and TestBurst... need root (namespaces, mounts,
# systemd-nspawn); they leave nothing behind on the host.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
hack/tools.sh
export DYNK8S_REQUIRE_TOOLS=${DYNK8S_REQUIRE_TOOLS-1}
# kubeadm validates the JoinConfiguration every pool renders (a unit test that needs the tool built above).
PATH="$(hack/tools.sh --print-path):$PATH" DYNK8S_REQUIRE_KUBEADM=1 \
	go test -count=1 -run 'TestNodeJoinConfigurationPassesKubeadmValidate' -v ./cloudinit/
hack/start-kube.sh go test -tags e2e -count=1 -timeout 45m -v ./e2e/
echo "e2e: done in $((SECONDS - start)) s" >&2

#!/usr/bin/env bash
# Cross-builds the node agent (./node/cmd/dynk8s-node) and the cluster's controller (./cluster/cmd/dynk8s-controller)
# into OUT (default build/agent) as <program>-linux-amd64 and <program>-linux-arm64, reproducibly: the same source and
# the same Go release give the same bytes on any machine, whatever its path, build cache, VCS state or environment
# (the stack pins each binary by its sha256, so a byte that changed without the source changing would roll a new
# launch template version, or the controller's Deployment). Run by `make build`.
set -euo pipefail

# The Go release the agent is built with: another release (even a patch release) compiles different bytes and so a
# different hash. A local toolchain of another release fetches this one through the Go module proxy (GOTOOLCHAIN).
readonly AGENT_GO=go1.26.8

out=${1:-build/agent}
mkdir -p "$out"
# Everything that reaches the bytes is set here, not taken from the caller's environment: no cgo (one static
# binary), the module graph exactly as go.sum has it, the baseline instruction sets, no experiments.
export GOTOOLCHAIN=$AGENT_GO CGO_ENABLED=0 GOFLAGS=-mod=readonly GOOS=linux GOAMD64=v1 GOARM64=v8.0 GOEXPERIMENT=
for program in node/cmd/dynk8s-node cluster/cmd/dynk8s-controller; do
	for arch in amd64 arm64; do
		# -trimpath: no file system path; -buildvcs=false: no commit or dirty flag (a commit elsewhere in the repository
		# would change the hash); -s -w: no symbol table or DWARF; -buildid=: no build id, which hashes the inputs'
		# paths.
		GOARCH=$arch "${GO:-go}" build -trimpath -buildvcs=false -ldflags='-s -w -buildid=' \
			-o "$out/${program##*/}-linux-$arch" "./$program"
	done
done

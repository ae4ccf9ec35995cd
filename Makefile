# dynk8s build and test entry points. `make test` is the whole suite and installs what it needs on a fresh
# Debian machine (the validators from Debian, the linter with `go install`).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
GOLANGCI_LINT_VERSION := v2.15.0
GOBIN := $(shell $(GO) env GOPATH)/bin
GOLANGCI_LINT := $(GOBIN)/golangci-lint
# Debian packages the tests run for real: cloud-init (schema), shellcheck, wireguard-tools (wg parser), nftables
# (nft -c on the gateway ruleset), systemd (systemd-analyze verify of the units the user data writes); and what the
# bootstrap under test runs for real beside its stand-ins: curl (its S3 fetch); and python3, which no unit test runs
# any more (the e2e's moto does).
# Nothing else of the host's reaches a script under test (internal/testkit/realtools.ClosedPath); `make fresh` proves
# this list is enough.
DEBIAN_TOOLS := cloud-init:cloud-init shellcheck:shellcheck wg:wireguard-tools nft:nftables curl:curl \
	python3:python3 systemd-analyze:systemd

.PHONY: help test tools fmt-check vet lint unit plan golden e2e bench-burst bench-cache fresh build preview up clean

## help: list the targets.
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## test: everything CI runs: formatting, vet, lint, unit and mock-engine tests with the real validators.
test: tools fmt-check vet lint unit

## tools: install the Debian validators and the linter when missing.
tools:
	@missing=""; for t in $(DEBIAN_TOOLS); do cmd=$${t%%:*}; pkg=$${t##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@if ! $(GOLANGCI_LINT) version 2>/dev/null | grep -q "$(GOLANGCI_LINT_VERSION:v%=%)"; then \
	  echo "installing golangci-lint $(GOLANGCI_LINT_VERSION)"; \
	  $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); \
	fi

## fmt-check: fail when gofmt would change a file.
fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## vet: go vet, e2e files included.
vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/

## lint: golangci-lint (.golangci.yml), e2e files included.
lint: tools
	$(GOLANGCI_LINT) run --build-tags e2e ./...

## unit: the Go tests; DYNK8S_REQUIRE_TOOLS makes a missing validator a failure instead of a skip.
# The timeout only catches a hang. TestAgentBuildIsReproducible builds the agent and the controller twice, once from
# an empty build cache: its time is the machine's (it outlasted go test's default 10 minutes on a fresh, loaded
# 2-core machine), so it runs alone after the rest, its compiles competing with no other package's, bounded by its
# work and not by a clock (its two builds end or fail on their own).
UNIT_TIMEOUT ?= 60m
REPRODUCIBLE := ^TestAgentBuildIsReproducible$$
unit:
	DYNK8S_REQUIRE_TOOLS=1 $(GO) test -count=1 -timeout $(UNIT_TIMEOUT) -skip '$(REPRODUCIBLE)' ./...
	$(GO) test -count=1 -timeout 0 -run '$(REPRODUCIBLE)' -v .

## build: the program Pulumi runs (Pulumi.yaml: runtime.options.binary) and the node agent it uploads, reproducibly.
# The agent: build/agent/dynk8s-node-linux-{amd64,arm64} (hack/build-agent.sh). Build before preview or up.
build:
	$(GO) build -trimpath -o build/dynk8s .
	GO=$(GO) hack/build-agent.sh build/agent

STACK ?= dev
## preview, up: build, then run Pulumi on STACK (default dev).
preview: build
	pulumi preview --stack $(STACK) --diff

up: build
	pulumi up --stack $(STACK) --diff

## plan: what the dev stack declares, offline.
plan:
	$(GO) run ./cmd/plan -stack dev

## golden: rewrite the golden files after a deliberate change; review the diff before committing.
golden:
	$(GO) test ./... -update

## e2e: the in-cluster component through the real Pulumi engine onto a real kube-apiserver (see hack/).
e2e:
	./hack/e2e.sh

## bench-burst: the burst benchmark, BURST_RUNS runs of each of BURST_VARIANTS in the box, its tables to BURST_OUT
## (root; not part of CI: docs/warm-pools.md is pasted from its output).
BURST_RUNS ?= 5
BURST_VARIANTS ?= awake,asleep,asleep-node,baked,warm-stopped,warm-running
BURST_OUT ?= burst-bench.md
bench-burst:
	hack/tools.sh
	PATH="$$(hack/tools.sh --print-path):$$PATH" DYNK8S_REQUIRE_TOOLS=1 hack/start-kube.sh $(GO) test -tags e2e \
		-count=1 -timeout 0 -run 'TestBurstBenchmark$$' -v ./e2e/ -args -burst.runs=$(BURST_RUNS) \
		-burst.variants=$(BURST_VARIANTS) -burst.out=$(abspath $(BURST_OUT))

## bench-cache: the build cache benchmark, CACHE_RUNS cold and warm Go builds of CACHE_PKG in the box, its table to
## CACHE_OUT (root; not part of CI: docs/build-caches.md is pasted from its output).
CACHE_RUNS ?= 3
CACHE_PKG ?= ./node/cmd/dynk8s-node
CACHE_OUT ?= cache-bench.md
bench-cache:
	hack/tools.sh
	PATH="$$(hack/tools.sh --print-path):$$PATH" DYNK8S_REQUIRE_TOOLS=1 $(GO) test -tags e2e -count=1 -timeout 0 \
		-run 'TestCacheBenchmark$$' -v ./e2e/ -args -cache.runs=$(CACHE_RUNS) -cache.pkg=$(CACHE_PKG) \
		-cache.out=$(abspath $(CACHE_OUT))

## fresh: `make test` on a clean clone of HEAD in a fresh Debian root with only CONTRIBUTING.md's prerequisites (root).
fresh:
	./hack/fresh.sh

## clean: remove the built program.
clean:
	rm -rf build

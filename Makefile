# knotless — see README.md. Every target builds what it needs.
SHELL := /usr/bin/env bash
export GONOSUMDB := github.com/kcp-dev

BIN := $(CURDIR)/bin
GO_PACKAGES = $(shell go list ./... | grep -v /e2e)

.PHONY: e2e-kind lexicons-publish release clean-tools dev-plan images node-image chart-lint bench-apps bench-watch bench-mountproxy bench-mountproxy-unit all build tools stack-deps codegen-tools controller-gen crds generate verify lint test test-unit fuzz e2e dev bench-engage bench-records bench-tenant clean

# The commit is stamped into the binaries and printed in their start-up line.
LDFLAGS = -X github.com/knotless-dev/knotless/cmd/internal/buildinfo.Commit=$(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)

all: build

## build: the knotless binaries into bin/ (provider, mount proxy, agent, kubectl plugin)
build:
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/knotless-provider ./cmd/knotless-provider
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/knotless-mountproxy ./cmd/knotless-mountproxy
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/knotless-agent ./cmd/knotless-agent
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/kubectl-knotless ./cmd/kubectl-knotless

## images: container images of both binaries with docker, FROM scratch (hack/images.sh; KNOTLESS_IMAGE_TAG, default dev)
images:
	hack/images.sh

## node-image: a kind node image (Kubernetes, etcd, CoreDNS, pause, Debian) built here from pinned sources, no registry (hack/node-image/build.sh; cached in the tools cache; prints its tag)
node-image:
	hack/node-image/build.sh

## release: versioned artifacts in dist/$(VERSION)/ (images saved, chart packaged, agent tarball with kcp and a systemd unit, SBOMs, SHA256SUMS; hack/release.sh)
release:
	VERSION=$(VERSION) hack/release.sh

## lexicons-publish: the lexicons as com.atproto.lexicon.schema records in the authority's repo (PDS=, IDENTIFIER=, APP_PASSWORD_FILE=; refused if breaking), then lexicons/published/ (hack/lexpublish)
lexicons-publish:
	go run ./hack/lexpublish --pds "$(PDS)" --identifier "$(IDENTIFIER)" --app-password-file "$(APP_PASSWORD_FILE)" $(LEXPUBLISH_FLAGS)

## chart-lint: helm lint and helm template of deploy/charts/knotless (helm pinned in hack/tools/helm)
chart-lint:
	hack/tool.sh helm helm.sh/helm/v3/cmd/helm
	hack/chart-lint.sh

# Pinned tools as module=package (hack/tools/<module>), for hack/tool.sh.
KCP_TOOLS := kcp=github.com/kcp-dev/kcp/cmd/kcp kcp=github.com/kcp-dev/kcp/cmd/kcp-front-proxy \
	kubectl-kcp=github.com/kcp-dev/cli/cmd/kubectl-ws kubectl-kcp=github.com/kcp-dev/cli/cmd/kubectl-kcp
VAULT_TOOLS := vault=github.com/hashicorp/vault
# build MODULE=PACKAGE...: hack/tool.sh once per module.
build-tools = set -e; $(foreach m,$(sort $(foreach t,$(1),$(firstword $(subst =, ,$(t))))),hack/tool.sh $(m) $(foreach t,$(filter $(m)=%,$(1)),$(word 2,$(subst =, ,$(t))));)

## tools: kcp and the kubectl plugins from their pinned tool modules
tools:
	$(call build-tools,$(KCP_TOOLS))

## stack-deps: the test stack: Node 22 + PDS + PLC (hack/stack/install.sh) and the Vault dev server binary
stack-deps:
	hack/stack/install.sh
	$(call build-tools,$(VAULT_TOOLS))

codegen-tools: controller-gen
	hack/tool.sh codegen github.com/kcp-dev/sdk/cmd/apigen

controller-gen:
	hack/tool.sh codegen sigs.k8s.io/controller-tools/cmd/controller-gen

## generate: Go types -> deepcopy + CRDs (controller-gen) -> APIResourceSchemas (apigen) + the one APIExport (hack/mergeexports)
generate: codegen-tools crds
	$(BIN)/apigen --input-dir apis/crds --output-dir exports
	go run ./hack/mergeexports exports knotless.dev

# crds: Go types -> deepcopy + CRDs (controller-gen), the first half of generate.
crds: controller-gen
	$(BIN)/controller-gen object:headerFile=hack/boilerplate.go.txt paths=./apis/...
	rm -rf apis/crds
	$(BIN)/controller-gen crd paths=./apis/... output:crd:artifacts:config=apis/crds

## verify: fail when generated files are stale: controller-gen's output must be the committed apis/, and exports/ what apigen would make of it (exports' TestExportsAreCurrent compares as apigen does, so verify needs no apigen build)
verify: crds
	@changed=$$(git status --porcelain -- apis); \
	if [ -n "$$changed" ]; then echo "generated files are stale; run make generate and commit:"; echo "$$changed"; git diff --stat -- apis; exit 1; fi
	@out=$$(go test -count=1 -run '^TestExportsAreCurrent$$' ./exports/ 2>&1) || { echo "$$out"; echo "exports/ is stale; run make generate and commit"; exit 1; }
	@echo "generated files are up to date"

## lint: golangci-lint (pinned in hack/tools/golangci-lint) with .golangci.yml
lint:
	hack/tool.sh golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	$(BIN)/golangci-lint run ./...

## test: unit tests, then the e2e suite against a real kcp (or $$KNOTLESS_E2E_KUBECONFIG)
test: test-unit e2e

# go vet runs every analyzer on every package, tests and e2e included, so
# go test's own vet (a subset, whose facts it computes for all 1,450
# packages again; go vet's took 172 CPU-s measured alone) is off.
test-unit:
	go vet ./...
	go test -vet=off -count=1 $(GO_PACKAGES)

## fuzz: every Go fuzz target (testing.F) for FUZZTIME each (default 20s; FUZZ=<regexp> picks targets), one at a time (hack/fuzz.sh)
fuzz:
	FUZZTIME=$${FUZZTIME:-20s} hack/fuzz.sh

# The suite takes about 32 min in a warm CI run and 52 min in a cold one,
# where the node image, the release, lint and fuzz build beside it (1936 s
# and 3110 s, measured at 55437ef and 27c2960): its timeout is a guard
# against a hang, not a goal, with room for a slower machine than this.
e2e: tools stack-deps
	go vet ./e2e/ ./e2e/stack/
	KCP_BIN=$(BIN)/kcp go test -vet=off -p 1 -count=1 -timeout 80m -v ./e2e/ ./e2e/stack/

## e2e-kind: offline kind path (hack/kind-e2e.sh): kind from the node image, kcp FROM scratch with kcp-front-proxy, knotless's images and chart (smoke: both Deployments Ready), then the e2e suite through them (KIND_E2E_RUN, default the mount tests; KIND_KEEP=1 keeps the cluster; logs in bin/kind-e2e/logs)
e2e-kind:
	hack/kind-e2e.sh

## dev: local kcp + knotless-provider; prints what to try; Ctrl-C stops everything
dev: dev-plan tools build
	hack/dev.sh

# dev-plan: one line saying what make dev will build before it starts.
dev-plan:
	@hack/tool.sh --plan $(KCP_TOOLS) $(VAULT_TOOLS)

## bench-engage: provider RSS and engagement time for N workspaces (N=200)
bench-engage: tools
	KCP_BIN=$(BIN)/kcp KNOTLESS_E2E_SCALE=$${N:-200} go test -count=1 -timeout 60m -v -run TestEngagementAtScale ./e2e/

## clean: build outputs and local data; the tools cache stays (make clean-tools)
clean:
	rm -rf bin .dev e2e/_artifacts

## clean-tools: the shared cache of pinned tool builds (KNOTLESS_TOOLS_CACHE, default ~/.cache/knotless/tools)
clean-tools:
	rm -rf "$${KNOTLESS_TOOLS_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/knotless/tools}"

## bench-apps: reconciles/s of the application and component controllers (W workspaces x C components)
bench-apps: tools stack-deps
	KCP_BIN=$(BIN)/kcp KNOTLESS_E2E_APPS_BENCH=$${W:-200},$${C:-10} go test -count=1 -timeout 120m -v -run TestApplicationThroughput ./e2e/

## bench-watch: events/s of the firehose library vs indigo's consumer (N events) and lag at R writes/s
bench-watch: tools stack-deps
	KCP_BIN=$(BIN)/kcp KNOTLESS_E2E_WATCH_BENCH=$${N:-2000},$${R:-20} go test -count=1 -timeout 60m -v -run TestWatchThroughput ./e2e/

## bench-mountproxy: GET latency and requests/s straight to a tenant kcp vs through the shim (and kcp-front-proxy), N requests; also a market tenant reached with the DID token
bench-mountproxy: tools stack-deps
	KCP_BIN=$(BIN)/kcp KNOTLESS_E2E_SKIP_VAULT=1 KNOTLESS_E2E_MOUNT_BENCH=$${N:-5000} go test -count=1 -timeout 40m -v -run 'TestMountProxyThroughput|TestMarketMountThroughput' ./e2e/

## bench-mountproxy-unit: the same against a trivial Go TLS tenant (the shim's own cost)
bench-mountproxy-unit:
	KNOTLESS_MOUNTPROXY_BENCH=$${N:-5000} go test -count=1 -v -run TestShimOverhead ./mountproxy/

## bench-market: request -> contract on both sides for R requesters x B bidders (bid window S seconds)
bench-market: tools stack-deps
	KCP_BIN=$(BIN)/kcp KNOTLESS_E2E_SKIP_VAULT=1 KNOTLESS_E2E_MARKET_BENCH=$${R:-50},$${B:-5},$${S:-5} go test -count=1 -timeout 60m -v -run TestMarketThroughput ./e2e/

## bench-tenant: MarketRequester -> kubectl through the mounted tenant, p50 over N walks, plain and migrating (DRIVER=kind: kind VMs, and -> pod Running)
bench-tenant: tools stack-deps
	KCP_BIN=$(BIN)/kcp KNOTLESS_E2E_TENANT_BENCH=$${N:-5} KNOTLESS_E2E_TENANT_DRIVER=$(DRIVER) go test -count=1 -timeout 60m -v -run TestTenantWalkTimes ./e2e/

## bench-records: records/s of knotless vs a plain client loop (N records, W workspaces)
bench-records: tools stack-deps
	KCP_BIN=$(BIN)/kcp KNOTLESS_E2E_BENCH=$${N:-1000},$${W:-100} go test -count=1 -timeout 90m -v -run TestRecordThroughput ./e2e/

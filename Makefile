# nodeplug — build, test, lint and run.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

# Tool versions. Each Go tool is also pinned in its own module under tools/
# (buf, grpcurl, golangci-lint and Jaeger pin dependencies that would move
# nodeplug's own); protoc-gen-go and protoc-gen-go-grpc are tool lines in
# go.mod.
BUF_VERSION           := v1.75.0
GRPCURL_VERSION       := v1.9.4
GOLANGCI_LINT_VERSION := v2.15.0
JAEGER_VERSION        := v1.76.0
COMPOSE_VERSION       := v5.6.0
NFPM_VERSION          := v2.48.0
# The control plane of make test-cluster, at the k8s.io release nodeplug
# builds on (pinned in tools/kube-apiserver/go.mod and tools/etcd/go.mod).
KUBE_VERSION          := v1.37.2
ETCD_VERSION          := v3.7.3

VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
TOOLS     ?= $(HOME)/.cache/nodeplug/tools
BUF       := $(TOOLS)/buf-$(BUF_VERSION)
GRPCURL   := $(TOOLS)/grpcurl-$(GRPCURL_VERSION)
JAEGER    := $(TOOLS)/jaeger-$(JAEGER_VERSION)
GOLANGCI_LINT := $(TOOLS)/golangci-lint-$(GOLANGCI_LINT_VERSION)
NFPM      := $(TOOLS)/nfpm-$(NFPM_VERSION)
KUBE_APISERVER := $(TOOLS)/kube-apiserver-$(KUBE_VERSION)
ETCD      := $(TOOLS)/etcd-$(ETCD_VERSION)
CLUSTER_BIN := $(TOOLS)/cluster-$(KUBE_VERSION)-etcd-$(ETCD_VERSION)
# The Debian package's version (make package): see scripts/package-version.sh.
PKG_VERSION ?= $(shell scripts/package-version.sh 2>/dev/null || echo 0.0.0)
PACKAGE_ARCHES ?= amd64 arm64
export BUF_CACHE_DIR ?= $(HOME)/.cache/nodeplug/buf
export GOLANGCI_LINT_CACHE ?= $(HOME)/.cache/nodeplug/golangci-lint
export DOCKER_CONFIG ?= $(HOME)/.docker

BINARIES := nodeplug-watcher:./services/watcher \
            nodeplug-reconciler:./services/reconciler \
            nodeplug-devicemanager:./services/devicemanager \
            nodeplug-apiserver:./services/apiserver \
            nodeplug-dramanager:./services/dramanager \
            nodeplugctl:./cmd/nodeplugctl \
            nodeplug-sampleplugin:./cmd/nodeplug-sampleplugin \
            nodeplug-bench:./cmd/nodeplug-bench \
            nodeplug-chaos:./cmd/nodeplug-chaos \
            nodeplug-console:./cmd/nodeplug-console
# What make run starts, and nodeplugctl beside it: a first make run compiles
# no more than these.
RUN_BINARIES := $(filter nodeplug-apiserver:% nodeplug-watcher:% nodeplug-reconciler:% nodeplug-devicemanager:% nodeplug-dramanager:% nodeplugctl:% nodeplug-sampleplugin:% nodeplug-console:%,$(BINARIES))
LDFLAGS  := -s -w -X github.com/nodeplug/nodeplug/pkg/version.Version=$(VERSION)
TEST_TIMEOUT ?= 45m
TEST_P ?= 4

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  \033[1m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every binary (static, CGO off) into bin/.
	@scripts/build.sh '$(LDFLAGS)' $(BINARIES)

.PHONY: build-run
build-run: ## Build only what make run starts (no bench, chaos or grpcurl).
	@scripts/build.sh '$(LDFLAGS)' $(RUN_BINARIES)

.PHONY: test
test: ## Run every test under the race detector, and the upstream-plugin module test/upstream beside them (the compose test runs when a Docker engine answers); TEST_P packages at a time (default 4).
	@TEST_TIMEOUT=$(TEST_TIMEOUT) TEST_P=$(TEST_P) scripts/test.sh

.PHONY: test-cluster
test-cluster: $(KUBE_APISERVER) $(ETCD) ## Run the cluster tests: nodeplug beside a real kube-apiserver and etcd (built from the Go module proxy, about 20 minutes the first time; cached), with deploy/rbac's permissions, one node then three.
	@mkdir -p $(CLUSTER_BIN)
	@ln -sf $(KUBE_APISERVER) $(CLUSTER_BIN)/kube-apiserver
	@ln -sf $(ETCD) $(CLUSTER_BIN)/etcd
	NODEPLUG_CLUSTER_BIN=$(CLUSTER_BIN) go -C test/upstream test -race -count=1 -timeout $(TEST_TIMEOUT) -run '^TestCluster' -v .

.PHONY: fuzz
fuzz: ## Run every Go fuzz target for FUZZTIME each (default 10s); seeds also run in make test.
	FUZZTIME=$(or $(FUZZTIME),10s) scripts/fuzz.sh

.PHONY: stress-test
stress-test: ## Run the suite under a CPU hog (stress-ng): make test x3, then -count=20 (e2e -count=3); SHORT=1 for CI's short form.
	SHORT=$(SHORT) TEST_TIMEOUT=$(TEST_TIMEOUT) TEST_P=$(TEST_P) scripts/stress-test.sh

.PHONY: chaos
chaos: build ## Kill services under load and damage the checkpoint; check nothing acknowledged is lost (table + chaos-results.json).
	bin/nodeplug-chaos -bin bin -json chaos-results.json $(CHAOS_FLAGS)

.PHONY: bench
bench: build kubeletreg ## Run the benchmarks: nodeplug-bench against real processes (its ratios compared with bench/baseline.json; BENCH_FLAGS='-write-baseline bench/baseline.json' records a new one), then the Go benchmarks.
	bin/nodeplug-bench -bin bin -json bench-results.json $(BENCH_FLAGS)
	go test -run '^$$' -bench . -benchmem ./...

.PHONY: figures
figures: build kubeletreg ## Measure the figures the docs show: nodeplug-bench into docs/figures/bench.md, a cold build of what make run builds into docs/figures/build.md (each with the date and the machine).
	bin/nodeplug-bench -bin bin -json bench-results.json -markdown docs/figures/bench.md $(BENCH_FLAGS)
	scripts/figures-build.sh docs/figures/build.md '$(LDFLAGS)' $(RUN_BINARIES)

.PHONY: bench-apiflood
bench-apiflood: build ## nodeplug-apiserver alone under a flood (500 watches that never read, 300 slice create/delete, 150 updates of a maximal object): its peak and settled RSS and heap.
	bin/nodeplug-bench -scenario apiflood

.PHONY: kubeletreg
kubeletreg: ## Build bin/kubeletreg (module test/upstream): the kubelet's own plugin manager, which nodeplug-bench's floor phase measures beside nodeplug when run as root.
	CGO_ENABLED=0 go -C test/upstream build -trimpath -ldflags '-s -w' -o ../../bin/kubeletreg ./cmd/kubeletreg

.PHONY: generate
generate: $(BUF) ## Regenerate pkg/api from proto/ with buf.
	$(BUF) generate

.PHONY: check-generate
check-generate: generate ## Fail when the committed generated code is stale.
	@if [ -n "$$(git status --porcelain -- pkg/api)" ]; then \
	  git status --porcelain -- pkg/api; git diff --stat -- pkg/api; \
	  echo "generated code in pkg/api is stale: run 'make generate' and commit"; exit 1; \
	fi
	@echo "generated code is current"

.PHONY: docs
docs: ## Regenerate docs/reference/ (the configuration and nodeplugctl references) from the flag and command tables, and the permission table of docs/dra-drivers.md from the dramanager's rules; make test fails when they are stale.
	NODEPLUG_UPDATE_DOCS=1 go test -count=1 -run '^TestReference$$' ./pkg/app/ ./cmd/nodeplugctl/ \
	  ./services/watcher/ ./services/reconciler/ ./services/devicemanager/ ./services/dramanager/ ./services/apiserver/ \
	  ./services/dramanager/internal/kubeaccess/

.PHONY: lint
lint: $(BUF) $(GOLANGCI_LINT) ## gofmt, go vet, golangci-lint (.golangci.yml: import rules, funlen), file lengths (internal/filelen), buf lint, buf format, buf breaking against the previous commit.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^pkg/api/')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(GOLANGCI_LINT) run ./...
	go run ./internal/filelen -max 600 services pkg
	go -C test/upstream vet ./...
	cd test/upstream && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@if git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
	  echo "buf breaking against HEAD~1"; $(BUF) breaking --against '.git#ref=HEAD~1'; \
	else echo "buf breaking: no previous commit with protos, skipped"; fi

.PHONY: tools
tools: $(BUF) $(GRPCURL) $(GOLANGCI_LINT) $(NFPM) ## Install the pinned tools (skipped when present).

$(BUF):
	@scripts/tool-build.sh tools/buf $@ github.com/bufbuild/buf/cmd/buf

$(GRPCURL):
	@scripts/tool-build.sh tools/grpcurl $@ github.com/fullstorydev/grpcurl/cmd/grpcurl

$(GOLANGCI_LINT):
	@scripts/tool-build.sh tools/golangci-lint $@ github.com/golangci/golangci-lint/v2/cmd/golangci-lint

$(NFPM):
	@CGO_ENABLED=0 scripts/tool-build.sh tools/nfpm $@ github.com/goreleaser/nfpm/v2/cmd/nfpm -trimpath -ldflags '-s -w'

.PHONY: package
package: $(NFPM) ## Build the Debian packages (PACKAGE_ARCHES, default amd64 arm64) into dist/: the services, nodeplugctl, systemd units under nodeplug.target, /etc/nodeplug; NODEPLUG_PACKAGER=rpm for RPMs.
	@scripts/package.sh '$(NFPM)' '$(PKG_VERSION)' $(PACKAGE_ARCHES)

# The version ldflags give kube-apiserver the version its release reports
# (and emulates), as the release's own build does.
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(patsubst v%,%,$(KUBE_VERSION)))) \
  -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION)))
$(KUBE_APISERVER):
	@CGO_ENABLED=0 scripts/tool-build.sh tools/kube-apiserver $@ k8s.io/kubernetes/cmd/kube-apiserver -trimpath -ldflags '$(KUBE_LDFLAGS)'

$(ETCD):
	@CGO_ENABLED=0 scripts/tool-build.sh tools/etcd $@ go.etcd.io/etcd/server/v3 -trimpath -ldflags '-s -w'

$(JAEGER):
	@CGO_ENABLED=0 scripts/tool-build.sh tools/jaeger $@ github.com/jaegertracing/jaeger/cmd/jaeger -trimpath -ldflags '-s -w'

.PHONY: grpcurl
grpcurl: $(GRPCURL) ## Install grpcurl and print its path.
	@echo $(GRPCURL)

.PHONY: jaeger
jaeger: $(JAEGER) ## Build Jaeger (for the compose stack) and print its path.
	@echo $(JAEGER)

.PHONY: run
run: ## Run the stack as local processes under .run/ (Ctrl-C, or SIGINT to make, stops it); refused while one runs there.
	@scripts/run.sh --check
	@scripts/build.sh '$(LDFLAGS)' $(RUN_BINARIES)
	@NODEPLUG_RUN_MAKE_PID=$$PPID GRPCURL=$(GRPCURL) scripts/run.sh

.PHONY: compose
compose: ## Make sure a current 'docker compose' is available (builds the pinned Compose when not).
	@if docker compose version >/dev/null 2>&1; then docker compose version; else \
	  echo "docker compose not found: building Compose $(COMPOSE_VERSION) and installing it as $(DOCKER_CONFIG)/cli-plugins/docker-compose"; \
	  scripts/build-compose.sh $(COMPOSE_VERSION) "$(DOCKER_CONFIG)/cli-plugins/docker-compose"; fi

.PHONY: images
images: build $(JAEGER) ## Build the container images (FROM scratch) from bin/.
	@mkdir -p bin/images && cp -f $(JAEGER) bin/images/jaeger
	@for t in apiserver watcher reconciler devicemanager dramanager sampleplugin nodeplugctl console jaeger; do \
	  docker build -q --target $$t -t nodeplug/$$t:dev . 2>&1 >/dev/null | { grep -v -e DEPRECATED -e 'legacy builder' -e buildx -e '^ *$$' || true; }; \
	  echo "built image nodeplug/$$t:dev"; done

COMPOSE_PROJECT ?= nodeplug
.PHONY: up
up: compose images ## Start the stack with docker compose (with Jaeger).
	docker compose -p $(COMPOSE_PROJECT) up -d --wait
	@scripts/compose-info.sh

.PHONY: down
down: ## Stop the compose stack and remove its containers and volumes.
	@if docker compose version >/dev/null 2>&1; then docker compose -p $(COMPOSE_PROJECT) down -v --remove-orphans; fi

.PHONY: clean
clean: ## Remove build output and the make-run state.
	rm -rf bin .run

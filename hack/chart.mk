# Helm chart checks (owned by charts/ and tests/chart/): helm built from Go modules into .bin/,
# the prometheus-operator CRDs copied from the Go module cache into .cache/, and `chart-test`.
# The versions live in one place each: hack/go/helm/go.mod and hack/go/monitoring/go.mod.
# Included from the Makefile after hack/cluster.mk (it uses VENV, PY and cluster-bins).

GO ?= go
CHART := charts/modelroll
CHART_FULL_VALUES := examples/values-full.yaml
HELM_MOD := hack/go/helm
MONITORING_MOD := hack/go/monitoring
HELM := .bin/helm
MONITORING_CRDS_DIR := .cache/monitoring-crds
MONITORING_CRD_KINDS := podmonitors servicemonitors prometheusrules
MONITORING_CRDS := $(foreach k,$(MONITORING_CRD_KINDS),$(MONITORING_CRDS_DIR)/monitoring.coreos.com_$(k).yaml)

HELM_VERSION = $(shell awk '$$1 == "helm.sh/helm/v3" {print $$2; exit}' $(HELM_MOD)/go.mod)
# helm reports its own version, and the Kubernetes version it renders for (.Capabilities and
# `helm lint`), from ldflags; without them it says v3.22 and Kubernetes v1.20. Like upstream's
# Makefile: Kubernetes 1.N for client-go v0.N.
HELM_CLIENT_GO = $(shell awk '$$1 == "k8s.io/client-go" {print $$2; exit}' $(HELM_MOD)/go.mod)
HELM_K8S_MINOR = $(word 2,$(subst ., ,$(HELM_CLIENT_GO)))
HELM_LDFLAGS = -s -w -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/internal/version.gitTreeState=clean \
	$(foreach pkg,helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil, \
		-X $(pkg).k8sVersionMajor=1 -X $(pkg).k8sVersionMinor=$(HELM_K8S_MINOR))

.PHONY: helm
helm: $(HELM) ## Build helm from Go modules into .bin/helm.

$(HELM): $(HELM_MOD)/go.mod $(HELM_MOD)/go.sum
	@mkdir -p $(dir $@)
	@echo "Building helm $(HELM_VERSION)"
	cd $(HELM_MOD) && CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -mod=readonly \
		-ldflags '$(HELM_LDFLAGS)' -o $(abspath $@) helm.sh/helm/v3/cmd/helm
	@touch $@

.PHONY: monitoring-crds
monitoring-crds: $(MONITORING_CRDS) ## Copy the PodMonitor/ServiceMonitor/PrometheusRule CRDs into .cache/.

# The module is downloaded (and checked against go.sum) into the Go module cache, whose files are
# read-only: copy them, then make the copies writable so that `make clean`-style rm works.
$(MONITORING_CRDS) &: $(MONITORING_MOD)/go.mod $(MONITORING_MOD)/go.sum
	@mkdir -p $(MONITORING_CRDS_DIR)
	cd $(MONITORING_MOD) && $(GO) mod download github.com/prometheus-operator/prometheus-operator
	dir=$$(cd $(MONITORING_MOD) && $(GO) list -m -f '{{.Dir}}' \
		github.com/prometheus-operator/prometheus-operator) && \
	for kind in $(MONITORING_CRD_KINDS); do \
		cp "$$dir/example/prometheus-operator-crd/monitoring.coreos.com_$$kind.yaml" \
			$(MONITORING_CRDS_DIR)/ || exit 1; \
	done
	chmod u+w $(MONITORING_CRDS)
	@touch $(MONITORING_CRDS)

.PHONY: chart-lint
chart-lint: $(HELM) ## helm lint, and helm template with default and full values.
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) -f $(CHART_FULL_VALUES)
	$(HELM) template modelroll $(CHART) --namespace modelroll >/dev/null
	$(HELM) template modelroll $(CHART) --namespace modelroll -f $(CHART_FULL_VALUES) >/dev/null

.PHONY: chart-test
chart-test: venv cluster-bins $(PROMETHEUS_BINS) monitoring-crds keda-bins chart-lint ## Chart checks: lint, templates, dry-run apply, PromQL against a real Prometheus, KEDA's flags.
	$(call timed,chart,$(PY) -m pytest tests/chart $(PYTEST_ARGS))

# KEDA's CRDs in the chart (templates/keda-crds.yaml renders them with autoscaling.keda.install),
# copied from the KEDA module hack/go/keda requires (hack/keda.mk); tests/chart checks the copy.
KEDA_CHART_CRDS := $(CHART)/keda/crds.yaml

.PHONY: keda-chart-crds
keda-chart-crds: ## Copy KEDA's CRDs from its Go module into the chart (charts/modelroll/keda/).
	cd $(KEDA_MOD) && $(GO) mod download github.com/kedacore/keda/v2
	dir=$$(cd $(KEDA_MOD) && $(GO) list -m -f '{{.Dir}}' github.com/kedacore/keda/v2) && \
	{ printf "# KEDA %s's CRDs (github.com/kedacore/keda/v2, config/crd/bases), written by\n" $(KEDA_VERSION); \
	  printf '# `make keda-chart-crds` from the module hack/go/keda/go.mod requires: edit nothing here.\n'; \
	  cat "$$dir"/config/crd/bases/*.yaml; } > $(KEDA_CHART_CRDS).tmp
	mv $(KEDA_CHART_CRDS).tmp $(KEDA_CHART_CRDS)

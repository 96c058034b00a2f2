# Prometheus and promtool (owned by hack/): Prometheus 3 built from the Go module proxy into .bin/,
# the version kube-prometheus-stack users run (Debian's 2.42 is three majors behind and has no
# Kubernetes discovery). The chart's PromQL checks, the e2e tests, the node tests and `make demo`
# use it. The version lives in hack/go/prometheus/go.mod. Included from the Makefile after
# hack/cluster.mk (it uses CLUSTER_BIN and CLUSTER_GO_BUILD).

PROMETHEUS_MOD := hack/go/prometheus
PROMETHEUS_BINS := $(CLUSTER_BIN)/prometheus $(CLUSTER_BIN)/promtool
PROMETHEUS_VERSION = $(shell awk '$$1 == "require" && $$2 == "github.com/prometheus/prometheus" {print $$3; exit}' $(PROMETHEUS_MOD)/go.mod)

# What `prometheus --version` reports: module v0.3NN.P is Prometheus 3.NN.P.
PROMETHEUS_RELEASE = $(shell echo $(PROMETHEUS_VERSION) | sed -E 's/^v0\.3([0-9][0-9])\.([0-9]+)$$/3.\1.\2/; s/^3\.0([0-9])/3.\1/')
PROMETHEUS_LDFLAGS = -X github.com/prometheus/common/version.Version=$(PROMETHEUS_RELEASE) \
	-X github.com/prometheus/common/version.Branch=module \
	-X github.com/prometheus/common/version.Revision=$(PROMETHEUS_VERSION)

.PHONY: prometheus
prometheus: $(PROMETHEUS_BINS) ## Build Prometheus 3 and promtool from Go modules into .bin/.

$(PROMETHEUS_BINS) &: $(PROMETHEUS_MOD)/go.mod $(PROMETHEUS_MOD)/go.sum
	@mkdir -p $(CLUSTER_BIN)
	@echo "Building Prometheus (module $(PROMETHEUS_VERSION)) and promtool"
	cd $(PROMETHEUS_MOD) && $(CLUSTER_GO_BUILD) -ldflags '-s -w $(PROMETHEUS_LDFLAGS)' -o $(abspath $(CLUSTER_BIN))/ \
		github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
	@touch $(PROMETHEUS_BINS)


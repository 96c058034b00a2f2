# The autoscaler of the integration tests (owned by hack/): KEDA's operator and metrics adapter
# built from the Go module proxy into .bin/, and KEDA's CRDs from the same module. The version
# lives in hack/go/keda/go.mod. The processes are modelroll_devcluster.keda. Included from the
# Makefile after hack/cluster.mk (it uses CLUSTER_BIN, GO and CLUSTER_GO_BUILD).

KEDA_MOD := hack/go/keda
KEDA_BINS := $(addprefix $(CLUSTER_BIN)/,keda-operator keda-adapter)
KEDA_CRDS := $(CLUSTER_BIN)/keda-crds.yaml
KEDA_VERSION = $(shell awk '$$1 == "require" && $$2 == "github.com/kedacore/keda/v2" {print $$3; exit}' $(KEDA_MOD)/go.mod)
KEDA_BUILD_DIR := $(CLUSTER_BIN)/.keda-build

.PHONY: keda-bins
keda-bins: $(KEDA_BINS) $(KEDA_CRDS) ## Build KEDA's operator and metrics adapter and write KEDA's CRDs into .bin/.

# One `go build` for the two (they share most packages); go names the outputs after their package
# directories (operator, adapter), so they are built aside and renamed. The version is what KEDA's
# own Makefile sets.
$(KEDA_BINS) &: $(KEDA_MOD)/go.mod $(KEDA_MOD)/go.sum $(KEDA_MOD)/tools.go
	@mkdir -p $(KEDA_BUILD_DIR)
	@echo "Building KEDA $(KEDA_VERSION) (operator, metrics adapter)"
	cd $(KEDA_MOD) && $(CLUSTER_GO_BUILD) \
		-ldflags "-s -w -X github.com/kedacore/keda/v2/version.Version=$(KEDA_VERSION)" \
		-o $(abspath $(KEDA_BUILD_DIR))/ github.com/kedacore/keda/v2/cmd/operator \
		github.com/kedacore/keda/v2/cmd/adapter
	mv $(KEDA_BUILD_DIR)/operator $(CLUSTER_BIN)/keda-operator
	mv $(KEDA_BUILD_DIR)/adapter $(CLUSTER_BIN)/keda-adapter
	@rmdir $(KEDA_BUILD_DIR)
	@touch $(KEDA_BINS)

# All of KEDA's CRDs: its operator starts a controller for each, eventing's included.
$(KEDA_CRDS): $(KEDA_MOD)/go.mod $(KEDA_MOD)/go.sum
	@mkdir -p $(CLUSTER_BIN)
	cd $(KEDA_MOD) && $(GO) mod download github.com/kedacore/keda/v2
	dir=$$(cd $(KEDA_MOD) && $(GO) list -m -f '{{.Dir}}' github.com/kedacore/keda/v2) && \
	for crd in "$$dir"/config/crd/bases/*.yaml; do echo "---"; cat "$$crd"; done > $@.tmp
	mv $@.tmp $@
	@echo "Wrote the KEDA $(KEDA_VERSION) CRDs to $@"

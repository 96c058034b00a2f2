# A Gateway API data plane for the node tests (owned by hack/): Traefik built from the Go module
# proxy into .bin/, and the standard channel CRDs of the Gateway API release Traefik is built
# against, from the same module graph. The version lives in hack/go/traefik/go.mod. The process
# is modelroll_devcluster.traefik. Included from the Makefile after hack/cluster.mk (it uses
# CLUSTER_BIN, GO and CLUSTER_GO_BUILD).

TRAEFIK_MOD := hack/go/traefik
TRAEFIK_BIN := $(CLUSTER_BIN)/traefik
GATEWAY_API_CRDS := $(CLUSTER_BIN)/gateway-api-crds.yaml
TRAEFIK_VERSION = $(shell awk '$$1 == "require" && $$2 == "github.com/traefik/traefik/v3" {print $$3; exit}' $(TRAEFIK_MOD)/go.mod)
GATEWAY_API_VERSION = $(shell awk '$$1 == "sigs.k8s.io/gateway-api" {print $$2; exit}' $(TRAEFIK_MOD)/go.mod)
TRAEFIK_VERSION_PKG := github.com/traefik/traefik/v3/pkg/version

.PHONY: traefik-bins
traefik-bins: $(TRAEFIK_BIN) $(GATEWAY_API_CRDS) ## Build Traefik (Gateway API data plane) and write the Gateway API CRDs into .bin/.

# What `traefik version` reports, as Traefik's own release build sets it: the module version, the
# codename its release workflow names, and a fixed build date (as the Kubernetes binaries have).
$(TRAEFIK_BIN): $(TRAEFIK_MOD)/go.mod $(TRAEFIK_MOD)/go.sum $(TRAEFIK_MOD)/tools.go
	@mkdir -p $(CLUSTER_BIN)
	@echo "Building Traefik $(TRAEFIK_VERSION)"
	cd $(TRAEFIK_MOD) && $(GO) mod download github.com/traefik/traefik/v3 && \
	dir=$$($(GO) list -m -f '{{.Dir}}' github.com/traefik/traefik/v3) && \
	codename=$$(awk '$$1 == "CODENAME:" {print $$2; exit}' "$$dir/.github/workflows/release.yaml") && \
	$(CLUSTER_GO_BUILD) -ldflags "-s -w -X $(TRAEFIK_VERSION_PKG).Version=$(TRAEFIK_VERSION) \
		-X $(TRAEFIK_VERSION_PKG).Codename=$${codename:?no CODENAME in the release workflow} \
		-X $(TRAEFIK_VERSION_PKG).BuildDate=1970-01-01T00:00:00Z" \
		-o $(abspath $@) github.com/traefik/traefik/v3/cmd/traefik
	@touch $@

# The release's standard-install.yaml is these files concatenated.
$(GATEWAY_API_CRDS): $(TRAEFIK_MOD)/go.mod $(TRAEFIK_MOD)/go.sum
	@mkdir -p $(CLUSTER_BIN)
	cd $(TRAEFIK_MOD) && $(GO) mod download sigs.k8s.io/gateway-api
	dir=$$(cd $(TRAEFIK_MOD) && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api) && \
	for crd in "$$dir"/config/crd/standard/*.yaml; do echo "---"; cat "$$crd"; done > $@.tmp
	mv $@.tmp $@
	@echo "Wrote the Gateway API $(GATEWAY_API_VERSION) standard channel CRDs to $@"

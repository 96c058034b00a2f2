# Local control plane (owned by hack/): kube-apiserver, kube-controller-manager, kubectl and etcd
# built from Go modules into .bin/, and run as plain processes on loopback the way envtest does.
# The versions live in one place each: hack/go/kubernetes/go.mod and hack/go/etcd/go.mod.

GO ?= go
CLUSTER_BIN := .bin
CLUSTER_DIR := .cluster
K8S_MOD := hack/go/kubernetes
ETCD_MOD := hack/go/etcd
# The pinned releases, read from the wrapper modules (`<tab>k8s.io/kubernetes v1.36.3 // indirect`).
K8S_VERSION = $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2; exit}' $(K8S_MOD)/go.mod)
ETCD_VERSION = $(shell awk '$$1 == "go.etcd.io/etcd/server/v3" {print $$2; exit}' $(ETCD_MOD)/go.mod)
K8S_MAJOR = $(word 1,$(subst ., ,$(patsubst v%,%,$(K8S_VERSION))))
K8S_MINOR = $(word 2,$(subst ., ,$(patsubst v%,%,$(K8S_VERSION))))

# What `kubectl version` and the server's /version report (upstream's hack/lib/version.sh sets the
# same variables; without them the binaries say v0.0.0-master+$$Format:%h$$).
K8S_VERSION_LDFLAGS = $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version, \
	-X $(pkg).gitVersion=$(K8S_VERSION) -X $(pkg).gitMajor=$(K8S_MAJOR) \
	-X $(pkg).gitMinor=$(K8S_MINOR) -X $(pkg).gitTreeState=clean \
	-X $(pkg).buildDate=1970-01-01T00:00:00Z)
# Static, stripped, reproducible binaries, as upstream builds its server components.
CLUSTER_GO_BUILD = CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -mod=readonly

K8S_BINS := $(addprefix $(CLUSTER_BIN)/,kube-apiserver kube-controller-manager kubectl)
# What a node adds (hack/node.mk): built from the same pinned module.
K8S_NODE_BINS := $(addprefix $(CLUSTER_BIN)/,kubelet kube-scheduler kube-proxy)
ETCD_BIN := $(CLUSTER_BIN)/etcd
CLUSTER_CLI := $(VENV)/bin/modelroll-cluster

.PHONY: cluster-bins
cluster-bins: $(K8S_BINS) $(ETCD_BIN) ## Build kube-apiserver, kube-controller-manager, kubectl and etcd into .bin/.

# One `go build` for the three: they share most packages, and go schedules the compiles itself.
$(K8S_BINS) &: $(K8S_MOD)/go.mod $(K8S_MOD)/go.sum
	@mkdir -p $(CLUSTER_BIN)
	@echo "Building Kubernetes $(K8S_VERSION) (kube-apiserver, kube-controller-manager, kubectl)"
	cd $(K8S_MOD) && $(CLUSTER_GO_BUILD) -ldflags '-s -w $(K8S_VERSION_LDFLAGS)' \
		-o $(abspath $(CLUSTER_BIN))/ k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
	@touch $(K8S_BINS)

$(K8S_NODE_BINS) &: $(K8S_MOD)/go.mod $(K8S_MOD)/go.sum
	@mkdir -p $(CLUSTER_BIN)
	@echo "Building Kubernetes $(K8S_VERSION) node components (kubelet, kube-scheduler, kube-proxy)"
	cd $(K8S_MOD) && $(CLUSTER_GO_BUILD) -ldflags '-s -w $(K8S_VERSION_LDFLAGS)' \
		-o $(abspath $(CLUSTER_BIN))/ k8s.io/kubernetes/cmd/kubelet \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
	@touch $(K8S_NODE_BINS)

$(ETCD_BIN): $(ETCD_MOD)/go.mod $(ETCD_MOD)/go.sum
	@mkdir -p $(CLUSTER_BIN)
	@echo "Building etcd $(ETCD_VERSION)"
	cd $(ETCD_MOD) && $(CLUSTER_GO_BUILD) -ldflags '-s -w' -o $(abspath $@) go.etcd.io/etcd/server/v3
	@touch $@

.PHONY: cluster-up
# NODE=1: a node joins it (hack/node.mk builds what it needs; needs root).
NODE ?=
cluster-up: venv cluster-bins $(if $(NODE),node-bins images) ## Start the local control plane in the background (state in .cluster/; NODE=1 adds a node that runs pods).
	@$(CLUSTER_CLI) up --dir $(CLUSTER_DIR) --bin-dir $(CLUSTER_BIN) $(if $(NODE),--node)

.PHONY: cluster-down
cluster-down: ## Stop the local control plane started by cluster-up.
	@if [ -x $(CLUSTER_CLI) ]; then $(CLUSTER_CLI) down --dir $(CLUSTER_DIR); fi

.PHONY: cluster-status
cluster-status: venv ## Say whether the local control plane is up, and where its kubeconfig is.
	@$(CLUSTER_CLI) status --dir $(CLUSTER_DIR) || true

# A real node for the local cluster (owned by hack/): kubelet, kube-scheduler and kube-proxy from
# the pinned Kubernetes module (hack/cluster.mk builds them), CoreDNS from hack/go/coredns, the
# pause container from the Kubernetes module's own C source, and every image the node runs, built
# with Docker and saved under .cache/images/ for containerd, among them modelroll-llama from the
# llama-server and model hack/llm.mk builds, modelroll-mlserver from MLServer's pins and the
# scikit-learn models of models/mlserver/, and modelroll-keda from the KEDA binaries hack/keda.mk
# builds. Included from the Makefile after hack/cluster.mk, hack/chart.mk, hack/llm.mk and
# hack/keda.mk. The node itself is modelroll_devcluster.node.

COREDNS_MOD := hack/go/coredns
COREDNS_BIN := $(CLUSTER_BIN)/coredns
PAUSE_BIN := $(CLUSTER_BIN)/pause
COREDNS_VERSION = $(shell awk '$$1 == "require" && $$2 == "github.com/coredns/coredns" {print $$3; exit}' $(COREDNS_MOD)/go.mod)
# The pause image's tag is the kubeadm default of the pinned release (cmd/kubeadm/.../constants.go).
PAUSE_TAG := 3.10.2
IMAGE_TAG = $(shell awk '$$1 == "appVersion:" {gsub(/"/, "", $$2); print $$2}' charts/modelroll/Chart.yaml)
IMAGES_DIR := .cache/images
# Empty: a Python base made from Debian packages here (hack/images/base-image.sh); set it to e.g.
# python:3.11-slim-bookworm to build on the public image instead.
PYTHON_IMAGE ?=
NODE_IMAGE_SPECS = pause=modelroll.local/pause:$(PAUSE_TAG)=$(PAUSE_BIN) \
	coredns=modelroll.local/coredns:$(COREDNS_VERSION)=$(COREDNS_BIN)
IMAGE_SOURCES := constraints.txt Dockerfile hack/images/install.py hack/images/build.sh \
	hack/images/base-image.sh hack/images/llama.Dockerfile hack/images/keda.Dockerfile \
	hack/images/mlserver.Dockerfile \
	$(shell git ls-files common sidecar gateway operator models standins 2>/dev/null)
IMAGE_TARS := $(addprefix $(IMAGES_DIR)/,$(addsuffix .tar,modelroll-operator modelroll-gateway \
	modelroll-sidecar modelroll-encoder modelroll-demo modelroll-llama modelroll-mlserver \
	modelroll-keda pause coredns))

# The host side of a node, and what builds its images: installed when missing (hack/host-packages.sh).
NODE_PACKAGES := docker.io containerd runc containernetworking-plugins iptables conntrack iproute2 \
	debootstrap

.PHONY: node-packages
node-packages: ## Install the Debian packages a local node and `make images` need, when missing.
	@hack/host-packages.sh $(NODE_PACKAGES)

.PHONY: node-bins
node-bins: cluster-bins $(K8S_NODE_BINS) $(COREDNS_BIN) $(PAUSE_BIN) ## Build kubelet, kube-scheduler, kube-proxy, CoreDNS and pause into .bin/.

$(COREDNS_BIN): $(COREDNS_MOD)/go.mod $(COREDNS_MOD)/go.sum $(COREDNS_MOD)/main.go
	@mkdir -p $(CLUSTER_BIN)
	@echo "Building CoreDNS $(COREDNS_VERSION) (the plugins a local cluster needs)"
	cd $(COREDNS_MOD) && $(CLUSTER_GO_BUILD) -ldflags '-s -w' -o $(abspath $@) .
	@touch $@

# Upstream builds pause statically from build/pause/linux/pause.c; so do we, from the module cache.
$(PAUSE_BIN): $(K8S_MOD)/go.mod $(K8S_MOD)/go.sum
	@mkdir -p $(CLUSTER_BIN)
	cd $(K8S_MOD) && $(GO) mod download k8s.io/kubernetes
	dir=$$(cd $(K8S_MOD) && $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes) && \
	gcc -Os -Wall -Werror -static -DVERSION=v$(PAUSE_TAG)-modelroll -o $@ "$$dir/build/pause/linux/pause.c"
	strip $@

.PHONY: images
images: $(IMAGE_TARS) ## Build the operator, gateway, sidecar, encoder, demo, llama (llama-server + SmolLM2), MLServer (+ scikit-learn models), KEDA, pause and CoreDNS images with Docker (.cache/images/).

$(IMAGE_TARS) &: $(IMAGE_SOURCES) $(COREDNS_BIN) $(PAUSE_BIN) $(LLAMA_SERVER) $(LLM_MODEL) \
		$(KEDA_BINS) | node-packages
	LLAMA_SERVER='$(LLAMA_SERVER)' LLM_MODEL='$(LLM_MODEL)' NODE_IMAGES='$(NODE_IMAGE_SPECS)' \
		KEDA_BINS='$(KEDA_BINS)' hack/images/build.sh $(IMAGE_TAG) '$(PYTHON_IMAGE)'
	@touch $(IMAGE_TARS)

.PHONY: node-prereqs
node-prereqs: node-packages venv node-bins images $(PROMETHEUS_BINS) $(HELM) traefik-bins ## Everything the node tests need (binaries, images, helm, Prometheus, Traefik and the Gateway API CRDs).

.PHONY: test-node
test-node: node-prereqs ## The chart and managed ModelVersions on a real local node, under load.
	$(call timed,node,$(PY) -m pytest tests/node $(PYTEST_ARGS))

# Local control plane targets (owned by hack/). Placeholder until the control plane lands.
.PHONY: cluster-bins
cluster-bins: ## Build kube-apiserver, kube-controller-manager, kubectl and etcd into .bin/.
	@true

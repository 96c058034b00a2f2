# End to end (owned by tests/e2e/ and hack/kind/): the rollout story on loopback, part of
# `make test`, and the same scenario on a kind cluster. Included from the Makefile after
# hack/cluster.mk and hack/chart.mk (it uses VENV, PY, PYTEST_ARGS, cluster-bins and HELM), and
# before hack/llm.mk: test-e2e depends on $(LLAMA_SERVER) and $(LLM_MODEL) through the targets
# llama-server and llm-model, since those variables are still empty when this rule is read.

.PHONY: test-e2e
test-e2e: venv cluster-bins $(PROMETHEUS_BINS) llama-server llm-model mlserver ## The rollout story on loopback: control plane, operator, gateway, sidecars (demo models, real LLM engines, MLServer), Prometheus.
	$(call timed,e2e,$(PY) -m pytest tests/e2e $(PYTEST_ARGS))

.PHONY: e2e-kind
e2e-kind: venv cluster-bins $(HELM) ## The same scenario on a kind cluster with the chart (needs Docker and kind).
	PYTEST_ARGS='$(PYTEST_ARGS)' hack/kind/e2e.sh

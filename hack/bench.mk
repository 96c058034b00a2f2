# Benchmarks (owned by bench/), each a modelroll-bench subcommand: the sidecar and the gateway on
# the demo model, the batcher comparison, the batching sweep, rollback latency, canary analysis,
# chat LLM scheduling, the sidecar in front of the real sentence encoder, and KServe's batcher built
# from its Go module for the comparison. Results go to bench/results/ (git-ignored). Included
# from the Makefile after hack/cluster.mk (it uses VENV and cluster-bins).
# Pass options with ARGS, e.g. make bench ARGS="--rounds 5"; `modelroll-bench <cmd> --help` lists them.

GO ?= go
KSERVE_MOD := bench/kserve
KSERVE_BATCHER := .bin/kserve-batcher
BENCH := $(VENV)/bin/modelroll-bench

.PHONY: kserve-batcher
kserve-batcher: $(KSERVE_BATCHER) ## Build KServe's batcher (pkg/batcher of its Go module) behind the sidecar's API into .bin/.

$(KSERVE_BATCHER): $(KSERVE_MOD)/go.mod $(KSERVE_MOD)/go.sum $(KSERVE_MOD)/main.go
	@mkdir -p $(dir $@)
	cd $(KSERVE_MOD) && CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -mod=readonly \
		-ldflags '-s -w' -o $(abspath $@) .

# Ray Serve's own virtualenv, for its @serve.batch in the comparison (bench/ray/).
RAY_VENV := .venv-ray

.PHONY: ray-serve
ray-serve: $(RAY_VENV)/.installed ## Make Ray Serve's virtualenv (.venv-ray) for the batcher comparison.

$(RAY_VENV)/.installed: bench/ray/requirements.txt
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install -q -r bench/ray/requirements.txt
	@touch $@

# BentoML's own virtualenv, for its adaptive batcher in the comparison (bench/bentoml/).
BENTOML_VENV := .venv-bentoml

.PHONY: bentoml
bentoml: $(BENTOML_VENV)/.installed ## Make BentoML's virtualenv (.venv-bentoml) for the batcher comparison.

$(BENTOML_VENV)/.installed: bench/bentoml/requirements.txt
	$(PYTHON) -m venv $(BENTOML_VENV)
	$(BENTOML_VENV)/bin/pip install -q -r bench/bentoml/requirements.txt
	@touch $@

# wrk (the Debian package) measures saturation throughput: installed when missing.
.PHONY: wrk
wrk: ## Install wrk (Debian package) for the benchmarks, when missing.
	@command -v wrk >/dev/null || hack/host-packages.sh wrk

.PHONY: bench
bench: venv wrk ## Every batcher against the same model and lengths, as ratios (ARGS="--model encoder": the real encoder; writes bench/results/).
	@$(MAKE) --no-print-directory kserve-batcher || \
		echo "kserve-batcher did not build; make bench measures the others and says why"
	@$(MAKE) --no-print-directory ray-serve || \
		echo "ray-serve did not install; make bench measures the others and says why"
	@$(MAKE) --no-print-directory bentoml || \
		echo "bentoml did not install; make bench measures the others and says why"
	$(BENCH) compare $(ARGS)

.PHONY: bench-sidecar
bench-sidecar: venv wrk ## Sidecar against no batching and a sleep-then-drain batcher (writes bench/results/).
	$(BENCH) sidecar $(ARGS)

.PHONY: bench-gateway
bench-gateway: venv wrk ## The gateway's added p50/p99 latency and its rate against a bare aiohttp echo server.
	$(BENCH) gateway $(ARGS)

.PHONY: bench-oip
bench-oip: venv mlserver ## MLServer (Open Inference Protocol) directly, through the sidecar (no batching, default batching) and the gateway, its own batching off and on.
	$(BENCH) oip $(ARGS)

.PHONY: bench-analysis
bench-analysis: venv ## Canary analysis against Flagger's rule on simulated traffic: false rollbacks, time to detect.
	$(BENCH) analysis $(ARGS)

.PHONY: bench-sweep
bench-sweep: venv wrk ## Max batch size x max-wait grid at several rates: the knee, and a setting for ARGS="--slo-ms N" (ARGS="--model encoder": the real encoder).
	$(BENCH) sweep $(ARGS)

.PHONY: gpu-bench-prep
gpu-bench-prep: venv ## The GPU comparison's carry folder (.gpu-carry/: fp16 weights, wheels the GPU machine lacks); prints the device call.
	$(VENV)/bin/python -m modelroll_bench.gpu_carry

# A virtualenv holding only what the GPU machine's image has of what the benchmark imports (its
# package list in the device guide), so that run.sh installs the rest from .gpu-carry/ as there.
GPU_SIM_VENV := .venv-gpu-sim

$(GPU_SIM_VENV)/.installed: constraints.txt
	rm -rf $(GPU_SIM_VENV)
	$(PYTHON) -m venv $(GPU_SIM_VENV)
	$(GPU_SIM_VENV)/bin/pip install -q -c constraints.txt aiohttp numpy prometheus-client uvloop threadpoolctl tqdm PyYAML
	@touch $@

.PHONY: bench-gpu-cpu
bench-gpu-cpu: gpu-bench-prep $(GPU_SIM_VENV)/.installed ## bench/gpu/run.sh on this CPU from a virtualenv like the GPU machine's, the numpy encoder in the GPU's place (ARGS="--quick": two minutes).
	PYTHON=$(GPU_SIM_VENV)/bin/python bash bench/gpu/run.sh --device cpu $(ARGS)

.PHONY: bench-rollback
bench-rollback: venv cluster-bins ## Time from a weight patch to the last request the gateway routes to that version.
	$(BENCH) rollback $(ARGS)

.PHONY: bench-dataplanes
bench-dataplanes: venv wrk cluster-bins traefik-bins ## The gateway beside Traefik (Gateway API) on one control plane: the hop's latency and rate, and rollback latency.
	$(BENCH) dataplanes $(ARGS)

.PHONY: bench-llm
bench-llm: venv ## Chat LLM: continuous vs static scheduling, and the TTFT sidecar + gateway add (bench/results/llm.json).
	$(BENCH) llm $(ARGS)

.PHONY: bench-llama
bench-llama: venv llama-server llm-model ## The real LLM engine (llama-server, SmolLM2-135M): N slots against one, and the TTFT sidecar + gateway add (bench/results/llama.json).
	$(BENCH) llama $(ARGS)

.PHONY: bench-encoder
bench-encoder: venv wrk kserve-batcher ## The sidecar and KServe's batcher in front of the real sentence encoder (int8; ARGS="--variant fp32"; ARGS=--stand-in: a demo model fitted to it), against no batching (bench/results/encoder.json).
	$(BENCH) encoder $(ARGS)

.PHONY: bench-simulate
bench-simulate: venv ## The sidecar's batcher simulated on the encoder's cost surface: the best static configuration at each load (ARGS=--measure: measure the surface first; ARGS=--check: against the real encoder; bench/results/simulate.json).
	$(BENCH) simulate $(ARGS)

.PHONY: bench-promote
bench-promote: venv node-bins images $(HELM) ## A canary promoted under load on the local node, with and without scale before shift (root; bench/results/promote.json).
	$(BENCH) promote $(ARGS)

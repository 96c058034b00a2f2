#!/usr/bin/env bash
# make images: the operator, gateway, sidecar, encoder and demo images from the repository's
# Dockerfile (each component's pyproject.toml names its image: hack/images/install.py), the
# llama image (llama-server and its model, hack/images/llama.Dockerfile), the MLServer image
# (MLServer and scikit-learn models, hack/images/mlserver.Dockerfile), and the two images a
# local node needs (pause, CoreDNS) from binaries built here, with a Docker engine. Each image is
# also saved as .cache/images/<name>.tar, which the local node imports into containerd (there is
# no registry to pull from).
#
#   [LLAMA_SERVER=binary LLM_MODEL=gguf] [KEDA_BINS='operator adapter'] [NODE_IMAGES=specs] \
#     hack/images/build.sh TAG [PYTHON_IMAGE]
#
# PYTHON_IMAGE empty (the default): a Python base made from Debian packages (base-image.sh).
# LLAMA_SERVER and LLM_MODEL (hack/node.mk passes the files hack/llm.mk builds): without them,
# no llama image. KEDA_BINS (KEDA's operator and metrics adapter, which hack/keda.mk builds):
# without them, no KEDA image.
# Uses the Docker engine that answers `docker info`; when none does and we are root, starts a
# private dockerd for the build (no bridge, no iptables rules: builds use the host's network)
# and stops it afterwards, leaving nothing running.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:?usage: $0 TAG [PYTHON_IMAGE]}
python_image=${2:-}
registry=${IMAGE_REGISTRY:-ghcr.io/modelroll}
out=.cache/images
# The private dockerd's state lives outside the checkout: the build context is the repository
# root, and Docker walks all of it (.dockerignore re-includes paths, so nothing can be skipped).
state_dir=${MODELROLL_STATE_DIR:-/var/lib/modelroll}
docker_dir=$state_dir/docker
docker=${DOCKER:-docker}
build_args=()
dockerd_pid=""
llama_context=""
mlserver_context=""
keda_context=""

stop_dockerd() {
  [ -n "$dockerd_pid" ] || return 0
  kill "$dockerd_pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$dockerd_pid" 2>/dev/null || true
  # dockerd starts its own containerd; a stop takes it along, but never leave one behind.
  pkill -f "containerd --config $docker_dir/exec/containerd/containerd.toml" 2>/dev/null || true
  # ... nor a mount (its network namespace, layers) under its directories.
  awk -v dir="$docker_dir/" 'index($5, dir) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r point; do umount --lazy "$point" 2>/dev/null || true; done
}
# A failed build leaves no copy of the model behind either.
trap 'rm -rf "$llama_context" "$mlserver_context" "$keda_context"; stop_dockerd' EXIT

if ! "$docker" info >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { echo "no Docker engine answers, and starting one needs root" >&2; exit 1; }
  command -v dockerd >/dev/null || { echo "dockerd is missing: apt-get install docker.io" >&2; exit 1; }
  mkdir -p "$docker_dir"
  export DOCKER_HOST=unix://$docker_dir/docker.sock
  echo "Starting a private dockerd for the build ($docker_dir, log $docker_dir/dockerd.log)"
  dockerd --host "$DOCKER_HOST" --data-root "$docker_dir/data" --exec-root "$docker_dir/exec" \
    --pidfile "$docker_dir/dockerd.pid" --bridge=none --iptables=false --ip-masq=false \
    --ip-forward=false >"$docker_dir/dockerd.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 150); do "$docker" info >/dev/null 2>&1 && break; sleep 0.2; done
  "$docker" info >/dev/null 2>&1 || { tail -20 "$docker_dir/dockerd.log" >&2; exit 1; }
  # No bridge: build steps (pip) use the host's network.
  build_args+=(--network=host)
fi
# The classic builder: it needs no BuildKit frontend image from a registry.
export DOCKER_BUILDKIT=0

if [ -z "$python_image" ]; then
  python_image=modelroll.local/python:3.11-bookworm
  # Kept while its package list is the one base-image.sh has, else made again.
  DOCKER="$docker" hack/images/base-image.sh "$python_image" "$state_dir/base-rootfs"
fi

mkdir -p "$out"
save() {  # image, file: an archive containerd's `ctr images import` takes
  "$docker" save "$1" -o "$out/$2.tar.tmp" && mv "$out/$2.tar.tmp" "$out/$2.tar"
}
python3 hack/images/install.py --images | while read -r component name; do
  image=$registry/$name:$tag
  echo "Building $image (base $python_image)"
  "$docker" build --quiet "${build_args[@]}" --build-arg "PYTHON_IMAGE=$python_image" \
    --build-arg "COMPONENT=$component" -t "$image" . >/dev/null
  save "$image" "$name"
done

# llama-server and the GGUF live outside the repository root's context (.bin/, ignored there): the
# image is built from a temporary context of its own holding the two files and llama.Dockerfile.
if [ -n "${LLAMA_SERVER:-}" ] && [ -n "${LLM_MODEL:-}" ]; then
  image=$registry/modelroll-llama:$tag
  llama_context=$(mktemp -d)
  cp hack/images/llama.Dockerfile "$llama_context/Dockerfile"
  cp "$LLAMA_SERVER" "$llama_context/llama-server"
  cp "$LLM_MODEL" "$llama_context/SmolLM2-135M-Instruct.Q4_1.gguf"
  echo "Building $image (base $python_image)"
  "$docker" build --quiet "${build_args[@]}" --build-arg "PYTHON_IMAGE=$python_image" \
    -t "$image" "$llama_context" >/dev/null
  rm -rf "$llama_context"
  save "$image" modelroll-llama
fi

# MLServer and the scikit-learn models it serves (hack/images/mlserver.Dockerfile): a context of
# its own holding MLServer's pins and the training script, so that Docker walks three files.
image=$registry/modelroll-mlserver:$tag
mlserver_context=$(mktemp -d)
cp hack/images/mlserver.Dockerfile "$mlserver_context/Dockerfile"
cp models/mlserver/requirements.txt "$mlserver_context/requirements.txt"
cp models/mlserver/train.py "$mlserver_context/train.py"
echo "Building $image (base $python_image)"
"$docker" build --quiet "${build_args[@]}" --build-arg "PYTHON_IMAGE=$python_image" \
  -t "$image" "$mlserver_context" >/dev/null
rm -rf "$mlserver_context"
save "$image" modelroll-mlserver

# KEDA's operator and metrics adapter, static Go binaries from outside the context too
# (hack/images/keda.Dockerfile), with the host's CA bundle for triggers that query over HTTPS.
if [ -n "${KEDA_BINS:-}" ]; then
  read -r keda_operator keda_adapter <<<"$KEDA_BINS"
  image=$registry/modelroll-keda:$tag
  keda_context=$(mktemp -d)
  cp hack/images/keda.Dockerfile "$keda_context/Dockerfile"
  cp "$keda_operator" "$keda_context/keda-operator"
  cp "$keda_adapter" "$keda_context/keda-adapter"
  cp /etc/ssl/certs/ca-certificates.crt "$keda_context/ca-certificates.crt"
  echo "Building $image"
  "$docker" build --quiet "${build_args[@]}" -t "$image" "$keda_context" >/dev/null
  rm -rf "$keda_context"
  save "$image" modelroll-keda
fi

# The node's own images, from binaries `make node-bins` built (hack/node.mk names them).
for spec in ${NODE_IMAGES:-}; do   # name=image:tag=binary
  IFS='=' read -r name image binary <<<"$spec"
  context=$(mktemp -d)
  cp "$binary" "$context/$name"
  printf 'FROM scratch\nCOPY %s /%s\nUSER 65535:65535\nENTRYPOINT ["/%s"]\n' "$name" "$name" "$name" \
    > "$context/Dockerfile"
  echo "Building $image"
  "$docker" build --quiet "${build_args[@]}" -t "$image" "$context" >/dev/null
  rm -rf "$context"
  save "$image" "$name"
done
ls -l "$out"

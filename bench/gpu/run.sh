#!/usr/bin/env bash
# The GPU comparison in one command, run on the GPU machine from the repository root (make
# gpu-bench-prep builds .gpu-carry/ and prints the call): installs from .gpu-carry/wheels only
# what the machine lacks, then runs modelroll_bench.gpu, its results and log in $OUT
# (bench/results/gpu/ without one). Arguments go to modelroll_bench.gpu; --device cpu runs the
# same pipeline on the numpy encoder, PYTHON names another interpreter.
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=.gpu-carry
out=${OUT:-bench/results/gpu}
python=${PYTHON:-python3}
mkdir -p "$out"
# pip leaves alone what is installed already, whatever its version: the machine's PyTorch,
# aiohttp, numpy and the rest stay as they are.
"$python" -m pip install --quiet --no-index --no-deps --no-cache-dir --root-user-action=ignore \
    --find-links "$carry/wheels" -r "$carry/wheels/requirements.txt"
# modelroll's own packages run from the working tree, in the encoder and sidecar processes too.
export PYTHONPATH="common:sidecar:models:bench:devcluster${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# The run keeps to its --budget-s; this ends it should it hang, before the device's 600 s.
timeout --kill-after=10 480 "$python" -m modelroll_bench.gpu \
    --model-zip "$carry/all-MiniLM-L6-v2-fp16.zip" --out "$out" "$@" 2>&1 | tee "$out/log.txt"

"""``bench/gpu/run.sh``: the sidecar's defaults in front of all-MiniLM-L6-v2 on a GPU (fp16 in
PyTorch, ``modelroll-encoder --variant fp16-gpu``), against no batching and a grid of static
configurations, by the protocol of Triton's batching tutorial: a closed-loop concurrency sweep
(1 to 64 clients), throughput and p95 at each point, and for each of no batching's points the
most each configuration served at that p95 or lower.

The run keeps to a time budget (``--budget-s``, everything included): the seconds per point
shrink to fit it, and a concurrency that would overrun it is not measured. Results are written
after every concurrency, so a run cut short keeps what it measured. ``--device cpu`` runs the same
pipeline on the numpy encoder (``--variant fp32``, the same fp16 zip widened), to test it on a
machine without a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from modelroll_devcluster.processes import free_port

from . import encoder, results
from .encoder import (
    BASELINE,
    SWEEP_WARMUP_S,
    EqualP95,
    Servers,
    SweepPoint,
    at_equal_p95,
    batch_costs,
    sweep_round,
)
from .loadgen import HEADERS
from .runs import machine
from .systems import Batching, System, batcher, serve

DEFAULTS = "the sidecar's defaults"
STATIC = tuple(
    System(f"arrival B={size} wait {wait} ms", "sidecar", Batching(size, wait))
    for size in (8, 32, 64)
    for wait in (2, 5)
) + tuple(
    System(f"length B={size} wait 0 ms", "sidecar", Batching(size, 0, batch_by="length"))
    for size in (32, 64)
)
"""First in, first out with a fixed wait, as Triton's dynamic batcher is tuned by hand; and by
length with no wait, the best static configuration on the CPU encoder."""
CONFIGS = (
    System(BASELINE, "sidecar", Batching(max_batch=1)),
    System(DEFAULTS, "sidecar", Batching(), defaults=True),
    *STATIC,
)
QUICK = CONFIGS[:3]
"""``--quick``: no batching, the defaults and one static configuration."""
TRITON_RATIO = 3.27
"""Triton's tutorial: dynamic batching's throughput over none's at a lower p95."""
BEST_STATIC_TARGET = 0.95
PARITY_SENTENCES = 16
MIN_COSINE = 0.999
"""The GPU's vectors against numpy's fp32 ones from the same weights: fp16 costs about 1e-4."""
MIN_POINT_S = 1.0
WRITE_MARGIN_S = 10.0


@dataclass(frozen=True)
class Options:
    device: str = "cuda"
    model_zip: Path = Path(".gpu-carry/all-MiniLM-L6-v2-fp16.zip")
    out: Path = Path("bench/results/gpu")
    budget_s: float = 330.0
    """Seconds for the whole run, from start to the last report."""
    point_s: float = 3.0
    """Seconds each point is measured, at most (less when the budget needs it)."""
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    quick: bool = False

    @property
    def configs(self) -> tuple[System, ...]:
        return QUICK if self.quick else CONFIGS

    @property
    def variant(self) -> str:
        return "fp16-gpu" if self.device == "cuda" else "fp32"


def point_seconds(options: Options, remaining_s: float, overhead_s: float) -> float:
    """Seconds per point that fit every point, each with ``overhead_s`` besides, into
    ``remaining_s``: at most ``point_s``, at least ``MIN_POINT_S`` (then the highest
    concurrencies are left out when time runs out)."""
    points = len(options.concurrencies) * len(options.configs)
    fits = (remaining_s - WRITE_MARGIN_S) / points - overhead_s
    return max(MIN_POINT_S, min(options.point_s, fits))


@dataclass(frozen=True)
class Ratios:
    """At each of no batching's points: the defaults over no batching, and over the best of the
    static configurations there; and each static configuration over no batching."""

    defaults_over_no_batching: list[EqualP95]
    defaults_over_best_static: list[EqualP95]
    static_over_no_batching: dict[str, list[EqualP95]]


@dataclass(frozen=True)
class Headline:
    """The best ratio of the defaults over no batching (Triton's figure is its best point) and
    the worst over the best static configuration (the target holds at every point)."""

    defaults_over_no_batching_best: EqualP95 | None
    triton_published: float
    defaults_over_best_static_worst: EqualP95 | None
    best_static_target: float


def ratios(points: Sequence[SweepPoint], configs: Sequence[System]) -> Ratios:
    """The ratios at equal p95 of the static configurations among ``configs``."""
    statics = [s.label for s in configs if s in STATIC]
    return Ratios(
        at_equal_p95(points, DEFAULTS),
        at_equal_p95(points, DEFAULTS, against=statics),
        {label: at_equal_p95(points, label) for label in statics},
    )


def headline(found: Ratios) -> Headline:
    over_none = [e for e in found.defaults_over_no_batching if e.ratio is not None]
    over_static = [e for e in found.defaults_over_best_static if e.ratio is not None]
    best = max(over_none, key=lambda e: e.ratio or 0.0, default=None)
    worst = min(over_static, key=lambda e: e.ratio or 0.0, default=None)
    return Headline(best, TRITON_RATIO, worst, BEST_STATIC_TARGET)


@dataclass
class Report:
    """What the run writes to gpu.json (and as text to gpu.txt), after every concurrency."""

    model: str
    machine: dict[str, Any]
    options: dict[str, Any]
    parity_min_cosine: float | None = None
    costs: dict[str, float] = field(default_factory=dict)
    point_s: float = 0.0
    sweep: list[SweepPoint] = field(default_factory=list)
    not_measured: list[int] = field(default_factory=list)
    ratios: Ratios | None = None
    headline: Headline | None = None


async def parity(model_url: str, zip_path: Path, sentences: list[str]) -> float:
    """The lowest cosine between the served vectors and numpy's fp32 ones from the same zip."""
    import numpy as np  # here: the other subcommands need neither numpy nor the encoder

    from modelroll_models.encoder import EncoderFiles, load_encoder

    async with (
        aiohttp.ClientSession() as http,
        http.post(
            model_url + "/v1/batch", data=json.dumps({"inputs": sentences}), headers=HEADERS
        ) as resp,
    ):
        resp.raise_for_status()
        served = np.array((await resp.json())["outputs"], dtype=np.float32)
    reference = await asyncio.to_thread(
        lambda: load_encoder("fp32", EncoderFiles(zip_path, Path()), 1).encode(sentences)
    )
    return float((served * reference).sum(axis=1).min())


def gpu_name() -> str:
    """The GPU as nvidia-smi names it, with its driver (empty without one)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return found.stdout.strip().replace(", ", ", driver ")
    return ""


def describe(options: Options) -> Report:
    if options.device == "cuda":
        torch = importlib.metadata.version("torch")
        text = f"all-MiniLM-L6-v2 fp16 in PyTorch {torch} on {gpu_name() or 'a CUDA GPU'}"
    else:
        numpy = importlib.metadata.version("numpy")
        text = f"all-MiniLM-L6-v2 fp16 weights widened to fp32, in numpy {numpy} on the CPU"
    host = machine()
    host["commit"] = os.environ.get("MODELROLL_COMMIT") or host["commit"]
    model = f"{text} (modelroll-encoder --variant {options.variant})"
    return Report(model, host, _jsonable(options))


def table(points: Sequence[SweepPoint], configs: Sequence[System]) -> list[str]:
    """Throughput and p95 by configuration (rows) and concurrency (columns)."""
    concurrencies = sorted({p.concurrency for p in points})
    width = max(len(s.label) for s in configs)
    lines = [f"{'req/s @ p95 ms':<{width}} " + "".join(f"{f'c={c}':>17}" for c in concurrencies)]
    for system in configs:
        cells = []
        for c in concurrencies:
            found = [p.load for p in points if p.label == system.label and p.concurrency == c]
            p95 = "-" if not found or found[0].p95_ms is None else f"{found[0].p95_ms:6.1f}"
            cells.append(f"{found[0].throughput_rps:8.1f} @ {p95}" if found else "-")
        lines.append(f"{system.label:<{width}} " + "".join(f"{cell:>17}" for cell in cells))
    return lines


def _ratio_line(name: str, found: list[EqualP95]) -> str:
    return f"{name}: {', '.join(e.text() for e in found)}"


def _coverage(report: Report) -> str:
    if not report.not_measured:
        return "every point measured"
    return "not measured for lack of time: c=" + ", ".join(map(str, report.not_measured))


def _point(found: EqualP95 | None) -> str:
    return "-" if found is None else f"{found.ratio or 0:.2f}x at p95 {found.p95_ms:g} ms"


def report_text(report: Report, configs: Sequence[System]) -> str:
    found = ratios(report.sweep, configs)
    top = headline(found)
    parity = "-" if report.parity_min_cosine is None else f"{report.parity_min_cosine:.5f}"
    costs = report.costs
    lines = [
        f"Model: {report.model}. Machine: {report.machine['cpus']} CPUs, commit "
        f"{report.machine['commit'] or 'unknown'}.",
        f"Vectors against numpy fp32 from the same weights: lowest cosine "
        f"{parity} over {PARITY_SENTENCES} sentences.",
        f"The model, HTTP included: a median sentence alone "
        f"{costs['median_sentence_alone_ms']:.1f} ms, a full batch of the "
        f"longest {costs['longest_full_batch_ms']:.1f} ms.",
        f"Closed loops of {report.point_s:.1f} s per point, one round; {_coverage(report)}.",
        "",
        *table(report.sweep, configs),
        "",
        _ratio_line(f"{DEFAULTS} over {BASELINE} at equal p95", found.defaults_over_no_batching),
        _ratio_line(
            f"{DEFAULTS} over the best static configuration at equal p95",
            found.defaults_over_best_static,
        ),
        *(
            _ratio_line(f"{label} over {BASELINE}", entries)
            for label, entries in found.static_over_no_batching.items()
        ),
        "",
        "Defaults over no batching, best point: "
        + _point(top.defaults_over_no_batching_best)
        + f" (Triton published {TRITON_RATIO}x).",
        "Defaults over the best static configuration, worst point: "
        + _point(top.defaults_over_best_static_worst)
        + f" (target {BEST_STATIC_TARGET}x).",
    ]
    return "\n".join(lines) + "\n"


def write_report(report: Report, options: Options) -> None:
    """The report with the ratios of what it has measured so far, as JSON and as text."""
    report.ratios = ratios(report.sweep, options.configs)
    report.headline = headline(report.ratios)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "gpu.json").write_text(results.dumps(report))
    (options.out / "gpu.txt").write_text(report_text(report, options.configs))


async def run(options: Options) -> Report:
    deadline = time.monotonic() + options.budget_s
    setup = encoder.Setup(rounds=1, sweep=True, concurrencies=options.concurrencies)
    payloads = encoder.sentences(setup)
    report = describe(options)
    print(f"Model: {report.model}.", flush=True)
    port = free_port()
    argv = [sys.executable, "-m", "modelroll_models", "--port", str(port)]
    argv += ["--variant", options.variant, "--model-zip", str(options.model_zip)]
    async with contextlib.AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(serve(argv, port, start_s=180.0))
        report.parity_min_cosine = cosine = await parity(
            model_url, options.model_zip, payloads[:PARITY_SENTENCES]
        )
        if cosine < MIN_COSINE:
            print(f"WARNING: the served vectors differ from numpy's: {cosine}")
        configs = options.configs
        largest = max(s.batching.max_batch for s in configs)
        report.costs = costs = await batch_costs(model_url, payloads, largest)
        print(f"Parity {cosine:.5f}; costs {costs}", flush=True)
        urls = {s.label: await stack.enter_async_context(batcher(s, model_url, 1)) for s in configs}
        servers = Servers(model_url, urls, max(0.3, 2 * costs["longest_full_batch_ms"] / 1000))
        # Besides its seconds a point takes the warm-up and the settling: quiet_s and a probe.
        overhead_s = SWEEP_WARMUP_S + servers.quiet_s + 0.2
        seconds = point_seconds(options, deadline - time.monotonic(), overhead_s)
        setup = dataclasses.replace(setup, sweep_duration_s=seconds)
        report.point_s = seconds
        write_report(report, options)
        for concurrency in options.concurrencies:
            needed = len(configs) * (seconds + overhead_s) + WRITE_MARGIN_S
            if time.monotonic() + needed > deadline:
                report.not_measured.append(concurrency)
                continue
            one = dataclasses.replace(setup, concurrencies=(concurrency,))
            report.sweep += await sweep_round(one, 0, servers, payloads, configs)
            write_report(report, options)
    print("\n" + report_text(report, configs), end="", flush=True)
    print(f"Results in {options.out}/gpu.json and gpu.txt")
    return report


def _jsonable(options: Options) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(options).items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Options()
    parser.add_argument("--device", choices=("cuda", "cpu"), default=d.device)
    parser.add_argument("--model-zip", type=Path, default=d.model_zip)
    parser.add_argument("--out", type=Path, default=d.out, help="gpu.json and gpu.txt go here")
    parser.add_argument("--budget-s", type=float, default=d.budget_s)
    parser.add_argument("--point-s", type=float, default=d.point_s)
    parser.add_argument(
        "--concurrencies",
        type=lambda text: tuple(int(c) for c in text.split(",")),
        default=d.concurrencies,
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"only {', '.join(s.label for s in QUICK)}"
    )


def options_from(args: argparse.Namespace) -> Options:
    options = Options(
        device=args.device,
        model_zip=args.model_zip,
        out=args.out,
        budget_s=args.budget_s,
        point_s=args.point_s,
        concurrencies=args.concurrencies,
        quick=args.quick,
    )
    if not options.model_zip.is_file():
        raise SystemExit(f"{options.model_zip} is not a file (make gpu-bench-prep makes it)")
    return options


def cmd(args: argparse.Namespace) -> int:
    """``modelroll-bench gpu``."""
    asyncio.run(run(options_from(args)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m modelroll_bench.gpu``, as bench/gpu/run.sh calls it: the same as
    ``modelroll-bench gpu``."""
    parser = argparse.ArgumentParser(
        prog="python -m modelroll_bench.gpu",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(parser)
    return cmd(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

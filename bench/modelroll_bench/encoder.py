"""``make bench-encoder``: the sidecar in front of a real model, ``modelroll-encoder``
(all-MiniLM-L6-v2, int8 ONNX on onnxruntime or fp32 in numpy), fed English sentences of 5 to 40
words, against the same sidecar with ``--max-batch-size 1`` (no batching: one model call per
request, through the same event loop and libraries), in one run.

Four sidecars share one encoder: the defaults (max batch 32, max-wait 10 ms, first in, first
out), ``--max-batch-size 1``, ``--batch-by length`` (a batch takes requests of similar word
counts, so less of it is padding: the model pads every input to the batch's longest), and the
same with ``--length-from tokenizer`` (similar counts of the encoder's own WordPiece tokens).

1. Throughput at saturation: wrk, closed loop (128 connections), after a one-second warm-up
   that is not counted.
2. p50/p95/p99 under Poisson arrivals at shares of the measured saturation of no batching and
   of the sidecar, fixed from the medians of part 1; a system is skipped at a rate above 90% of
   its own saturation.
3. Mean batch size and padding efficiency (useful WordPiece tokens over padded ones) from the
   encoder's own ``/v1/stats``, read around every measurement.

Before them, the encoder's own cost is measured straight over HTTP: a median sentence alone,
and a full batch of the longest sentences, which also sets how long its counters must stand
still before a backlog counts as worked through. Each part runs in rounds, the systems' order
rotating from round to round, and every figure is reported as median and range over rounds, and
as a ratio to no batching taken within a round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import random
import statistics
import sys
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from modelroll_devcluster.processes import free_port
from modelroll_devcluster.sentences import sentences as seeded_sentences
from modelroll_models import batch_cost

from . import wrk
from .figures import BatchSummary, Figure, LoadSummary
from .loadgen import closed_loop, json_bodies, open_loop
from .metrics import Watch
from .runs import (
    WRK_TIMEOUT_S,
    full_batches_rps,
    idle,
    load_average,
    machine,
    sequential_ms,
    write,
)
from .stats import Spread, paired_ratios, spread
from .systems import Batching, System, batcher, serve

T = TypeVar("T")
BASELINE = "no batching"
SYSTEMS = (
    System(BASELINE, "sidecar", Batching(max_batch=1)),
    System("sidecar", "sidecar", Batching()),
    System("sidecar, by length", "sidecar", Batching(batch_by="length")),
    System(
        "sidecar, by length in tokens",
        "sidecar",
        Batching(batch_by="length", length_from="tokenizer"),
    ),
    System("KServe batcher", "kserve", Batching()),
)
"""``Batching``'s defaults but for the one flag each row is about (max batch 32, max-wait 10 ms,
arrival order, fixed wait, one batch at a time; every flag passed, whatever the sidecar's
defaults are), with
``System.argv``'s queue of 4096 so that no closed-loop connection is refused; and KServe's batcher
(its Go package, ``make kserve-batcher``) with the same batch size and wait."""
SWEPT = (BASELINE, "sidecar", "sidecar, by length", "sidecar, by length in tokens")
"""The systems of the concurrency sweep (``--sweep``)."""
SWEEP_WARMUP_S = 0.5
"""Seconds of each sweep point's closed loop before its answers count."""
STAND_IN_FIT_REPEATS = 10
"""Batches per shape in the stand-in's cost fit (24 shapes: about 20 s on int8)."""
SKIP_ABOVE = 0.9
"""A system is not offered a rate above this share of its own saturation: its queue would only
grow, and the percentiles would measure the run's length."""


@dataclass(frozen=True)
class Setup:
    variant: str = "int8"
    intra_op_threads: int = 1
    rounds: int = 3
    duration_s: int = 10
    """Seconds of wrk per system and round (after the warm-up): a full batch of long sentences
    takes about half a second on int8, so 10 s holds some twenty of them."""
    rate_duration_s: float = 10.0
    """Seconds of Poisson arrivals per rate, system and round."""
    connections: int = 128
    """wrk's connections: with one batch of 32 in flight, 96 requests wait when the next batch
    forms, so ``--batch-by length`` has lengths to choose from (with 64, the 32 waiting are the
    whole next batch whatever the forming)."""
    shares_of_baseline: tuple[float, ...] = (0.7,)
    shares_of_sidecar: tuple[float, ...] = (0.5, 0.8)
    sentences: int = 512
    min_words: int = 5
    max_words: int = 40
    seed: int = 1
    sweep: bool = False
    """Measure only a closed-loop concurrency sweep (``concurrencies``, ``sweep_duration_s`` per
    point) of ``SWEPT``, for batching against no batching at equal p95."""
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    sweep_duration_s: float = 4.0
    stand_in: bool = False
    """Run the same measurements on ``modelroll-demo-model`` with the encoder's cost fitted as a
    line first (``modelroll_models.batch_cost``): how well a fitted stand-in predicts them."""

    @property
    def systems(self) -> tuple[System, ...]:
        """The rows measured: the stand-in serves no tokenizer, so it has no row in tokens."""
        rows = tuple(s for s in SYSTEMS if not self.sweep or s.label in SWEPT)
        if not self.stand_in:
            return rows
        return tuple(s for s in rows if s.batching.length_from == "words")


def sentences(setup: Setup) -> list[str]:
    """``setup.sentences`` sentences, word counts uniform in [min_words, max_words], seeded."""
    return seeded_sentences(setup.sentences, setup.min_words, setup.max_words, setup.seed)


def model_description(setup: Setup) -> dict[str, Any]:
    """What ran behind the sidecars, for the report and its header line."""
    if setup.variant == "int8":
        runtime = f"onnxruntime {importlib.metadata.version('onnxruntime')}"
        text = f"all-MiniLM-L6-v2 int8 ONNX via {runtime}"
    else:
        runtime = f"numpy {importlib.metadata.version('numpy')}"
        text = f"all-MiniLM-L6-v2 fp32 in {runtime}"
    threads = setup.intra_op_threads
    text += f", {threads} intra-op thread{'s' if threads > 1 else ''}"
    if setup.stand_in:
        text = f"modelroll-demo-model with the cost of {text}, fitted as a line"
    else:
        text += " (modelroll-encoder)"
    return {"variant": setup.variant, "runtime": runtime, "intra_op_threads": threads, "text": text}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (empty when it has none)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def rotated(systems: Sequence[T], r: int) -> list[T]:
    """The systems in round ``r``'s order: each round starts one system later, so drift on the
    machine does not always fall on the same one."""
    shift = r % len(systems)
    return [*systems[shift:], *systems[:shift]]


@dataclass(frozen=True)
class SaturationRow:
    """One system's wrk run in one round, how the encoder batched meanwhile, and the load."""

    round: int
    result: wrk.WrkResult
    batching: BatchSummary | None
    load_average_1m: float


@dataclass(frozen=True)
class RateRun:
    """One system's Poisson run at one rate in one round."""

    load: LoadSummary
    batching: BatchSummary | None
    load_average_1m: float


@dataclass(frozen=True)
class RateEntry:
    """A Poisson rate (a share of a system's saturation) and, by system, one run per round
    (None where the system was skipped)."""

    name: str
    share: float
    of: str
    rate_rps: float
    rounds: dict[str, list[RateRun | None]] = field(default_factory=dict)


@dataclass
class Rows:
    """Every measurement: at saturation, by system, one row per round; and each Poisson rate."""

    saturation: dict[str, list[SaturationRow]] = field(default_factory=dict)
    rates: list[RateEntry] = field(default_factory=list)


@dataclass(frozen=True)
class SaturationFigures:
    """One system at saturation over rounds: req/s (and its ratio to no batching's), the mean
    batch and padding efficiency, and its median against the model's own limit."""

    rps: Figure
    mean_batch: Spread | None
    padding_efficiency: Spread | None
    model_limit_rps: float
    share_of_limit: float


@dataclass(frozen=True)
class RateFigures:
    """One system at one rate over rounds, each with its ratio to no batching's."""

    throughput_rps: Figure
    p50_ms: Figure
    p95_ms: Figure
    p99_ms: Figure
    mean_batch: Spread | None
    padding_efficiency: Spread | None


@dataclass(frozen=True)
class RateSummary:
    name: str
    share: float
    of: str
    rate_rps: float
    systems: dict[str, RateFigures]


@dataclass(frozen=True)
class Summary:
    saturation: dict[str, SaturationFigures]
    rates: list[RateSummary]


@dataclass(frozen=True)
class Servers:
    """The running encoder and sidecars, and how long the encoder's counters must stand still
    before it counts as idle: longer than its slowest batch, or a batch still running would pass
    for idleness."""

    model: str
    urls: dict[str, str]
    quiet_s: float

    @property
    def stats(self) -> str:
        return self.model + "/v1/stats"

    async def settle(self) -> None:
        """Wait until the encoder has worked through what the last run left queued."""
        await idle(self.stats, quiet_s=self.quiet_s)


async def batch_costs(model: str, payloads: list[str], max_batch: int) -> dict[str, float]:
    """The encoder's time, HTTP included, for one sentence of median length alone, and for a
    full batch of the longest sentences (the slowest batch any sidecar here can send)."""
    ordered = sorted(payloads, key=lambda p: len(p.split()))
    url = model + "/v1/batch"
    one = await sequential_ms(url, {"inputs": [ordered[len(ordered) // 2]]}, calls=10, warmup=2)
    full = await sequential_ms(url, {"inputs": ordered[-max_batch:]}, calls=3, warmup=1)
    return {"median_sentence_alone_ms": round(one, 2), "longest_full_batch_ms": round(full, 2)}


LIMIT_SIZES = (1, 8, 16, 32)
"""Batch sizes at which the model's own limit is measured."""


async def model_limits(model: str, payloads: list[str], seed: int) -> dict[str, float]:
    """The model's own limit, nothing but full batches sent one after another straight to its
    ``POST /v1/batch``, once through all the sentences: in arrival order (shuffled, seeded), as
    a first-in-first-out batcher gets them, and sorted by length, the least padding any batcher
    can reach (it sees every sentence at once). Keyed ``"<order> B=<size>"``, in req/s."""
    shuffled = payloads[:]
    random.Random(seed).shuffle(shuffled)
    orders = {"arrival": shuffled, "sorted": sorted(payloads, key=lambda p: len(p.split()))}
    return {
        f"{name} B={size}": await full_batches_rps(model, ordered, size)
        for name, ordered in orders.items()
        for size in LIMIT_SIZES
    }


def limit_of(system: System, limits: dict[str, float]) -> float:
    """The model's limit that ``system`` could reach at best: full batches of its size, in
    arrival order, or sorted by length when it forms batches by length."""
    order = "sorted" if system.batching.batch_by == "length" else "arrival"
    return limits[f"{order} B={system.batching.max_batch}"]


def _wrk(setup: Setup, label: str, url: str, bodies: list[str], seconds: int) -> wrk.WrkResult:
    """wrk cycling through the sentences, with a timeout long enough for no batching's queue."""
    return wrk.run(
        label,
        url,
        bodies,
        connections=setup.connections,
        duration_s=seconds,
        timeout_s=WRK_TIMEOUT_S,
    )


async def saturation_round(
    setup: Setup, r: int, servers: Servers, bodies: list[str], rows: Rows
) -> None:
    for system in rotated(setup.systems, r):
        url = servers.urls[system.label] + "/v1/infer"
        await asyncio.to_thread(_wrk, setup, system.label, url, bodies, 1)  # the warm-up
        await servers.settle()
        load = load_average()
        async with Watch(servers.stats) as watch:
            result = await asyncio.to_thread(
                _wrk, setup, system.label, url, bodies, setup.duration_s
            )
        batching = watch.delta.report() if watch.delta else None
        rows.saturation.setdefault(system.label, []).append(
            SaturationRow(r + 1, result, batching, load)
        )
        print(
            f"  round {r + 1} saturation  {system.label:<19} {result.rps:7.1f} req/s  "
            f"mean batch {_fig(batching, 'mean_batch', '.1f')}  padding efficiency "
            f"{_fig(batching, 'padding_efficiency', '.2f')}  non-2xx {result.non_2xx}, "
            f"socket errors {result.socket_errors}",
            flush=True,
        )
        await servers.settle()  # wrk leaves a backlog: not part of the next row's batches


async def rate_round(
    setup: Setup,
    r: int,
    servers: Servers,
    payloads: list[str],
    rates: list[RateEntry],
    saturation: dict[str, float],
) -> None:
    bodies = json_bodies(payloads)
    for entry in rates:
        rate = entry.rate_rps
        for system in rotated(setup.systems, r):
            rounds = entry.rounds.setdefault(system.label, [])
            if rate <= 0 or rate > SKIP_ABOVE * saturation[system.label]:
                rounds.append(None)
                print(f"  round {r + 1} {entry.name:<22} {system.label:<19} skipped")
                continue
            url = servers.urls[system.label] + "/v1/infer"
            load = load_average()
            async with Watch(servers.stats) as watch:
                result = await open_loop(
                    url,
                    bodies,
                    rate,
                    setup.rate_duration_s,
                    seed=setup.seed + r,
                    label=system.label,
                )
            batching = watch.delta.report() if watch.delta else None
            run = RateRun(result.report(), batching, load)
            rounds.append(run)
            print(
                f"  round {r + 1} {entry.name:<22} {system.label:<19} p50 {_ms(run.load.p50_ms)}"
                f"  p95 {_ms(run.load.p95_ms)}  p99 {_ms(run.load.p99_ms)} ms  mean batch "
                f"{_fig(batching, 'mean_batch', '.1f')}  errors {run.load.errors or 0}",
                flush=True,
            )
            await servers.settle()


@dataclass(frozen=True)
class SweepPoint:
    """One closed loop of the sweep: its round, its concurrency and what it saw."""

    round: int
    concurrency: int
    load: LoadSummary

    @property
    def label(self) -> str:
        return self.load.label


@dataclass(frozen=True)
class EqualP95:
    """At one of no batching's points (its concurrency and median p95): the most a system
    served at that p95 or lower over the most the systems it is compared with served there,
    median over rounds and range (None where none of those reached that p95 in any round)."""

    concurrency: int
    p95_ms: float
    ratio: float | None
    range: tuple[float, float] | None

    def text(self) -> str:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}x"
        return f"{ratio} at p95 {self.p95_ms:g} ms (c={self.concurrency})"


async def sweep_round(
    setup: Setup,
    r: int,
    servers: Servers,
    payloads: list[str],
    systems: Sequence[System] | None = None,
) -> list[SweepPoint]:
    """Closed loops of each concurrency against each system (``setup.systems`` unless given):
    throughput and p50/p95/p99."""
    bodies = json_bodies(payloads)
    found = []
    for concurrency in setup.concurrencies:
        for system in rotated(systems or setup.systems, r):
            url = servers.urls[system.label] + "/v1/infer"
            result = await closed_loop(
                url,
                bodies,
                concurrency,
                setup.sweep_duration_s,
                label=system.label,
                warmup_s=SWEEP_WARMUP_S,
            )
            point = SweepPoint(r + 1, concurrency, result.report())
            found.append(point)
            print(
                f"  round {r + 1} concurrency {concurrency:3}  {system.label:<28} "
                f"{point.load.throughput_rps:6.1f} req/s  p50 {_ms(point.load.p50_ms)}  p95 "
                f"{_ms(point.load.p95_ms)}  p99 {_ms(point.load.p99_ms)} ms",
                flush=True,
            )
            await servers.settle()
    return found


def _ms(value: float | None) -> str:
    return "      -" if value is None else f"{value:7.1f}"


def most_within(points: Sequence[SweepPoint], labels: Collection[str], p95_ms: float) -> float:
    """The most any system of ``labels`` served at ``p95_ms`` or lower (0 where none did)."""
    within = [
        p.load.throughput_rps
        for p in points
        if p.label in labels and p.load.p95_ms is not None and p.load.p95_ms <= p95_ms
    ]
    return max(within, default=0.0)


def at_equal_p95(
    points: Sequence[SweepPoint], label: str, against: Collection[str] = (BASELINE,)
) -> list[EqualP95]:
    """For each point of no batching: the most ``label`` served at that p95 or lower, over the
    most any system of ``against`` served there, in each round; the medians over rounds (ratio
    None where none of ``against`` reached that p95 in any round)."""
    out = []
    for concurrency in sorted({p.concurrency for p in points if p.label == BASELINE}):
        ratios, p95s = [], []
        for r in sorted({p.round for p in points}):
            mine = [p for p in points if p.round == r]
            [budget] = [
                p.load.p95_ms for p in mine if p.label == BASELINE and p.concurrency == concurrency
            ]
            if budget is None:
                continue
            p95s.append(budget)
            if base := most_within(mine, against, budget):
                ratios.append(most_within(mine, (label,), budget) / base)
        if not p95s:
            continue
        out.append(
            EqualP95(
                concurrency=concurrency,
                p95_ms=round(statistics.median(p95s), 1),
                ratio=round(statistics.median(ratios), 2) if ratios else None,
                range=(round(min(ratios), 2), round(max(ratios), 2)) if ratios else None,
            )
        )
    return out


def _fig(batching: BatchSummary | None, key: str, fmt: str) -> str:
    value = None if batching is None else getattr(batching, key)
    return "-" if value is None else format(value, fmt)


def _paired(mine: Sequence[float | None], base: Sequence[float | None]) -> Figure:
    return Figure(spread(mine, 2), spread(paired_ratios(mine, base)))


def _batching(
    rows: Sequence[SaturationRow | RateRun | None],
) -> tuple[Spread | None, Spread | None]:
    """The median and range of the encoder's mean batch and padding efficiency."""
    found = [None if row is None else row.batching for row in rows]
    return (
        spread([None if b is None else b.mean_batch for b in found]),
        spread([None if b is None else b.padding_efficiency for b in found]),
    )


def saturation_figures(
    rows: Sequence[SaturationRow], base: Sequence[SaturationRow], limit_rps: float
) -> SaturationFigures:
    """Req/s over rounds with its ratio to the baseline's row of the same round."""
    mine = [row.result.rps for row in rows]
    mean_batch, padding_efficiency = _batching(rows)
    return SaturationFigures(
        rps=_paired(mine, [row.result.rps for row in base]),
        mean_batch=mean_batch,
        padding_efficiency=padding_efficiency,
        model_limit_rps=limit_rps,
        share_of_limit=round(statistics.median(mine) / limit_rps, 3),
    )


def rate_figures(rows: Sequence[RateRun | None], base: Sequence[RateRun | None]) -> RateFigures:
    """Throughput and p50/p95/p99 over rounds, each with its ratio to the baseline's row of the
    same round."""

    def values(found: Sequence[RateRun | None], key: str) -> list[float | None]:
        return [None if row is None else getattr(row.load, key) for row in found]

    def paired(key: str) -> Figure:
        return _paired(values(rows, key), values(base, key))

    mean_batch, padding_efficiency = _batching(rows)
    return RateFigures(
        throughput_rps=paired("throughput_rps"),
        p50_ms=paired("p50_ms"),
        p95_ms=paired("p95_ms"),
        p99_ms=paired("p99_ms"),
        mean_batch=mean_batch,
        padding_efficiency=padding_efficiency,
    )


def summarize(rows: Rows, limits: dict[str, float]) -> Summary:
    """Every system's figures; ``limits``: the model's own limit each system could reach."""
    base = rows.saturation[BASELINE]
    saturation = {
        label: saturation_figures(found, base, limits[label])
        for label, found in rows.saturation.items()
    }
    rates = [
        RateSummary(
            entry.name,
            entry.share,
            entry.of,
            entry.rate_rps,
            {
                label: rate_figures(found, entry.rounds[BASELINE])
                for label, found in entry.rounds.items()
            },
        )
        for entry in rows.rates
    ]
    return Summary(saturation, rates)


def _cell(fig: Spread | None, fmt: str, ratio: bool = False) -> str:
    if fig is None:
        return "-"
    suffix = "x" if ratio else ""
    median, low, high = (format(v, fmt) + suffix for v in (fig.median, fig.low, fig.high))
    return median if fig.rounds == 1 else f"{median} ({low}-{high})"


def print_tables(setup: Setup, summary: Summary) -> None:
    w = max(len(s.label) for s in setup.systems)
    print(
        f"\n=== Saturation: wrk, {setup.connections} connections, {setup.duration_s} s; medians "
        f"(range) over {setup.rounds} round(s); ratios to {BASELINE} paired by round ==="
    )
    print(
        f"{'system':<{w}} {'req/s':>20} {'x ' + BASELINE:>22} {'mean batch':>18} "
        f"{'padding eff.':>20}"
    )
    for label, entry in summary.saturation.items():
        print(
            f"{label:<{w}} {_cell(entry.rps.value, '.1f'):>20} "
            f"{_cell(entry.rps.ratio_to_baseline, '.2f', ratio=True):>22} "
            f"{_cell(entry.mean_batch, '.1f'):>18} "
            f"{_cell(entry.padding_efficiency, '.2f'):>20} "
            f"{entry.share_of_limit:>9.0%} of {entry.model_limit_rps:.1f}"
        )
    for rate in summary.rates:
        print(
            f"\n=== Poisson {rate.rate_rps:.1f} req/s ({rate.name}), "
            f"{setup.rate_duration_s:g} s: p50 / p95 / p99 ms (medians), p99 and p50 as ratios "
            f"to {BASELINE} ==="
        )
        print(
            f"{'system':<{w}} {'p50 / p95 / p99 ms':>24} {'p99 ratio':>22} {'p50 ratio':>22} "
            f"{'mean batch':>11} {'padding eff.':>13}"
        )
        for label, figs in rate.systems.items():
            latency = [f.value for f in (figs.p50_ms, figs.p95_ms, figs.p99_ms)]
            if any(v is None for v in latency):
                print(f"{label:<{w}} skipped: beyond {SKIP_ABOVE:.0%} of its saturation")
                continue
            pct = " / ".join(f"{v.median:.1f}" for v in latency if v is not None)
            p99, p50 = figs.p99_ms.ratio_to_baseline, figs.p50_ms.ratio_to_baseline
            mean = figs.mean_batch
            eff = figs.padding_efficiency
            print(
                f"{label:<{w}} {pct:>24} {_cell(p99, '.2f', ratio=True):>22} "
                f"{_cell(p50, '.2f', ratio=True):>22} "
                f"{'-' if mean is None else format(mean.median, '.1f'):>11} "
                f"{'-' if eff is None else format(eff.median, '.2f'):>13}"
            )


def print_equal_p95(label: str, found: list[EqualP95]) -> list[EqualP95]:
    print(f"{label} against {BASELINE} at equal p95: {', '.join(e.text() for e in found)}")
    return found


async def run(setup: Setup) -> dict[str, Any]:
    payloads = sentences(setup)
    words = [len(s.split()) for s in payloads]
    bodies = [json.dumps({"payload": p}) for p in payloads]
    model = model_description(setup)
    host = {**machine(), "cpu": cpu_model()}
    systems = ", ".join(f"{s.label} ({s.batching.name})" for s in setup.systems)
    print(
        f"Model: {model['text']}. Machine: {host['cpus']} CPUs "
        f"({host['cpu'] or 'model unknown'}), load average {host['load_average_1m']}, commit "
        f"{host['commit']}.\nSidecars: {systems}; one batch at a time.\n"
        f"{len(payloads)} sentences of {min(words)} to {max(words)} "
        f"words (median {statistics.median(words):g}, seed {setup.seed}); {setup.rounds} "
        f"round(s) of wrk ({setup.connections} connections, {setup.duration_s} s) and Poisson "
        f"arrivals ({setup.rate_duration_s:g} s per rate).",
        flush=True,
    )
    rows = Rows()
    mport = free_port()
    argv = [sys.executable, "-m", "modelroll_models", "--port", str(mport)]
    argv += ["--variant", setup.variant, "--intra-op-threads", str(setup.intra_op_threads)]
    if setup.stand_in:
        found = await asyncio.to_thread(
            batch_cost.fit, setup.variant, setup.intra_op_threads, STAND_IN_FIT_REPEATS
        )
        model["stand_in"] = asdict(found)
        flags = found.stand_in_flags()
        print(
            f"Stand-in: modelroll-demo-model {' '.join(flags)}, the encoder's cost fitted per "
            f"padded word (R^2 {found.per_word.r2:.3f}); per WordPiece token it is "
            f"{found.per_token.fixed_ms:.2f} ms + {found.per_token.per_ms:.4f} ms.",
            flush=True,
        )
        argv = [sys.executable, "-m", "modelroll_standins.model", "--port", str(mport)]
        argv += [*flags, "--parallel", "1"]
    async with contextlib.AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(serve(argv, mport))
        costs = await batch_costs(
            model_url, payloads, max(s.batching.max_batch for s in setup.systems)
        )
        print(
            f"The model, HTTP included: a median sentence alone "
            f"{costs['median_sentence_alone_ms']:.1f} ms, a full batch of the longest "
            f"{costs['longest_full_batch_ms']:.1f} ms.",
            flush=True,
        )
        limits = await model_limits(model_url, payloads, setup.seed)
        print(
            "The model's limit, full batches one after another, req/s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in limits.items()),
            flush=True,
        )
        urls = {
            s.label: await stack.enter_async_context(batcher(s, model_url, 1))
            for s in setup.systems
        }
        servers = Servers(model_url, urls, max(0.3, 2 * costs["longest_full_batch_ms"] / 1000))
        if setup.sweep:
            points = [
                row
                for r in range(setup.rounds)
                for row in await sweep_round(setup, r, servers, payloads)
            ]
            return {
                "model": {**model, **costs, "limits_rps": limits},
                "machine": host,
                "setup": asdict(setup),
                "sweep": points,
                "at_equal_p95": {
                    s.label: print_equal_p95(s.label, at_equal_p95(points, s.label))
                    for s in setup.systems
                    if s.label != BASELINE
                },
            }
        for r in range(setup.rounds):
            await saturation_round(setup, r, servers, bodies, rows)
        saturation = {
            label: statistics.median(row.result.rps for row in found)
            for label, found in rows.saturation.items()
        }
        for of, shares in (
            (BASELINE, setup.shares_of_baseline),
            ("sidecar", setup.shares_of_sidecar),
        ):
            for share in shares:
                rate = round(share * saturation[of], 1)
                rows.rates.append(RateEntry(f"{share:.0%} of {of}", share, of, rate))
        for r in range(setup.rounds):
            await rate_round(setup, r, servers, payloads, rows.rates, saturation)
    summary = summarize(rows, {s.label: limit_of(s, limits) for s in setup.systems})
    print_tables(setup, summary)
    return {
        "model": {**model, **costs, "limits_rps": limits},
        "machine": host,
        "setup": asdict(setup),
        "systems": {s.label: s.batching.name for s in setup.systems},
        "sentences": {
            "count": len(payloads),
            "words_min": min(words),
            "words_max": max(words),
            "words_median": statistics.median(words),
            "examples": payloads[:3],
        },
        "summary": summary,
        "rounds": {"saturation": rows.saturation, "rates": rows.rates},
    }


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is below 1")
    return value


def _shares(text: str) -> tuple[float, ...]:
    try:
        shares = tuple(float(s) for s in text.split(",") if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None
    if not all(0 < s < 1.5 for s in shares):
        raise argparse.ArgumentTypeError(f"{text!r}: each share must be in (0, 1.5)")
    return shares


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    parser.add_argument("--variant", choices=("int8", "fp32"), default=d.variant)
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="only a closed-loop concurrency sweep: batching against no batching at equal p95",
    )
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="measure modelroll-demo-model with the encoder's cost fitted as a line instead",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=_at_least_one,
        default=d.intra_op_threads,
        help="the encoder's (%(default)s)",
    )
    parser.add_argument("--rounds", type=_at_least_one, default=d.rounds, help="(%(default)s)")
    parser.add_argument(
        "--duration",
        type=_at_least_one,
        default=d.duration_s,
        help="seconds of wrk per row (%(default)s)",
    )
    parser.add_argument(
        "--rate-duration",
        type=float,
        default=d.rate_duration_s,
        help="seconds of Poisson arrivals per rate and system (%(default)s)",
    )
    parser.add_argument(
        "--connections", type=_at_least_one, default=d.connections, help="wrk's (%(default)s)"
    )
    parser.add_argument(
        "--shares-of-no-batching",
        type=_shares,
        default=d.shares_of_baseline,
        help="Poisson rates as shares of no batching's saturation (0.7)",
    )
    parser.add_argument(
        "--shares-of-sidecar",
        type=_shares,
        default=d.shares_of_sidecar,
        help="Poisson rates as shares of the sidecar's saturation (0.5,0.8)",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="sentences and arrivals")
    parser.add_argument(
        "--out",
        type=Path,
        help="the report (bench/results/encoder.json; with --stand-in encoder-stand-in.json)",
    )


def main(args: argparse.Namespace) -> int:
    setup = Setup(
        variant=args.variant,
        intra_op_threads=args.intra_op_threads,
        rounds=args.rounds,
        duration_s=args.duration,
        rate_duration_s=args.rate_duration,
        connections=args.connections,
        shares_of_baseline=args.shares_of_no_batching,
        shares_of_sidecar=args.shares_of_sidecar,
        seed=args.seed,
        stand_in=args.stand_in,
        sweep=args.sweep,
    )
    name = "encoder" + ("-stand-in" if setup.stand_in else "") + ("-sweep" if setup.sweep else "")
    out = args.out or Path(f"bench/results/{name}.json")
    write(asyncio.run(run(setup)), out)
    return 0

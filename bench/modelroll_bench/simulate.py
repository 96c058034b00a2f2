"""``make bench-simulate``: a discrete-event simulation of the sidecar's queue, and the best static
batching configuration at each load that it finds.

The simulation runs the sidecar's own :class:`~modelroll_sidecar.batching.Batcher`, not a copy
of its rules, on an event loop whose clock jumps to the next timer whenever nothing is ready
(:mod:`modelroll_common.virtual_time`). Its model sleeps, in that virtual time, for what a cost
surface (:mod:`.surface`) says a batch of its size and longest length takes, optionally times a
seeded lognormal noise. Requests are submitted at the times of an arrival trace (Poisson at a
rate, seeded, with lengths cycled from a sample, as the load generator cycles its bodies; or a
recorded trace) and each one's latency runs from its arrival to its answer. What it leaves out:
the sidecar's own CPU time and HTTP (its parsing, the event loop's passes, the hop to the model
beyond what the surface's per-call term holds), and a model that runs beside the sidecar on the
same cores.

Results are the load generator's (:class:`~modelroll_bench.loadgen.LoadResult`): throughput,
p50/p95/p99, the requests per second answered within the p99 SLO, and whether the run meets the
SLO (:func:`~modelroll_bench.arithmetic.meets_slo`), as ``make bench`` defines them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from modelroll_common.virtual_time import VirtualTimeLoop
from modelroll_sidecar.batching import Batcher, Outcome, QueueFull
from modelroll_sidecar.config import SidecarConfig
from modelroll_sidecar.metrics import SidecarMetrics
from modelroll_sidecar.protocol import BatchResult

from . import arithmetic, simulate_check, surface
from .lengths import PRESETS, parse
from .loadgen import LoadResult, poisson_times
from .runs import Workload, machine, write
from .surface import Surface, local_tokenizer, sentence_tokens
from .systems import Batching

QUEUE_SIZE = 4096
"""The sidecar's queue, as the benchmarks start it (``systems.System.argv``)."""
TIMEOUT_S = SidecarConfig().timeout_ms / 1000
"""The sidecar's default deadline: a request not sent within it is answered 504."""


@dataclass(frozen=True)
class Trace:
    """Arrivals: each one's time in seconds from the start and its length in the surface's units,
    over a run of ``duration_s`` (what throughput is counted over, as the load generator does)."""

    arrivals: tuple[float, ...]
    lengths: tuple[int, ...]
    duration_s: float
    rate: float | None = None

    def __post_init__(self) -> None:
        if len(self.arrivals) != len(self.lengths):
            raise ValueError("a trace needs one length per arrival")
        if any(b < a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)):
            raise ValueError("a trace's arrival times must not go back")
        if any(n < 1 for n in self.lengths):
            raise ValueError("a trace's lengths must be at least 1")

    @classmethod
    def poisson(
        cls, rate: float, duration_s: float, lengths: Sequence[int], seed: int = 1
    ) -> Trace:
        """Poisson arrivals at ``rate`` for ``duration_s``, seeded as the load generator seeds
        them (:func:`~modelroll_bench.loadgen.poisson_times`); the ``i``-th request is
        ``lengths[i % len(lengths)]`` long, as the ``i``-th body the load generator sends."""
        times = tuple(poisson_times(random.Random(seed), rate, duration_s))
        return cls(
            times, tuple(lengths[i % len(lengths)] for i in range(len(times))), duration_s, rate
        )

    @classmethod
    def burst(cls, lengths: Sequence[int]) -> Trace:
        """Every request at once: the model's saturation, when the run counts until the last
        answer (:func:`saturation_rps`)."""
        return cls((0.0,) * len(lengths), tuple(lengths), 0.0)

    def at_rate(self, rate: float) -> Trace:
        """The same arrivals and lengths, their times scaled so that they come at ``rate``."""
        if not self.duration_s or self.rate is None:
            raise ValueError("a trace with no duration has no rate to scale")
        factor = self.rate / rate
        return Trace(
            tuple(t * factor for t in self.arrivals), self.lengths, self.duration_s * factor, rate
        )

    @classmethod
    def load(cls, path: Path) -> Trace:
        """A recorded trace: a JSON list of ``[arrival_s, length]``, arrival times from the start.
        Raises ValueError with the reason for anything else."""
        try:
            rows = json.loads(path.read_text())
            arrivals = tuple(float(row[0]) for row in rows)
            lengths = tuple(int(row[1]) for row in rows)
        except (OSError, ValueError, TypeError, IndexError, KeyError) as exc:
            raise ValueError(f"{path}: not a JSON list of [arrival_s, length] ({exc})") from None
        if not arrivals:
            raise ValueError(f"{path}: the trace is empty")
        return cls(arrivals, lengths, arrivals[-1], len(arrivals) / arrivals[-1] or None)


class SurfaceModel:
    """A model whose batch takes what ``surface`` says, in loop time, times a lognormal factor
    of mean 1 and spread ``noise`` (seeded). Its inputs are the requests' lengths; it counts
    batch sizes and padding."""

    def __init__(self, surface: Surface, noise: float = 0.0, seed: int = 1) -> None:
        self.surface = surface
        self.noise = noise
        self.rng = random.Random(seed)
        self.batches = 0
        self.items = 0
        self.useful = 0
        self.padded = 0

    async def infer(self, inputs: list[Any]) -> BatchResult:
        longest = max(inputs)
        seconds = self.surface.seconds(len(inputs), longest)
        if self.noise:
            seconds *= self.rng.lognormvariate(-self.noise * self.noise / 2, self.noise)
        self.batches += 1
        self.items += len(inputs)
        self.useful += sum(inputs)
        self.padded += len(inputs) * longest
        await asyncio.sleep(seconds)
        return BatchResult(list(inputs), [None] * len(inputs))


@dataclass(frozen=True)
class Result:
    """One simulated run: what the load generator would have seen, the loop time of the last
    answer, and the batches the model ran."""

    run: LoadResult
    finished_s: float
    batches: int
    mean_batch: float
    padding_efficiency: float

    def figures(self, slo_ms: float, name: str = "") -> Figures:
        """What the load generator would have seen, how the model batched, and the requests per
        second answered within the p99 SLO ``slo_ms`` and whether the run meets it."""
        load = self.run.report()
        return Figures(
            name=name,
            throughput_rps=load.throughput_rps,
            within_slo_rps=round(self.run.within_rps(slo_ms / 1000), 1),
            meets_slo=arithmetic.meets_slo(load, slo_ms),
            p50_ms=load.p50_ms,
            p95_ms=load.p95_ms,
            p99_ms=load.p99_ms,
            mean_batch=round(self.mean_batch, 2),
            padding_efficiency=round(self.padding_efficiency, 3),
        )


@dataclass(frozen=True)
class Figures:
    """One configuration's simulated run: throughput, goodput under the SLO and whether the run
    meets it, p50/p95/p99 in ms, and the batching."""

    name: str
    throughput_rps: float
    within_slo_rps: float
    meets_slo: bool
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_batch: float
    padding_efficiency: float


def simulate(
    config: Batching,
    surface: Surface,
    trace: Trace,
    *,
    noise: float = 0.0,
    seed: int = 1,
    parallel: int = 1,
) -> Result:
    """Run ``trace`` through a Batcher configured as ``config`` (``batch_by`` and
    ``wait_policy`` go to it as they are) in front of a :class:`SurfaceModel`, in virtual time."""
    model = SurfaceModel(surface, noise, seed)
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        run, finished = runner.run(_replay(config, model, trace, parallel))
    return Result(
        run,
        finished,
        model.batches,
        model.items / model.batches if model.batches else 0.0,
        model.useful / model.padded if model.padded else 1.0,
    )


async def _replay(
    config: Batching, model: SurfaceModel, trace: Trace, parallel: int
) -> tuple[LoadResult, float]:
    loop = asyncio.get_running_loop()
    batcher = Batcher(
        model,
        SidecarMetrics("simulated", "v", CollectorRegistry(auto_describe=False)),
        max_batch_size=config.max_batch,
        max_wait_s=config.max_wait_ms / 1000,
        max_queue_size=QUEUE_SIZE,
        max_batch_tokens=config.max_batch_tokens,
        timeout_s=TIMEOUT_S,
        max_concurrent_batches=parallel,
        batch_by=config.batch_by,
        wait_policy=config.wait_policy,
    )
    batcher.start()
    result = LoadResult(config.name, trace.duration_s, offered_rps=trace.rate)
    answers: list[asyncio.Future[Outcome]] = []
    start = loop.time()

    def answered(arrived: float, length: int, future: asyncio.Future[Outcome]) -> None:
        result.record(future.result().status, loop.time() - arrived, length)

    for at, length in zip(trace.arrivals, trace.lengths, strict=True):
        arrived = start + at
        if arrived > loop.time():
            await asyncio.sleep(arrived - loop.time())
        try:
            pending = batcher.submit(length, length=length)
        except QueueFull:
            result.record(429, 0.0, length)
            continue
        pending.future.add_done_callback(functools.partial(answered, arrived, length))
        answers.append(pending.future)
    if answers:
        await asyncio.wait(answers)
    finished = loop.time() - start
    await batcher.drain(TIMEOUT_S)
    return result, finished


def saturation_rps(
    config: Batching, surface: Surface, lengths: Sequence[int], requests: int, seed: int = 1
) -> float:
    """Requests per second answered when ``requests`` requests (lengths cycled) all arrive at
    once and are counted until the last answer: ``config``'s saturation on ``surface``."""
    trace = Trace.burst([lengths[i % len(lengths)] for i in range(requests)])
    found = simulate(config, surface, trace, seed=seed)
    return found.run.ok / found.finished_s if found.finished_s else math.inf


REQUESTS = 1000
"""Requests per simulated run: about 60 ms of CPU each."""
TIE = 0.01
"""Configurations whose goodput is within this share of the best count as tied."""


@dataclass(frozen=True)
class Grid:
    """The static configurations searched: every combination, each once (a max batch of 1 has
    no company to wait for or choose, and a token budget that a full batch of the longest
    request fits within is no budget)."""

    batch_by: tuple[str, ...] = ("arrival", "length")
    max_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    max_wait_ms: tuple[float, ...] = (0.0, 2.0, 5.0, 10.0, 20.0)
    max_batch_tokens: tuple[int, ...] = (0, 256, 512, 1024)
    wait_policy: str = "fixed"
    length_from: str = "tokenizer"
    """Only what the configurations are labelled with: a simulation's lengths are the trace's."""

    def configs(self, longest: int) -> list[Batching]:
        found = [Batching(1, 0.0, 0, "arrival", self.wait_policy, self.length_from)]
        for by in self.batch_by:
            for size in (s for s in self.max_batch if s > 1):
                for budget in self.max_batch_tokens:
                    if budget >= size * longest:
                        continue
                    for wait in self.max_wait_ms:
                        found.append(
                            Batching(size, wait, budget, by, self.wait_policy, self.length_from)
                        )
        return found


Row = tuple[Batching, Figures]


def _run_row(
    config: Batching, surface: Surface, trace: Trace, slo_ms: float, noise: float, seed: int
) -> Row:
    found = simulate(config, surface, trace, noise=noise, seed=seed)
    return config, found.figures(slo_ms, config.name)


def run_grid(
    configs: Sequence[Batching],
    surface: Surface,
    traces: Sequence[Trace],
    slo_ms: float,
    *,
    noise: float = 0.0,
    seed: int = 1,
    jobs: int = 1,
) -> list[list[Row]]:
    """Every configuration on every trace: one list of rows per trace, in ``configs``' order;
    ``jobs`` processes at once."""
    tasks = [(c, surface, t, slo_ms, noise, seed) for t in traces for c in configs]
    if jobs <= 1:
        rows = [_run_row(*task) for task in tasks]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            rows = list(pool.map(_run_row, *zip(*tasks, strict=True), chunksize=8))
    return [rows[i : i + len(configs)] for i in range(0, len(rows), len(configs))]


def rank_key(row: Row) -> tuple[Any, ...]:
    """How :func:`pick` orders rows, best first, once goodput ties are settled."""
    config, figures = row
    return (figures.p99_ms, figures.p50_ms, config.max_wait_ms, config.max_batch)


def pick(rows: Sequence[Row]) -> Row:
    """The best row: meeting the SLO first, then the most requests answered within it per
    second (within :data:`TIE` of the most counts as tied), then the lowest p99 and p50, the
    shorter max-wait and the smaller batch."""
    meeting = [row for row in rows if row[1].meets_slo] or list(rows)
    top = max(row[1].within_slo_rps for row in meeting)
    tied = [row for row in meeting if row[1].within_slo_rps >= (1 - TIE) * top]
    return min(tied, key=rank_key)


def best_static(
    surface: Surface,
    lengths: Sequence[int],
    rate: float,
    slo_ms: float,
    *,
    grid: Grid | None = None,
    requests: int = REQUESTS,
    seed: int = 1,
    noise: float = 0.0,
    jobs: int = 1,
) -> Row:
    """The static configuration of ``grid`` with the best goodput under the p99 SLO at Poisson
    arrivals of ``rate`` (``requests`` of them, lengths cycled from ``lengths``), and its
    figures (:meth:`Result.figures`)."""
    trace = Trace.poisson(rate, requests / rate, lengths, seed)
    configs = (grid or Grid()).configs(max(lengths))
    [rows] = run_grid(configs, surface, [trace], slo_ms, noise=noise, seed=seed, jobs=jobs)
    return pick(rows)


NOISE_SEEDS = (2, 3)
"""Arrival seeds each load's best configuration is run again with, for the noise."""
DEFAULT_SURFACE = Path("bench/results/surface-int8.json")


@dataclass(frozen=True)
class Search:
    """What the search of the best static configuration runs."""

    slo_ms: float = 300.0
    shares: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.2)
    """Loads, as shares of no batching's simulated saturation."""
    requests: int = REQUESTS
    seed: int = 1
    noise: float = 0.0
    jobs: int = 1
    grid: Grid = Grid()


@dataclass(frozen=True)
class Load:
    """One load of the search: the best configuration and its figures, the next best, no
    batching's and first in first out's to 32 with a 10 ms wait (None when the grid lacks it),
    the best's figures at other arrival seeds, and every configuration's."""

    share: float
    rate_rps: float
    best_config: Batching
    best: Figures
    runner_up: Figures
    no_batching: Figures
    fifo_32: Figures | None
    best_at_other_seeds: list[Figures]
    rows: list[Figures]


@dataclass(frozen=True)
class Found:
    no_batching_saturation_rps: float
    loads: list[Load]


@dataclass(frozen=True)
class Report:
    """What ``modelroll-bench simulate`` writes."""

    surface: Surface
    surface_path: str
    lengths: str
    trace: str | None
    setup: Search
    machine: dict[str, Any]
    found: Found


def search(
    surface: Surface, lengths: Sequence[int], setup: Search, recorded: Trace | None = None
) -> Found:
    """At each load: the best configuration of the grid, the next best, no batching's and first
    in first out's to 32 with a 10 ms wait, and the best one's figures again at other arrival seeds.
    ``recorded``: replay this trace, its times scaled to each load, instead of Poisson arrivals
    (its own lengths then count, ``lengths`` only for the saturation)."""
    configs = setup.grid.configs(max(lengths))
    alone = configs[0]
    fifo = Batching(length_from=setup.grid.length_from)
    saturation = saturation_rps(alone, surface, lengths, setup.requests, setup.seed)

    def trace(rate: float, seed: int) -> Trace:
        if recorded is not None:
            return recorded.at_rate(rate)
        return Trace.poisson(rate, setup.requests / rate, lengths, seed)

    rates = [share * saturation for share in setup.shares]
    every = run_grid(
        configs,
        surface,
        [trace(rate, setup.seed) for rate in rates],
        setup.slo_ms,
        noise=setup.noise,
        seed=setup.seed,
        jobs=setup.jobs,
    )
    loads = []
    for share, rate, rows in zip(setup.shares, rates, every, strict=True):
        best = pick(rows)
        runner_up = pick([row for row in rows if row[0] != best[0]])
        by_config = dict(rows)
        again = (
            []
            if recorded is not None
            else [
                simulate(best[0], surface, trace(rate, s), noise=setup.noise, seed=s).figures(
                    setup.slo_ms, best[0].name
                )
                for s in NOISE_SEEDS
            ]
        )
        loads.append(
            Load(
                share=share,
                rate_rps=round(rate, 2),
                best_config=best[0],
                best=best[1],
                runner_up=runner_up[1],
                no_batching=by_config[alone],
                fifo_32=by_config.get(fifo),
                best_at_other_seeds=again,
                rows=[figures for _, figures in rows],
            )
        )
    return Found(round(saturation, 2), loads)


def table(found: Found, slo_ms: float) -> str:
    """The best configuration at each load beside no batching and first in first out to 32."""
    lines = [
        f"\nNo batching's simulated saturation: {found.no_batching_saturation_rps:.1f} req/s. "
        f"Goodput = requests/s answered within the p99 SLO of {slo_ms:g} ms (* = the run's p99 "
        "is over it); p99 ms; the best's p99 at two other arrival seeds in brackets.",
        f"{'load':>5} {'req/s':>7}  {'best static configuration':<40} {'goodput':>8} "
        f"{'p99':>8} {'other seeds':>16}  {'runner-up':<40} {'no batching':>16} "
        f"{'FIFO 32, 10 ms':>16}",
    ]

    def cell(figures: Figures | None) -> str:
        if figures is None:
            return "-"
        mark = "" if figures.meets_slo else "*"
        return f"{figures.within_slo_rps:.1f}{mark} / {_p99(figures)}"

    for load in found.loads:
        best = load.best
        others = "/".join(_p99(row) for row in load.best_at_other_seeds)
        short = best.name.replace(", lengths from the tokenizer", "")
        runner = load.runner_up.name.replace(", lengths from the tokenizer", "")
        mark = "" if best.meets_slo else "*"
        lines.append(
            f"{load.share:>5.0%} {load.rate_rps:>7.1f}  {short:<40} "
            f"{best.within_slo_rps:>7.1f}{mark:1} {_p99(best):>8} "
            f"{'[' + others + ']' if others else '':>16}  {runner:<40} "
            f"{cell(load.no_batching):>16} {cell(load.fifo_32):>16}"
        )
    return "\n".join(lines)


def _p99(figures: Figures) -> str:
    return "-" if figures.p99_ms is None else f"{figures.p99_ms:.0f}"


def _floats(text: str) -> tuple[float, ...]:
    try:
        found = tuple(float(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None
    if not found or any(x < 0 for x in found):
        raise argparse.ArgumentTypeError(f"{text!r}: give numbers of at least 0")
    return found


def _ints(text: str) -> tuple[int, ...]:
    found = _floats(text)
    if any(x != int(x) for x in found):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers")
    return tuple(int(x) for x in found)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d, g = Search(), Grid()
    parser.add_argument(
        "--surface",
        type=Path,
        default=DEFAULT_SURFACE,
        help="the cost surface, JSON (%(default)s; --measure writes it)",
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="measure the real encoder's surface at its POST /v1/batch and write it to "
        "--surface, then search with it (about two minutes on int8)",
    )
    parser.add_argument("--variant", choices=("int8", "fp32"), default="int8")
    parser.add_argument(
        "--lengths",
        default="lognormal",
        help="request lengths: a preset (lognormal, bimodal) or a spec (%(default)s)",
    )
    parser.add_argument(
        "--units",
        choices=("words", "tokens"),
        default="words",
        help="words: --lengths are English sentences' words, counted in the encoder's tokens "
        "as the sidecar's --length-from tokenizer counts them; tokens: the surface's units "
        "(%(default)s)",
    )
    parser.add_argument(
        "--trace", type=Path, help="replay a recorded trace, a JSON list of [arrival_s, length]"
    )
    parser.add_argument("--slo-ms", type=float, default=d.slo_ms, help="p99 SLO (%(default)s)")
    parser.add_argument(
        "--shares",
        type=_floats,
        default=d.shares,
        help="loads as shares of no batching's saturation (0.1,0.3,0.5,0.7,0.9,1,1.2)",
    )
    parser.add_argument(
        "--requests", type=int, default=d.requests, help="requests per run (%(default)s)"
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="lengths, arrivals and noise")
    parser.add_argument(
        "--noise",
        type=float,
        default=d.noise,
        help="a batch's duration times a lognormal factor of mean 1 and this spread (0)",
    )
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (%(default)s)"
    )
    parser.add_argument(
        "--max-batch", type=_ints, default=g.max_batch, help="grid (1,2,4,8,16,32,64)"
    )
    parser.add_argument(
        "--max-wait-ms", type=_floats, default=g.max_wait_ms, help="grid (0,2,5,10,20)"
    )
    parser.add_argument(
        "--max-batch-tokens", type=_ints, default=g.max_batch_tokens, help="grid (0,256,512,1024)"
    )
    parser.add_argument(
        "--wait-policy", default=g.wait_policy, help="the sidecar's, for every configuration"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="instead: simulated against measured, the real sidecar in front of the real "
        "encoder at three loads (simulate_check.py)",
    )
    simulate_check.add_arguments(parser)
    parser.add_argument("--out", type=Path, help="(bench/results/simulate.json)")


def lengths_of(args: argparse.Namespace) -> tuple[list[int], str]:
    """The lengths the runs cycle through, in the surface's units, and how they were made."""
    spec = PRESETS.get(args.lengths, args.lengths)
    if args.units == "tokens":
        return parse(spec).sample(Workload.bodies, args.seed), f"{spec} tokens"
    workload = Workload(parse(spec), seed=args.seed, sentences=True)
    counted = sentence_tokens(workload, local_tokenizer())
    return counted, f"English sentences of {spec} words (seed {args.seed}), in the encoder's tokens"


def main(args: argparse.Namespace) -> int:
    try:
        parse(args.lengths)
        recorded = Trace.load(args.trace) if args.trace else None
    except ValueError as exc:
        raise SystemExit(f"modelroll-bench simulate: {exc}") from None
    if args.measure:
        measured = asyncio.run(surface.measure_encoder(args.variant, 1, surface.REPEATS))
        write(measured, args.surface)
    try:
        cost = Surface.load(args.surface)
    except ValueError as exc:
        raise SystemExit(
            f"modelroll-bench simulate: {exc}; `make bench-simulate ARGS=--measure` measures "
            "the encoder's"
        ) from None
    if args.check:
        return simulate_check.main(args, cost)
    lengths, described = lengths_of(args)
    setup = Search(
        slo_ms=args.slo_ms,
        shares=args.shares,
        requests=args.requests,
        seed=args.seed,
        noise=args.noise,
        jobs=args.jobs,
        grid=Grid(
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            max_batch_tokens=args.max_batch_tokens,
            wait_policy=args.wait_policy,
        ),
    )
    configs = len(setup.grid.configs(max(lengths)))
    print(
        f"Surface {args.surface}: {cost.describe()}.\nLengths: {described}; median "
        f"{statistics.median(lengths):g}, longest {max(lengths)}. "
        + (f"Trace {args.trace}, scaled to each load. " if recorded else "")
        + f"{configs} configurations x {len(setup.shares)} loads, {setup.requests} requests "
        f"per run (seed {setup.seed}, noise {setup.noise:g}), {setup.jobs} processes.",
        flush=True,
    )
    started = time.perf_counter()
    found = search(cost, lengths, setup, recorded)
    print(table(found, setup.slo_ms))
    print(f"({time.perf_counter() - started:.0f} s)")
    trace = str(args.trace) if args.trace else None
    report = Report(cost, str(args.surface), described, trace, setup, machine(), found)
    write(report, args.out or Path("bench/results/simulate.json"))
    return 0

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

import asyncio
import functools
import json
import math
import random
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

from . import arithmetic
from .loadgen import LoadResult, poisson_times
from .surface import Surface
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

    def row(self, slo_ms: float | None = None) -> dict[str, Any]:
        """The load generator's summary, the batching, and with ``slo_ms`` the requests per
        second answered within it and whether the run meets it."""
        row = self.run.summary()
        row["mean_batch"] = round(self.mean_batch, 2)
        row["padding_efficiency"] = round(self.padding_efficiency, 3)
        if slo_ms is not None:
            row["within_slo_rps"] = round(self.run.within_rps(slo_ms / 1000), 1)
            row["meets_slo"] = arithmetic.meets_slo(row, slo_ms)
        return row


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


Row = tuple[Batching, dict[str, Any]]


def _run_row(
    config: Batching, surface: Surface, trace: Trace, slo_ms: float, noise: float, seed: int
) -> Row:
    return config, simulate(config, surface, trace, noise=noise, seed=seed).row(slo_ms)


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
    return (figures["p99_ms"], figures["p50_ms"], config.max_wait_ms, config.max_batch)


def pick(rows: Sequence[Row]) -> Row:
    """The best row: meeting the SLO first, then the most requests answered within it per
    second (within :data:`TIE` of the most counts as tied), then the lowest p99 and p50, the
    shorter max-wait and the smaller batch."""
    meeting = [row for row in rows if row[1]["meets_slo"]] or list(rows)
    top = max(row[1]["within_slo_rps"] for row in meeting)
    tied = [row for row in meeting if row[1]["within_slo_rps"] >= (1 - TIE) * top]
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
    figures (:meth:`Result.row`)."""
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


def _figures(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("throughput_rps", "within_slo_rps", "meets_slo", "p50_ms", "p95_ms", "p99_ms")
    return {k: row[k] for k in (*keep, "mean_batch", "padding_efficiency")}


def search(
    surface: Surface, lengths: Sequence[int], setup: Search, recorded: Trace | None = None
) -> dict[str, Any]:
    """At each load: the best configuration of the grid, the next best, no batching's and the
    sidecar's defaults' figures, and the best one's figures again at other arrival seeds.
    ``recorded``: replay this trace, its times scaled to each load, instead of Poisson arrivals
    (its own lengths then count, ``lengths`` only for the saturation)."""
    configs = setup.grid.configs(max(lengths))
    alone = configs[0]
    default = Batching(length_from=setup.grid.length_from)
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
                simulate(best[0], surface, trace(rate, s), noise=setup.noise, seed=s).row(
                    setup.slo_ms
                )
                for s in NOISE_SEEDS
            ]
        )
        loads.append(
            {
                "share": share,
                "rate_rps": round(rate, 2),
                "best": {"config": best[0].__dict__, "name": best[0].name, **_figures(best[1])},
                "runner_up": {"name": runner_up[0].name, **_figures(runner_up[1])},
                "no_batching": _figures(by_config[alone]),
                "default": _figures(by_config[default]) if default in by_config else None,
                "best_at_other_seeds": [_figures(row) for row in again],
                "rows": [{"name": c.name, **_figures(r)} for c, r in rows],
            }
        )
    return {"no_batching_saturation_rps": round(saturation, 2), "loads": loads}

"""``modelroll-bench sweep`` (``make bench-sweep``): the sidecar at every max batch size x max-wait
in a grid, each at several Poisson arrival rates, in front of the demo model or the real sentence
encoder (``--model encoder``: its limits measured, lengths counted in its own tokens) with the
chosen request lengths. Plots p99 against throughput (the knee: where a setting's p99 turns up) and
recommends the setting with the highest goodput, the highest throughput whose p99 stays within
``--slo-ms``.

The rates default to shares of the model's best limit over the grid (the limit of each max batch
size is parallel x size / E[cost of a full batch of random lengths]). Once a setting's p99 passes
5 x the SLO, or it fails more than 1% of requests, its higher rates are not run. With
``--rounds N`` the grid is run N times (every other pass backwards) and every figure is the median
over the passes, so one noisy run cannot make or break a setting.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import arithmetic, plots
from .arithmetic import Point, Recommendation
from .figures import OpenRun
from .runs import Scenario, bar, load_average, open_report
from .servers import Check
from .suite import Suite
from .systems import Batching, System, batcher

GIVE_UP = 5.0
"""A setting's higher rates are skipped once its p99 exceeds this multiple of the SLO ..."""
GIVE_UP_ERRORS = 0.01
"""... or more than this fraction of its requests failed."""


@dataclass(frozen=True)
class Setup:
    scenario: Scenario = field(default_factory=Scenario)
    batches: tuple[int, ...] = (4, 8, 16, 32, 64)
    waits_ms: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0)
    shares: tuple[float, ...] = (0.25, 0.5, 0.7, 0.8, 0.9, 1.0)
    rates: tuple[float, ...] = ()
    slo_ms: float = 150.0
    duration_s: float = 6.0
    rounds: int = 1

    def offered(self, limits: dict[int, float]) -> list[float]:
        if self.rates:
            return sorted(self.rates)
        peak = max(limits.values())
        return [round(s * peak, 1) for s in self.shares]


@dataclass(frozen=True)
class SweepRun:
    """One setting at one rate in one round (a pass over the grid)."""

    round: int
    batching: Batching
    run: OpenRun

    def point(self) -> Point:
        load = self.run.load
        return Point(
            self.batching.max_batch,
            self.batching.max_wait_ms,
            load.offered_rps or 0.0,
            load.throughput_rps,
            math.inf if load.p99_ms is None else load.p99_ms,  # a p99 never answered
            load.error_fraction,
        )


@dataclass(frozen=True)
class Measured:
    model_limit_rps: dict[int, float]
    """The model's limit by max batch size."""
    rates: list[float]
    runs: list[SweepRun]


@dataclass(frozen=True)
class PointRow:
    """One setting at one rate: its medians over the rounds, the p99 range over the rounds that
    ran it, and how many did."""

    point: Point
    p50_ms: float | None
    p99_low_ms: float | None
    p99_high_ms: float | None
    mean_batch: float | None
    runs: int


@dataclass(frozen=True)
class Goodput:
    max_batch: int
    max_wait_ms: float
    goodput_rps: float


@dataclass(frozen=True)
class Summary:
    points: list[PointRow]
    goodput: list[Goodput]
    recommendation: Recommendation | None


async def grid_line(
    b: Batching, model: str, rates: list[float], setup: Setup, round_no: int, progress: Any
) -> list[SweepRun]:
    """One setting at rising rates, until its p99 passes GIVE_UP x the SLO or it fails requests."""
    runs: list[SweepRun] = []
    system = System(f"b{b.max_batch}-w{b.max_wait_ms:g}", "sidecar", b)
    async with batcher(system, model, setup.scenario.parallel) as url:
        for i, rate in enumerate(rates):
            progress.set_postfix_str(f"round {round_no}: {b.name} at {rate:g} req/s")
            found = await open_report(
                url,
                setup.scenario.workload,
                rate,
                setup.duration_s,
                seed=setup.scenario.seed + round_no,
                stats_url=url + "/metrics",
            )
            runs.append(SweepRun(round_no, b, found))
            progress.update()
            point = runs[-1].point()
            if point.p99_ms > GIVE_UP * setup.slo_ms or point.error_fraction > GIVE_UP_ERRORS:
                progress.update(len(rates) - i - 1)
                break
    return runs


async def measure(setup: Setup) -> Measured:
    scenario = setup.scenario
    unit = "tokenizer" if scenario.model == "encoder" else "words"
    runs: list[SweepRun] = []
    settings = [Batching(b, w, length_from=unit) for b in setup.batches for w in setup.waits_ms]
    async with scenario.serve() as model:
        limits = await scenario.limits_rps(model, setup.batches)
        rates = setup.offered(limits)
        print(
            f"{scenario.describe()}\nModel's limit by max batch size: "
            + ", ".join(f"{b}: {v:.0f}" for b, v in limits.items())
            + f" req/s.\nRates: {', '.join(f'{r:g}' for r in rates)} req/s; "
            f"{setup.duration_s:g} s each; load average {load_average():.2f}.",
            flush=True,
        )
        with bar(setup.rounds * len(settings) * len(rates), "sweep") as progress:
            for r in range(1, setup.rounds + 1):
                # Every other round runs the grid backwards, so drift in the machine's load
                # does not always land on the same settings.
                for b in settings if r % 2 else settings[::-1]:
                    runs += await grid_line(b, model, rates, setup, r, progress)
    return Measured({b: round(v, 1) for b, v in limits.items()}, rates, runs)


def summarize(setup: Setup, measured: Measured) -> Summary:
    """Medians over the rounds, goodput per setting and the recommendation for ``setup.slo_ms``."""
    runs = measured.runs
    points = arithmetic.median_points(
        [[x.point() for x in runs if x.round == r] for r in range(1, setup.rounds + 1)]
    )
    best = arithmetic.goodput_by_setting(points, setup.slo_ms)
    goodput = [
        Goodput(b, w, best[(b, w)].throughput_rps if (b, w) in best else 0.0)
        for b in setup.batches
        for w in setup.waits_ms
    ]
    return Summary(
        [_point_row(p, runs) for p in points],
        goodput,
        arithmetic.recommend(points, setup.slo_ms),
    )


def _point_row(p: Point, runs: list[SweepRun]) -> PointRow:
    key = (p.max_batch, p.max_wait_ms, p.offered_rps)
    mine = [
        r.run
        for r in runs
        if (r.batching.max_batch, r.batching.max_wait_ms, r.run.load.offered_rps) == key
    ]
    p50s = [r.load.p50_ms for r in mine if r.load.p50_ms is not None]
    p99s = [r.load.p99_ms for r in mine if r.load.p99_ms is not None]
    batches = [b.mean_batch for r in mine if (b := r.batching) and b.mean_batch is not None]
    return PointRow(
        point=p,
        p50_ms=statistics.median(p50s) if p50s else None,
        p99_low_ms=min(p99s, default=None),
        p99_high_ms=max(p99s, default=None),
        mean_batch=statistics.median(batches) if batches else None,
        runs=len(mine),
    )


def render(setup: Setup, summary: Summary) -> str:
    lines = [
        "",
        f"Medians over {setup.rounds} round(s); p99 range over the rounds that ran the rate.",
        f"{'batch':>5} {'wait':>5} {'offered':>8} {'thru':>7} {'p50':>7} {'p99':>8} "
        f"{'p99 range':>15} {'mean batch':>10}  runs",
    ]
    for row in summary.points:
        p = row.point
        p50 = "-" if row.p50_ms is None else f"{row.p50_ms:.1f}"
        p99s = (
            "-"
            if row.p99_low_ms is None or row.p99_high_ms is None
            else f"{row.p99_low_ms:.0f}-{row.p99_high_ms:.0f}"
        )
        mean = "-" if row.mean_batch is None else f"{row.mean_batch:.1f}"
        lines.append(
            f"{p.max_batch:>5} {p.max_wait_ms:>5g} {p.offered_rps:>8.0f} {p.throughput_rps:>7.0f} "
            f"{p50:>7} {p.p99_ms:>8.1f} {p99s:>15} {mean:>10}  {row.runs}/{setup.rounds}"
        )
    lines += [
        "",
        f"Goodput (req/s with p99 <= {setup.slo_ms:g} ms), max batch down, max-wait across:",
        "      " + "".join(f"{w:>8g}" for w in setup.waits_ms),
    ]
    for b in setup.batches:
        cells = {g.max_wait_ms: g.goodput_rps for g in summary.goodput if g.max_batch == b}
        lines.append(f"{b:>5} " + "".join(f"{cells[w]:>8.0f}" for w in setup.waits_ms))
    pick = summary.recommendation
    if pick is None:
        lines.append(f"\nNo setting kept p99 within {setup.slo_ms:g} ms at any tested rate.")
    else:
        lines.append(
            f"\nRecommended for p99 <= {setup.slo_ms:g} ms: --max-batch-size {pick.max_batch} "
            f"--max-wait-ms {pick.max_wait_ms:g} (goodput {pick.goodput_rps:.0f} req/s, "
            f"median p99 {pick.p99_ms:.1f} ms there)"
        )
    return "\n".join(lines)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


class SweepSuite(Suite[Setup, Measured, Summary]):
    name = "sweep"
    help = "max batch x max-wait grid; the knee; a recommendation"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured
    summarize = staticmethod(summarize)
    render = staticmethod(render)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        d = Setup()
        Scenario.add_arguments(parser, out=False)
        parser.add_argument(
            "--slo-ms",
            type=float,
            default=d.slo_ms,
            help="p99 SLO (%(default)s); with --from, the SLO to judge the saved sweep against",
        )
        parser.add_argument(
            "--batches", type=_ints, default=d.batches, help="max batch sizes (4,8,16,32,64)"
        )
        parser.add_argument(
            "--waits", type=_floats, default=d.waits_ms, help="max-waits, ms (2,5,10,20)"
        )
        parser.add_argument(
            "--shares",
            type=_floats,
            default=d.shares,
            help="rates as shares of the best limit over the grid (0.25,0.5,0.7,0.8,0.9,1)",
        )
        parser.add_argument("--rates", type=_floats, default=(), help="explicit rates, req/s")
        parser.add_argument(
            "--rounds",
            type=int,
            default=d.rounds,
            help="passes over the grid; medians (%(default)s)",
        )
        parser.add_argument(
            "--duration", type=float, default=d.duration_s, help="s per run (%(default)s)"
        )

    def setup(self, args: argparse.Namespace) -> Setup:
        return Setup(
            scenario=Scenario.from_args(args),
            batches=args.batches,
            waits_ms=args.waits,
            shares=args.shares,
            rates=args.rates,
            slo_ms=args.slo_ms,
            duration_s=args.duration,
            rounds=args.rounds,
        )

    async def measure(self, setup: Setup) -> Measured:
        return await measure(setup)

    def checks(self, setup: Setup, summary: Summary) -> list[Check]:
        return []  # a sweep recommends; it has no target

    def again(self, setup: Setup, args: argparse.Namespace) -> Setup:
        """A saved sweep judged against this run's ``--slo-ms``: nothing is run again."""
        return replace(setup, slo_ms=args.slo_ms)

    def plot(self, setup: Setup, summary: Summary, args: argparse.Namespace) -> list[Path]:
        scenario = setup.scenario
        model = (
            "all-MiniLM-L6-v2 int8"
            if scenario.model == "encoder"
            else f"{scenario.fixed_ms:g} ms + {scenario.per_token_ms:g} ms/padded token"
        )
        title = f"lengths {scenario.lengths}, {model}; {setup.rounds} round(s), medians"
        points = [row.point for row in summary.points]
        return plots.sweep(points, setup.slo_ms, summary.recommendation, title, args.plots)


SUITE = SweepSuite()

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
import asyncio
import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import arithmetic, plots, results
from .runs import Scenario, bar, load_average, machine, open_run, write
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


def to_point(row: dict[str, Any]) -> arithmetic.Point:
    return arithmetic.Point(
        row["max_batch"],
        row["max_wait_ms"],
        row["offered_rps"],
        row["throughput_rps"],
        row["p99_ms"],
        arithmetic.error_fraction(row),
    )


async def grid_line(
    b: Batching, model: str, rates: list[float], setup: Setup, round_no: int, progress: Any
) -> list[dict[str, Any]]:
    """One setting at rising rates, until its p99 passes GIVE_UP x the SLO or it fails requests."""
    rows: list[dict[str, Any]] = []
    system = System(f"b{b.max_batch}-w{b.max_wait_ms:g}", "sidecar", b)
    async with batcher(system, model, setup.scenario.parallel) as url:
        for i, rate in enumerate(rates):
            progress.set_postfix_str(f"round {round_no}: {b.name} at {rate:g} req/s")
            row = await open_run(
                url,
                setup.scenario.workload,
                rate,
                setup.duration_s,
                seed=setup.scenario.seed + round_no,
                stats_url=url + "/metrics",
            )
            rows.append({"round": round_no, **asdict(b), **row})
            progress.update()
            point = to_point(rows[-1])
            if point.p99_ms > GIVE_UP * setup.slo_ms or point.error_fraction > GIVE_UP_ERRORS:
                progress.update(len(rates) - i - 1)
                break
    return rows


async def run(setup: Setup, plots_dir: Path) -> dict[str, Any]:
    scenario = setup.scenario
    unit = "tokenizer" if scenario.model == "encoder" else "words"
    rows: list[dict[str, Any]] = []
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
                    rows += await grid_line(b, model, rates, setup, r, progress)
    report = analyse(setup, rows, limits, plots_dir)
    report["machine"] = machine()
    return report


def analyse(
    setup: Setup, rows: list[dict[str, Any]], limits: dict[int, float], plots_dir: Path
) -> dict[str, Any]:
    """Medians, goodput per setting, the recommendation for ``setup.slo_ms``, table and plots."""
    scenario = setup.scenario
    points = arithmetic.median_points(
        [[to_point(x) for x in rows if x["round"] == r] for r in range(1, setup.rounds + 1)]
    )
    pick = arithmetic.recommend(points, setup.slo_ms)
    best = arithmetic.goodput_by_setting(points, setup.slo_ms)
    settings = [(b, w) for b in setup.batches for w in setup.waits_ms]
    table = [
        {
            "max_batch": b,
            "max_wait_ms": w,
            "goodput_rps": best[(b, w)].throughput_rps if (b, w) in best else 0.0,
        }
        for b, w in settings
    ]
    report = {
        "setup": setup,
        "model_limit_rps": {str(b): round(v, 1) for b, v in limits.items()},
        "rates": setup.offered(limits),
        "medians": [asdict(p) for p in points],
        "runs": rows,
        "goodput": table,
        "recommendation": asdict(pick) if pick else None,
    }
    print_table(setup, points, rows, table, pick)
    model = (
        "all-MiniLM-L6-v2 int8"
        if scenario.model == "encoder"
        else f"{scenario.fixed_ms:g} ms + {scenario.per_token_ms:g} ms/padded token"
    )
    title = f"lengths {scenario.lengths}, {model}; {setup.rounds} round(s), medians"
    written = plots.sweep(points, setup.slo_ms, pick, title, plots_dir)
    print("Plots: " + ", ".join(str(p) for p in written))
    return report


def reanalyse(saved: Path, slo_ms: float, plots_dir: Path) -> dict[str, Any]:
    """A saved sweep judged against another SLO: nothing is run again."""
    report = json.loads(saved.read_text())
    setup = replace(results.from_json(Setup, report["setup"]), slo_ms=slo_ms)
    print(f"{saved}: {setup.scenario.describe()}")
    limits = {int(b): v for b, v in report["model_limit_rps"].items()}
    return {**analyse(setup, report["runs"], limits, plots_dir), "machine": report["machine"]}


def print_table(
    setup: Setup,
    points: list[arithmetic.Point],
    rows: list[dict[str, Any]],
    table: list[dict[str, Any]],
    pick: arithmetic.Recommendation | None,
) -> None:
    def runs_of(p: arithmetic.Point) -> list[dict[str, Any]]:
        key = (p.max_batch, p.max_wait_ms, p.offered_rps)
        return [r for r in rows if (r["max_batch"], r["max_wait_ms"], r["offered_rps"]) == key]

    print(f"\nMedians over {setup.rounds} round(s); p99 range over the rounds that ran the rate.")
    print(
        f"{'batch':>5} {'wait':>5} {'offered':>8} {'thru':>7} {'p50':>7} {'p99':>8} "
        f"{'p99 range':>15} {'mean batch':>10}  runs"
    )
    for p in points:
        runs = runs_of(p)
        p50 = statistics.median(r["p50_ms"] for r in runs)
        p99s = [r["p99_ms"] for r in runs]
        batches = [m for r in runs if (m := (r["batching"] or {}).get("mean_batch")) is not None]
        mean = f"{statistics.median(batches):.1f}" if batches else "-"
        print(
            f"{p.max_batch:>5} {p.max_wait_ms:>5g} {p.offered_rps:>8.0f} {p.throughput_rps:>7.0f} "
            f"{p50:>7.1f} {p.p99_ms:>8.1f} {f'{min(p99s):.0f}-{max(p99s):.0f}':>15} {mean:>10}"
            f"  {len(runs)}/{setup.rounds}"
        )
    print(f"\nGoodput (req/s with p99 <= {setup.slo_ms:g} ms), max batch down, max-wait across:")
    waits = setup.waits_ms
    print("      " + "".join(f"{w:>8g}" for w in waits))
    for b in setup.batches:
        cells = {t["max_wait_ms"]: t["goodput_rps"] for t in table if t["max_batch"] == b}
        print(f"{b:>5} " + "".join(f"{cells[w]:>8.0f}" for w in waits))
    if pick is None:
        print(f"\nNo setting kept p99 within {setup.slo_ms:g} ms at any tested rate.")
    else:
        print(
            f"\nRecommended for p99 <= {setup.slo_ms:g} ms: --max-batch-size {pick.max_batch} "
            f"--max-wait-ms {pick.max_wait_ms:g} (goodput {pick.goodput_rps:.0f} req/s, "
            f"median p99 {pick.p99_ms:.1f} ms there)"
        )


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    Scenario.add_arguments(parser, "sweep")
    parser.add_argument("--slo-ms", type=float, default=d.slo_ms, help="p99 SLO (%(default)s)")
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
        "--rounds", type=int, default=d.rounds, help="passes over the grid; medians (%(default)s)"
    )
    parser.add_argument(
        "--duration", type=float, default=d.duration_s, help="s per run (%(default)s)"
    )
    parser.add_argument(
        "--from",
        dest="saved",
        type=Path,
        metavar="JSON",
        help="judge a saved sweep (its --out) against --slo-ms instead of running one",
    )


def main(args: argparse.Namespace) -> int:
    scenario = Scenario.from_args(args)
    if args.saved is not None:
        write(reanalyse(args.saved, args.slo_ms, args.plots), args.out)
        return 0
    setup = Setup(
        scenario=scenario,
        batches=args.batches,
        waits_ms=args.waits,
        shares=args.shares,
        rates=args.rates,
        slo_ms=args.slo_ms,
        duration_s=args.duration,
        rounds=args.rounds,
    )
    write(asyncio.run(run(setup, args.plots)), args.out)
    return 0

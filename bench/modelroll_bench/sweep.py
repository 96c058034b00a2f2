"""``modelroll-bench sweep`` (``make bench-sweep``): the sidecar at every max batch size x max-wait
in a grid, each at several Poisson arrival rates, in front of the demo model with the chosen
request lengths. Plots p99 against throughput (the knee: where a setting's p99 turns up) and
recommends the setting with the highest goodput, the highest throughput whose p99 stays within
``--slo-ms``.

The rates default to shares of the model's best limit over the grid (the limit of each max batch
size is parallel x size / E[cost of a full batch of random lengths]). Once a setting falls
behind its offered rate, or its p99 passes 5 x the SLO, its higher rates are not run.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import analysis, plots
from .runs import Scenario, bar, load_average, machine, open_run, write
from .systems import Batching, System, batcher, demo_model

GIVE_UP = 5.0
"""A setting's higher rates are skipped once its p99 exceeds this multiple of the SLO."""


@dataclass(frozen=True)
class Setup:
    scenario: Scenario = field(default_factory=Scenario)
    batches: tuple[int, ...] = (4, 8, 16, 32, 64)
    waits_ms: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0)
    shares: tuple[float, ...] = (0.25, 0.5, 0.7, 0.85, 1.0)
    rates: tuple[float, ...] = ()
    slo_ms: float = 150.0
    duration_s: float = 6.0

    def limits(self) -> dict[int, float]:
        return {b: self.scenario.limit_rps(b) for b in self.batches}

    def offered(self, limits: dict[int, float]) -> list[float]:
        if self.rates:
            return sorted(self.rates)
        peak = max(limits.values())
        return [round(s * peak, 1) for s in self.shares]


def to_point(b: Batching, row: dict[str, Any]) -> analysis.Point:
    return analysis.Point(
        b.max_batch,
        b.max_wait_ms,
        row["offered_rps"],
        row["throughput_rps"],
        row["p99_ms"],
        analysis.error_fraction(row),
    )


async def run(setup: Setup, plots_dir: Path) -> dict[str, Any]:
    limits = setup.limits()
    rates = setup.offered(limits)
    scenario = setup.scenario
    print(
        f"{scenario.describe()}\nModel's limit by max batch size: "
        + ", ".join(f"{b}: {v:.0f}" for b, v in limits.items())
        + f" req/s.\nRates: {', '.join(f'{r:g}' for r in rates)} req/s; {setup.duration_s:g} s "
        f"each; load average {load_average():.2f}.",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    settings = [Batching(b, w) for b in setup.batches for w in setup.waits_ms]
    async with demo_model(scenario.cost) as model:
        with bar(len(settings) * len(rates), "sweep") as progress:
            for b in settings:
                system = System(f"b{b.max_batch}-w{b.max_wait_ms:g}", "sidecar", b)
                async with batcher(system, model, scenario.parallel) as url:
                    for i, rate in enumerate(rates):
                        progress.set_postfix_str(f"{b.name} at {rate:g} req/s")
                        row = await open_run(
                            url,
                            scenario.workload,
                            rate,
                            setup.duration_s,
                            seed=scenario.seed,
                            stats_url=url + "/metrics",
                        )
                        rows.append({**asdict(b), **row})
                        progress.update()
                        point = to_point(b, row)
                        behind = point.throughput_rps < analysis.SATURATED * rate
                        if behind or point.p99_ms > GIVE_UP * setup.slo_ms:
                            progress.update(len(rates) - i - 1)
                            break
    points = [to_point(Batching(r["max_batch"], r["max_wait_ms"]), r) for r in rows]
    pick = analysis.recommend(points, setup.slo_ms)
    best = analysis.goodput_by_setting(points, setup.slo_ms)
    table = [
        {
            "max_batch": b.max_batch,
            "max_wait_ms": b.max_wait_ms,
            "goodput_rps": best[(b.max_batch, b.max_wait_ms)].throughput_rps
            if (b.max_batch, b.max_wait_ms) in best
            else 0.0,
        }
        for b in settings
    ]
    report = {
        "setup": asdict(setup),
        "machine": machine(),
        "model_limit_rps": {str(b): round(v, 1) for b, v in limits.items()},
        "rates": rates,
        "runs": rows,
        "goodput": table,
        "recommendation": asdict(pick) if pick else None,
    }
    print_table(setup, rows, table, pick)
    title = f"{scenario.describe()} p99 SLO {setup.slo_ms:g} ms"
    written = plots.sweep(points, setup.slo_ms, pick, title, plots_dir)
    print("Plots: " + ", ".join(str(p) for p in written))
    return report


def print_table(
    setup: Setup,
    rows: list[dict[str, Any]],
    table: list[dict[str, Any]],
    pick: analysis.Recommendation | None,
) -> None:
    print(
        f"\n{'batch':>5} {'wait':>5} {'offered':>8} {'thru':>7} {'p50':>7} {'p99':>8} "
        f"{'mean batch':>10}  errors"
    )
    for r in rows:
        mean = (r["batching"] or {}).get("mean_batch")
        print(
            f"{r['max_batch']:>5} {r['max_wait_ms']:>5g} {r['offered_rps']:>8.0f} "
            f"{r['throughput_rps']:>7.0f} {r['p50_ms']:>7.1f} {r['p99_ms']:>8.1f} "
            f"{mean if mean is not None else '-':>10}  {r['errors'] or ''}"
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
            f"p99 {pick.p99_ms:.1f} ms there)"
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
        help="rates as shares of the best limit over the grid (0.25,0.5,0.7,0.85,1)",
    )
    parser.add_argument("--rates", type=_floats, default=(), help="explicit rates, req/s")
    parser.add_argument(
        "--duration", type=float, default=d.duration_s, help="s per run (%(default)s)"
    )


def main(args: argparse.Namespace) -> int:
    setup = Setup(
        scenario=Scenario.from_args(args),
        batches=args.batches,
        waits_ms=args.waits,
        shares=args.shares,
        rates=args.rates,
        slo_ms=args.slo_ms,
        duration_s=args.duration,
    )
    write(asyncio.run(run(setup, args.plots)), args.out)
    return 0

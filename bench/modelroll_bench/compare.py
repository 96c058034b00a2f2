"""``make bench``: every batcher in front of the same demo model, under the same lognormal request
lengths, in one run, reported as ratios to the modelroll sidecar (first-in-first-out).

Systems: no batching (the sidecar with max batch 1); the sidecar, FIFO; the sidecar with a token
budget; the classic sleep-then-drain micro-batcher (``classic.py``); KServe's batcher
(``bench/kserve``, built by ``make kserve-batcher``).

Figures, per system and round: throughput at saturation (wrk, cycling through the same bodies);
p50/p95/p99 under Poisson arrivals at 30/50/70/90% of the model's limit; goodput under a p99 SLO
(the highest arrival rate whose p99 stays within it, found by bisection). Systems alternate within
each round, and every figure is reported as median and range over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import analysis, plots
from .runs import Scenario, bar, idle, load_average, machine, open_run, saturate, write
from .systems import KSERVE_BIN, Batching, StartError, System, batcher, demo_model

BASELINE = "sidecar FIFO"


@dataclass(frozen=True)
class Setup:
    scenario: Scenario = field(default_factory=Scenario)
    max_batch: int = 32
    max_wait_ms: float = 10.0
    max_batch_tokens: int = 1536
    shares: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)
    slo_ms: float = 150.0
    duration_s: int = 8
    connections: int = 128
    rounds: int = 3
    goodput_probes: int = 4
    only: tuple[str, ...] = ()

    def systems(self) -> list[System]:
        fifo = Batching(self.max_batch, self.max_wait_ms)
        every = [
            System("no batching", "sidecar", replace(fifo, max_batch=1)),
            System(BASELINE, "sidecar", fifo),
            System(
                "sidecar + tokens", "sidecar", replace(fifo, max_batch_tokens=self.max_batch_tokens)
            ),
            System("sleep-then-drain", "classic", fifo),
            System("KServe batcher", "kserve", fifo),
        ]
        return [s for s in every if not self.only or s.label in self.only]


def unavailable(system: System) -> str | None:
    """Why a system cannot run here, or None."""
    if system.kind == "kserve" and not KSERVE_BIN.exists():
        return f"{KSERVE_BIN} is missing: `make kserve-batcher` did not build it (see its output)"
    return None


async def measure(
    system: System, model: str, setup: Setup, limit: float, round_no: int, progress: Any
) -> dict[str, Any]:
    """One round for one system: saturation, the fixed shares, then the goodput search."""
    workload, stats = setup.scenario.workload, model + "/v1/stats"
    row: dict[str, Any] = {"round": round_no, "load_average_1m": round(load_average(), 2)}

    def step(what: str) -> None:
        progress.set_postfix_str(f"round {round_no} {system.label}: {what}")

    async with batcher(system, model, setup.scenario.parallel) as url:
        step("saturation")
        sat = await saturate(
            url,
            workload,
            setup.connections,
            setup.duration_s,
            label=system.label,
            stats_url=stats,
        )
        sat["of_model_limit"] = round(sat["rps"] / limit, 3)
        row["saturation"] = sat
        progress.update()
        await idle(stats)
        tried: dict[float, dict[str, Any]] = {}

        async def at(rate: float) -> dict[str, Any]:
            if rate > analysis.SATURATED * sat["rps"]:
                return {"offered_rps": round(rate, 1), "skipped": "beyond saturation"}
            result = await open_run(
                url,
                workload,
                rate,
                setup.duration_s,
                seed=round_no,
                label=system.label,
                stats_url=stats,
            )
            tried[rate] = result
            return result

        row["shares"] = {}
        for share in setup.shares:
            step(f"{share:.0%} of the limit")
            row["shares"][str(share)] = {"share": share, **await at(share * limit)}
            progress.update()
        passing = [r for r, res in tried.items() if analysis.meets_slo(res, setup.slo_ms)]
        failing = [r for r, res in tried.items() if not analysis.meets_slo(res, setup.slo_ms)]
        failing += [s * limit for s in setup.shares if s * limit not in tried]
        for _ in range(setup.goodput_probes):
            rate = analysis.next_probe(passing, failing, analysis.SATURATED * sat["rps"])
            if rate is None:
                break
            step(f"goodput probe at {rate:.0f} req/s")
            result = await at(rate)
            ok = "skipped" not in result and analysis.meets_slo(result, setup.slo_ms)
            (passing if ok else failing).append(rate)
            progress.update()
        best = max(passing, default=None)
        row["goodput"] = {
            "rps": tried[best]["throughput_rps"] if best is not None else 0.0,
            "offered_rps": round(best, 1) if best is not None else None,
            "p99_ms": tried[best]["p99_ms"] if best is not None else None,
            "probes": sorted(round(r, 1) for r in tried),
        }
    return row


def aggregate(
    setup: Setup, rounds: dict[str, list[dict[str, Any]]], limit: float
) -> dict[str, Any]:
    """Median and range over rounds of every figure, and the same as ratios to the baseline."""
    out: dict[str, Any] = {}
    base = rounds.get(BASELINE, [])

    def figure(rows: list[dict[str, Any]], path: tuple[str, ...]) -> list[float | None]:
        values: list[float | None] = []
        for row in rows:
            value: Any = row
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            values.append(float(value) if isinstance(value, int | float) else None)
        return values

    paths: dict[str, tuple[str, ...]] = {
        "saturation_rps": ("saturation", "rps"),
        "goodput_rps": ("goodput", "rps"),
    }
    for share in setup.shares:
        for q in ("p50_ms", "p95_ms", "p99_ms"):
            paths[f"{q[:3]}_at_{share:.0%}"] = ("shares", str(share), q)
    for label, rows in rounds.items():
        entry: dict[str, Any] = {}
        for name, path in paths.items():
            values = figure(rows, path)
            spread = analysis.Spread.of([v for v in values if v is not None])
            # The baseline's figure from the same round (None when it has none for that round).
            by_round = dict(zip((b["round"] for b in base), figure(base, path), strict=True))
            same_round = [by_round.get(row["round"]) for row in rows]
            ratios = analysis.Spread.of(analysis.paired_ratios(values, same_round))
            entry[name] = {
                "value": spread and spread.as_dict(1),
                "ratio_to_baseline": ratios and ratios.as_dict(3),
            }
        sat = analysis.Spread.of([v for v in figure(rows, paths["saturation_rps"]) if v])
        entry["saturation_of_limit"] = sat and round(sat.median / limit, 3)
        out[label] = entry
    return out


def print_table(setup: Setup, summary: dict[str, Any], limit: float) -> None:
    def cell(entry: dict[str, Any], key: str, ratio: bool = False) -> str:
        fig = entry[key]["ratio_to_baseline" if ratio else "value"]
        if fig is None:
            return "-"
        if ratio:
            return f"{fig['median']:.2f}x ({fig['low']:.2f}-{fig['high']:.2f})"
        return f"{fig['median']:.0f} ({fig['low']:.0f}-{fig['high']:.0f})"

    print(f"\nModel limit {limit:.0f} req/s; medians over rounds (range); ratios to {BASELINE}.")
    print(
        f"{'system':<18} {'saturation req/s':<18} {'ratio':<20} {'of limit':<9}"
        f"{'goodput req/s':<16} ratio"
    )
    for label, entry in summary.items():
        print(
            f"{label:<18} {cell(entry, 'saturation_rps'):<18} "
            f"{cell(entry, 'saturation_rps', True):<20} {entry['saturation_of_limit'] or 0:<9.0%}"
            f"{cell(entry, 'goodput_rps'):<16} {cell(entry, 'goodput_rps', True)}"
        )
    print(f"\np99 ms at a share of the model's limit (goodput: p99 <= {setup.slo_ms:g} ms):")
    print(f"{'system':<18} " + " ".join(f"{s:>22.0%}" for s in setup.shares))
    for label, entry in summary.items():
        print(
            f"{label:<18} "
            + " ".join(f"{cell(entry, f'p99_at_{s:.0%}'):>22}" for s in setup.shares)
        )


async def run(setup: Setup, plots_dir: Path) -> dict[str, Any]:
    scenario = setup.scenario
    limit = scenario.limit_rps(setup.max_batch)
    sent = scenario.cost.limit_rps(scenario.workload.sample(), setup.max_batch, seed=scenario.seed)
    systems = setup.systems()
    notes = {s.label: why for s in systems if (why := unavailable(s)) is not None}
    runnable = [s for s in systems if s.label not in notes]
    print(
        f"{scenario.describe()}\nModel's limit at max batch {setup.max_batch}: {limit:.1f} req/s "
        f"(Monte Carlo; {sent:.1f} req/s for the {scenario.workload.bodies} bodies sent). Load "
        f"average {load_average():.2f} on {machine()['cpus']} CPUs.",
        flush=True,
    )
    for label, why in notes.items():
        print(f"  {label}: not measured: {why}", flush=True)
    rounds: dict[str, list[dict[str, Any]]] = {s.label: [] for s in runnable}
    per_round = 1 + len(setup.shares) + setup.goodput_probes
    async with demo_model(scenario.cost) as model:
        with bar(setup.rounds * len(runnable) * per_round, "make bench") as progress:
            for r in range(1, setup.rounds + 1):
                # Alternate the order between rounds so no system always runs first or last.
                order = runnable if r % 2 else list(reversed(runnable))
                for system in order:
                    try:
                        rounds[system.label].append(
                            await measure(system, model, setup, limit, r, progress)
                        )
                    except StartError as exc:
                        notes[system.label] = f"did not start: {exc}"
                        print(f"  {system.label}: {notes[system.label]}", flush=True)
    summary = aggregate(setup, {k: v for k, v in rounds.items() if v}, limit)
    report = {
        "setup": {
            **asdict(setup),
            "model_limit_rps": round(limit, 1),
            "bodies_limit_rps": round(sent, 1),
        },
        "machine": machine(),
        "systems": {s.label: {"kind": s.kind, **asdict(s.batching)} for s in systems},
        "notes": notes,
        "summary": summary,
        "rounds": rounds,
    }
    print_table(setup, summary, limit)
    for why in notes.values():
        print(f"Note: {why}")
    written = plots.compare(report, plots_dir)
    print("Plots: " + ", ".join(str(p) for p in written))
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    Scenario.add_arguments(parser, "compare")
    parser.add_argument("--max-batch", type=int, default=d.max_batch, help="(%(default)s)")
    parser.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, help="(%(default)s)")
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=d.max_batch_tokens,
        help="token budget of the 'sidecar + tokens' system (%(default)s)",
    )
    parser.add_argument("--slo-ms", type=float, default=d.slo_ms, help="p99 SLO (%(default)s)")
    parser.add_argument(
        "--duration", type=int, default=d.duration_s, help="s per run (%(default)s)"
    )
    parser.add_argument("--connections", type=int, default=d.connections, help="wrk connections")
    parser.add_argument("--rounds", type=int, default=d.rounds, help="(%(default)s)")
    parser.add_argument(
        "--goodput-probes", type=int, default=d.goodput_probes, help="(%(default)s)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SYSTEM",
        help="measure only this system (repeatable)",
    )


def main(args: argparse.Namespace) -> int:
    setup = Setup(
        scenario=Scenario.from_args(args),
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_batch_tokens=args.max_batch_tokens,
        slo_ms=args.slo_ms,
        duration_s=args.duration,
        connections=args.connections,
        rounds=args.rounds,
        goodput_probes=args.goodput_probes,
        only=tuple(args.only),
    )
    write(asyncio.run(run(setup, args.plots)), args.out)
    return 0

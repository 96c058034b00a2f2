"""``make bench``: every batcher in front of the same demo model, under the same request lengths,
in one run, reported as ratios to the modelroll sidecar as it batches by default (first in, first
out, fixed max-wait).

Systems: no batching (the sidecar with max batch 1); the sidecar, FIFO; the sidecar with a token
budget; the sidecar batching by length (``--batch-by length``), with the adaptive wait
(``--wait-policy adaptive``), and with both; the classic sleep-then-drain micro-batcher
(``classic.py``); KServe's batcher (``bench/kserve``, built by ``make kserve-batcher``); Ray Serve's
``@serve.batch`` (``bench/ray``, in the virtualenv ``make ray-serve`` makes).

The model (``--model``) is the demo model, which charges its cost formula, or the real sentence
encoder (``modelroll-encoder``, int8), sent English sentences of the drawn lengths in words; in
front of the encoder every sidecar counts lengths in the encoder's own tokens
(``--length-from tokenizer``), and the model's limit and padding are measured, not computed.

Length distributions (``--lengths``, each measured in full): ``lognormal`` (lognormal:3,0.7) and
``bimodal`` (bimodal:8,16,100,200,0.2: 80% short, 20% long); see ``lengths.py`` for why. The demo
model charges padded tokens, so how a batcher groups lengths shows in its cost.

Figures, per distribution, system and round: throughput at saturation (wrk, cycling through the
same bodies); p50/p95/p99 under Poisson arrivals at 10/30/50/70/90% of the model's limit, with p99
per length decile (deciles of the lengths of the requests each run sent) and the requests per
second answered within the SLO; goodput under the p99 SLO (the highest arrival rate whose p99
stays within it, found by bisection); the mean batch size and the padding efficiency (useful
tokens over padded tokens), both from the demo model's own counters, so every batcher is counted
the same way. Before each distribution's systems, the cost of a batch of one at the median length
is measured straight at the model: the floor for a lone request; and for each system, before its
saturation run, the time of a lone request through it (its hop, plus any wait for company), so the
p50 at low load splits into that and queueing behind running batches. Systems alternate within each
round, and every figure is reported as median and range over the rounds; ratios to FIFO are taken
within a round, then the median.

The model's limit is parallel x max batch / E[cost of a full batch of random lengths]: what a
batcher that ignores length can get out of it. A batcher that groups similar lengths pads less and
can serve more than that "limit".

Targets, judged for the three sidecar modes beyond FIFO:

* goodput under the p99 SLO >= 1.5x FIFO's, on the lognormal lengths;
* no length decile's p99 above FIFO's p99 for that decile by more than max-wait, at 70% and 90%
  load (medians over rounds per decile, then the worst decile), so long requests do not starve;
* at 10% load, p50 within 1 ms of the measured cost of a batch of one (FIFO pays max-wait);
* at 70% and 90% load, requests answered within the SLO per second not below FIFO's (paired by
  round; 1% tolerance, a few requests of noise). This is "goodput at 70-90% load": at a fixed
  offered rate, the throughput that met the latency SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import arithmetic, plots
from .lengths import PRESETS, parse, parse_list
from .lengths import name as lengths_name
from .metrics import Watch
from .runs import (
    Scenario,
    bar,
    batch_of_one_ms,
    idle,
    load_average,
    lone_request_ms,
    machine,
    open_run,
    saturate,
    write,
)
from .systems import KSERVE_BIN, RAY_PYTHON, Batching, StartError, System, batcher

BASELINE = "sidecar FIFO"
LENGTH, ADAPTIVE, BOTH = "sidecar length-aware", "sidecar adaptive", "sidecar length + adaptive"
JUDGED = (LENGTH, ADAPTIVE, BOTH)
"""The systems the targets are judged on."""
GOODPUT_TARGET = 1.5
"""Goodput under the SLO against FIFO's, on the lognormal lengths."""
GOODPUT_TARGET_LENGTHS = "lognormal"
BATCH_OF_ONE_MARGIN_MS = 1.0
"""At 10% load, p50 may exceed the cost of a batch of one by this much."""
LOW_SHARE = 0.1
DECILE_SHARES = (0.7, 0.9)
"""The loads where p99 by length decile is judged, and within-SLO throughput against FIFO's."""
NOT_BELOW_TOLERANCE = 0.01
WIDTH = 26
"""Width of the system column in the tables (the longest label is 25 characters)."""


@dataclass(frozen=True)
class Setup:
    scenario: Scenario = field(default_factory=Scenario)
    """The model's cost and the seed; its ``lengths`` is ignored for ``distributions``."""
    distributions: tuple[str, ...] = ("lognormal", "bimodal")
    """Preset names or specs (lengths.py), each measured in full."""
    max_batch: int = 32
    max_wait_ms: float = 10.0
    max_batch_tokens: int = 1536
    shares: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    slo_ms: float = 150.0
    duration_s: float = 6.0
    connections: int = 128
    rounds: int = 3
    goodput_probes: int = 4
    only: tuple[str, ...] = ()

    def systems(self) -> list[System]:
        unit = "tokenizer" if self.scenario.model == "encoder" else "words"
        fifo = Batching(self.max_batch, self.max_wait_ms, length_from=unit)
        every = [
            System("no batching", "sidecar", replace(fifo, max_batch=1)),
            System(BASELINE, "sidecar", fifo),
            System(
                "sidecar + tokens", "sidecar", replace(fifo, max_batch_tokens=self.max_batch_tokens)
            ),
            System(LENGTH, "sidecar", replace(fifo, batch_by="length")),
            System(ADAPTIVE, "sidecar", replace(fifo, wait_policy="adaptive")),
            System(BOTH, "sidecar", replace(fifo, batch_by="length", wait_policy="adaptive")),
            System("sleep-then-drain", "classic", fifo),
            System("KServe batcher", "kserve", fifo),
            System("Ray Serve batch", "ray", fifo),
        ]
        return [s for s in every if not self.only or s.label in self.only]

    def scenario_for(self, distribution: str) -> Scenario:
        return replace(self.scenario, lengths=PRESETS.get(distribution, distribution))

    @property
    def wrk_seconds(self) -> int:
        return max(1, round(self.duration_s))

    def estimate_s(self, systems: int) -> float:
        """A rough duration of the whole run: every measured run, plus about 1.5 s per run for
        starting servers, draining, and reading counters (measured on the 2-CPU machine)."""
        runs = self.rounds * len(self.distributions) * systems
        per_system = self.wrk_seconds + (len(self.shares) + self.goodput_probes) * self.duration_s
        return runs * (per_system + 1.5 * (1 + len(self.shares) + self.goodput_probes))


def unavailable(system: System) -> str | None:
    """Why a system cannot run here, or None."""
    if system.kind == "kserve" and not KSERVE_BIN.exists():
        return f"{KSERVE_BIN} is missing: `make kserve-batcher` did not build it (see its output)"
    if system.kind == "ray" and not RAY_PYTHON.exists():
        return f"{RAY_PYTHON} is missing: `make ray-serve` did not make it (see its output)"
    return None


async def measure(
    system: System,
    model: str,
    setup: Setup,
    scenario: Scenario,
    limit: float,
    round_no: int,
    progress: Any,
    lone_length: int,
) -> dict[str, Any]:
    """One round for one system: one lone request of ``lone_length`` tokens at a time,
    saturation, the fixed shares, then the goodput search."""
    workload, stats = scenario.workload, model + "/v1/stats"
    row: dict[str, Any] = {"round": round_no, "load_average_1m": round(load_average(), 2)}

    def step(what: str) -> None:
        progress.set_postfix_str(f"round {round_no} {system.label}: {what}")

    async with Watch(stats) as whole, batcher(system, model, scenario.parallel) as url:
        # First, so no arrival rate from a burst lingers (the adaptive wait's estimate follows
        # about a second); its warm-up calls also train the adaptive wait's cost fit.
        step("lone requests")
        row["lone_ms"] = round(await lone_request_ms(url, scenario.workload.text(lone_length)), 3)
        step("saturation")
        sat = await saturate(
            url,
            workload,
            setup.connections,
            setup.wrk_seconds,
            label=system.label,
            stats_url=stats,
        )
        sat["of_model_limit"] = round(sat["rps"] / limit, 3)
        row["saturation"] = sat
        progress.update()
        await idle(stats)
        tried: dict[float, dict[str, Any]] = {}

        async def at(rate: float) -> dict[str, Any]:
            if rate > arithmetic.SATURATED * sat["rps"]:
                return {"offered_rps": round(rate, 1), "skipped": "beyond saturation"}
            result = await open_run(
                url,
                workload,
                rate,
                setup.duration_s,
                seed=round_no,
                label=system.label,
                stats_url=stats,
                slo_ms=setup.slo_ms,
            )
            tried[rate] = result
            return result

        row["shares"] = {}
        for share in setup.shares:
            step(f"{share:.0%} of the limit")
            row["shares"][str(share)] = {"share": share, **await at(share * limit)}
            progress.update()
        passing = [r for r, res in tried.items() if arithmetic.meets_slo(res, setup.slo_ms)]
        failing = [r for r, res in tried.items() if not arithmetic.meets_slo(res, setup.slo_ms)]
        failing += [s * limit for s in setup.shares if s * limit not in tried]
        probes = 0
        for _ in range(setup.goodput_probes):
            rate = arithmetic.next_probe(passing, failing, arithmetic.SATURATED * sat["rps"])
            if rate is None:
                break
            step(f"goodput probe at {rate:.0f} req/s")
            result = await at(rate)
            ok = "skipped" not in result and arithmetic.meets_slo(result, setup.slo_ms)
            (passing if ok else failing).append(rate)
            progress.update()
            probes += 1
        progress.update(setup.goodput_probes - probes)
        best = max(passing, default=None)
        row["goodput"] = {
            "rps": tried[best]["throughput_rps"] if best is not None else 0.0,
            "offered_rps": round(best, 1) if best is not None else None,
            "p99_ms": tried[best]["p99_ms"] if best is not None else None,
            "by_length_decile": tried[best]["by_length_decile"] if best is not None else None,
            "probes": sorted(round(r, 1) for r in tried),
        }
    # Every batch the model ran for this system in the round: saturation, loads and probes.
    row["total"] = whole.delta and whole.delta.summary()
    return row


def _figure(row: Any, path: Sequence[str]) -> float | None:
    value = row
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def figure_paths(setup: Setup) -> dict[str, tuple[str, ...]]:
    """Every per-round figure aggregate() reports, by name, and where a round's row holds it."""
    paths: dict[str, tuple[str, ...]] = {
        "saturation_rps": ("saturation", "rps"),
        "lone_ms": ("lone_ms",),
        "goodput_rps": ("goodput", "rps"),
        "mean_batch_at_saturation": ("saturation", "batching", "mean_batch"),
        "padding_at_saturation": ("saturation", "batching", "padding_efficiency"),
        "mean_batch_overall": ("total", "mean_batch"),
        "padding_overall": ("total", "padding_efficiency"),
    }
    for share in setup.shares:
        at = f"{share:.0%}"
        for q in ("p50_ms", "p95_ms", "p99_ms"):
            paths[f"{q[:3]}_at_{at}"] = ("shares", str(share), q)
        paths[f"slo_rps_at_{at}"] = ("shares", str(share), "within_slo_rps")
        paths[f"mean_batch_at_{at}"] = ("shares", str(share), "batching", "mean_batch")
        paths[f"padding_at_{at}"] = ("shares", str(share), "batching", "padding_efficiency")
    return paths


def aggregate(
    setup: Setup, rounds: dict[str, list[dict[str, Any]]], limit: float
) -> dict[str, Any]:
    """Median and range over rounds of every figure, and the same as ratios to the baseline; and
    at the decile shares, p99 per length decile and the worst decile's excess over FIFO's."""
    out: dict[str, Any] = {}
    base = rounds.get(BASELINE, [])
    paths = figure_paths(setup)
    for label, rows in rounds.items():
        entry: dict[str, Any] = {}
        for name, path in paths.items():
            values = [_figure(row, path) for row in rows]
            spread = arithmetic.Spread.of([v for v in values if v is not None])
            # The baseline's figure from the same round (None when it has none for that round).
            by_round = {b["round"]: _figure(b, path) for b in base}
            same_round = [by_round.get(row["round"]) for row in rows]
            ratios = arithmetic.Spread.of(arithmetic.paired_ratios(values, same_round))
            entry[name] = {
                "value": spread and spread.as_dict(3 if "padding" in name else 2),
                "ratio_to_baseline": ratios and ratios.as_dict(3),
            }
        sat = arithmetic.Spread.of(
            [v for v in (_figure(r, paths["saturation_rps"]) for r in rows) if v]
        )
        entry["saturation_of_limit"] = sat and round(sat.median / limit, 3)
        for share in DECILE_SHARES:
            if share in setup.shares:
                entry[f"deciles_at_{share:.0%}"] = arithmetic.median_deciles(
                    [_deciles(row, share) for row in rows]
                )
        out[label] = entry
    if BASELINE not in out:
        return out
    for label, entry in out.items():
        for share in DECILE_SHARES:
            key = f"deciles_at_{share:.0%}"
            if key not in entry:
                continue
            worst = arithmetic.worst_decile_gap(entry[key], out[BASELINE][key])
            theirs = {b["round"]: _deciles(b, share) for b in base}
            per_round = [
                gap["gap_ms"]
                for row in rounds[label]
                if (
                    gap := arithmetic.worst_decile_gap(
                        _deciles(row, share), theirs.get(row["round"], [])
                    )
                )
                is not None
            ]
            spread = arithmetic.Spread.of(per_round)
            entry[f"decile_gap_at_{share:.0%}"] = {
                "worst_of_medians": worst,
                "per_round_worst_ms": spread and spread.as_dict(1),
            }
    return out


def _deciles(row: dict[str, Any], share: float) -> list[dict[str, Any]]:
    found = row.get("shares", {}).get(str(share), {}).get("by_length_decile")
    return list(found) if isinstance(found, list) else []


Check = tuple[str, str, bool, str]
"""(target, system, met, measured)."""


def checks(
    setup: Setup, distribution: str, summary: dict[str, Any], one_ms: float | None
) -> list[Check]:
    """The targets for the judged systems measured on this distribution."""
    out: list[Check] = []
    if BASELINE not in summary:
        return out
    judged = [s for s in JUDGED if s in summary]

    def ratio(label: str, key: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = summary[label][key]["ratio_to_baseline"]
        return found

    if distribution == GOODPUT_TARGET_LENGTHS:
        target = (
            f"goodput (p99 <= {setup.slo_ms:g} ms) >= {GOODPUT_TARGET:g}x {BASELINE}'s "
            f"on {distribution}"
        )
        for label in judged:
            r = ratio(label, "goodput_rps")
            met = r is not None and r["median"] >= GOODPUT_TARGET
            out.append((target, label, met, _ratio_text(r)))
    for share in DECILE_SHARES:
        key = f"decile_gap_at_{share:.0%}"
        target = (
            f"at {share:.0%} load, no length decile's p99 above {BASELINE}'s by more than "
            f"max-wait ({setup.max_wait_ms:g} ms)"
        )
        for label in judged:
            gap = summary[label].get(key, {}).get("worst_of_medians")
            if gap is None:
                out.append((target, label, False, "not measured"))
                continue
            rounds = summary[label][key]["per_round_worst_ms"]
            lo, hi = gap["lengths"]
            text = (
                f"worst decile {gap['decile']} (lengths {lo}-{hi}): p99 {gap['p99_ms']:.1f} "
                f"against {gap['baseline_p99_ms']:.1f} ms, {gap['gap_ms']:+.1f} ms"
            )
            if rounds:
                text += (
                    f" (worst per round {rounds['median']:+.1f}, {rounds['low']:+.1f} to "
                    f"{rounds['high']:+.1f})"
                )
            out.append((target, label, gap["gap_ms"] <= setup.max_wait_ms, text))
    if LOW_SHARE in setup.shares and one_ms is not None:
        target = (
            f"at {LOW_SHARE:.0%} load, p50 within {BATCH_OF_ONE_MARGIN_MS:g} ms of a batch of one "
            f"({one_ms:.2f} ms)"
        )
        for label in judged:
            p50 = summary[label][f"p50_at_{LOW_SHARE:.0%}"]["value"]
            if p50 is None:
                out.append((target, label, False, "not measured"))
                continue
            excess = p50["median"] - one_ms
            out.append(
                (
                    target,
                    label,
                    excess <= BATCH_OF_ONE_MARGIN_MS,
                    f"p50 {p50['median']:.2f} ms ({p50['low']:.2f}-{p50['high']:.2f}), "
                    f"{excess:+.2f} ms",
                )
            )
    for share in DECILE_SHARES:
        if share not in setup.shares:
            continue
        target = (
            f"at {share:.0%} load, requests/s answered within {setup.slo_ms:g} ms not below "
            f"{BASELINE}'s"
        )
        for label in judged:
            r = ratio(label, f"slo_rps_at_{share:.0%}")
            met = r is not None and r["median"] >= 1 - NOT_BELOW_TOLERANCE
            value = summary[label][f"slo_rps_at_{share:.0%}"]["value"]
            text = f"{value['median']:.0f} req/s, " if value else ""
            out.append((target, label, met, text + _ratio_text(r)))
    return out


def _ratio_text(r: dict[str, Any] | None) -> str:
    if r is None:
        return "no ratio (a system was not measured)"
    return f"{r['median']:.2f}x ({r['low']:.2f}-{r['high']:.2f})"


def _median(fig: dict[str, Any] | None, fmt: str = ".0f") -> str:
    return "-" if fig is None else format(fig["median"], fmt)


def print_tables(setup: Setup, distribution: dict[str, Any], label_width: int = WIDTH) -> None:
    """One distribution's figures as tables a human can read (medians over rounds)."""
    summary, limit = distribution["summary"], distribution["model_limit_rps"]
    w = label_width

    def cell(entry: dict[str, Any], key: str, ratio: bool = False) -> str:
        fig = entry[key]["ratio_to_baseline" if ratio else "value"]
        if fig is None:
            return "-"
        if ratio:
            return f"{fig['median']:.2f}x ({fig['low']:.2f}-{fig['high']:.2f})"
        return f"{fig['median']:.0f} ({fig['low']:.0f}-{fig['high']:.0f})"

    print(
        f"\n=== {distribution['name']} ({distribution['lengths']}): model's limit {limit:.0f} "
        f"req/s; medians over rounds (range); ratios to {BASELINE}, paired by round ==="
    )
    print(
        f"{'system':<{w}} {'saturation req/s':<18} {'ratio':<20} {'of limit':<9}"
        f"{'goodput req/s':<16} {'ratio':<20} mean batch (saturation)"
    )
    for label, entry in summary.items():
        print(
            f"{label:<{w}} {cell(entry, 'saturation_rps'):<18} "
            f"{cell(entry, 'saturation_rps', True):<20} {entry['saturation_of_limit'] or 0:<9.0%}"
            f"{cell(entry, 'goodput_rps'):<16} {cell(entry, 'goodput_rps', True):<20} "
            f"{_median(entry['mean_batch_at_saturation']['value'], '.1f')}"
        )

    shares = setup.shares
    heads = " ".join(f"{f'{s:.0%} ({s * limit:.0f}/s)':>20}" for s in shares)
    print(f"\np50 / p95 / p99 ms at a share of the model's limit:\n{'system':<{w}} {heads}")
    for label, entry in summary.items():
        cells = []
        for s in shares:
            figs = [entry[f"{q}_at_{s:.0%}"]["value"] for q in ("p50", "p95", "p99")]
            cells.append("saturated" if figs[2] is None else "/".join(_median(f) for f in figs))
        print(f"{label:<{w}} " + " ".join(f"{c:>20}" for c in cells))
    print(f"\np50 and p99 as ratios to {BASELINE} (median of paired rounds):")
    print(f"{'system':<{w}} " + " ".join(f"{f'{s:.0%}':>20}" for s in shares))
    for label, entry in summary.items():
        cells = []
        for s in shares:
            r = [entry[f"{q}_at_{s:.0%}"]["ratio_to_baseline"] for q in ("p50", "p99")]
            cells.append("-" if None in r else f"{_median(r[0], '.2f')} / {_median(r[1], '.2f')}")
        print(f"{label:<{w}} " + " ".join(f"{c:>20}" for c in cells))

    one = distribution["batch_of_one"]
    if LOW_SHARE in shares:
        measured = one["measured_ms"]
        # Only the demo model has a cost formula to compare with.
        formula = one.get("cost_model_ms")
        print(
            f"\nAt {LOW_SHARE:.0%} load: p50 against the cost of a batch of one at the median "
            f"length ({one['median_length']} tokens): measured at the model "
            f"{_median(measured, '.2f')} ms"
            + (f"; cost model {formula:.2f} ms." if formula is not None else ".")
        )
        print(
            "A lone request through each batcher (one at a time, nothing else in flight) "
            "is the batch of one plus the batcher's hop and any wait for company; the rest of "
            "the p50 is queueing behind batches that were running."
        )
        print(
            f"{'system':<{w}} {'p50 ms (range)':>20} {'- batch of one':>15} {'lone request':>13} "
            f"{'p50 - lone':>11}"
        )
        for label, entry in summary.items():
            p50, lone = entry[f"p50_at_{LOW_SHARE:.0%}"]["value"], entry["lone_ms"]["value"]
            if p50 is None:
                print(f"{label:<{w}} {'-':>20}")
                continue
            excess = f"{p50['median'] - measured['median']:+.2f}" if measured else "-"
            text = f"{p50['median']:.2f} ({p50['low']:.2f}-{p50['high']:.2f})"
            alone = f"{lone['median']:.2f}" if lone else "-"
            queued = f"{p50['median'] - lone['median']:+.2f}" if lone else "-"
            print(f"{label:<{w}} {text:>20} {excess:>15} {alone:>13} {queued:>11}")

    for share in DECILE_SHARES:
        key = f"deciles_at_{share:.0%}"
        base: list[dict[str, Any]] = summary.get(BASELINE, {}).get(key) or next(
            (e[key] for e in summary.values() if e.get(key)), []
        )
        if not base:
            continue
        ranges = {d["decile"]: d["lengths"] for d in base}
        columns = sorted(ranges)
        print(
            f"\np99 ms by length decile at {share:.0%} load (median over rounds); last column: "
            f"the worst decile's p99 minus {BASELINE}'s (max-wait {setup.max_wait_ms:g} ms)"
        )
        print(
            f"{'system':<{w}} "
            + " ".join(f"{f'{ranges[d][0]}-{ranges[d][1]}':>8}" for d in columns)
            + "  worst vs FIFO"
        )
        for label, entry in summary.items():
            mine = {d["decile"]: d["p99_ms"] for d in entry.get(key, [])}
            gap = entry.get(f"decile_gap_at_{share:.0%}", {}).get("worst_of_medians")
            worst = f"{gap['gap_ms']:+.1f} (d{gap['decile']})" if gap else "-"
            print(
                f"{label:<{w}} "
                + " ".join(f"{mine[d]:>8.0f}" if d in mine else f"{'-':>8}" for d in columns)
                + f"  {worst}"
            )

    points = [("saturation", "at_saturation")] + [(f"{s:.0%}", f"at_{s:.0%}") for s in shares]
    points.append(("whole round", "overall"))
    print(
        "\nPadding efficiency (useful / padded tokens) and mean batch size, from the model's "
        "counters:"
    )
    print(f"{'system':<{w}} " + " ".join(f"{p:>13}" for p, _ in points))
    for label, entry in summary.items():
        cells = []
        for _, key in points:
            eff, size = entry[f"padding_{key}"]["value"], entry[f"mean_batch_{key}"]["value"]
            cells.append("-" if eff is None else f"{eff['median']:.2f} ({_median(size, '.1f')})")
        print(f"{label:<{w}} " + " ".join(f"{c:>13}" for c in cells))


def print_checks(name: str, found: list[Check]) -> None:
    if not found:
        return
    print(f"\nTargets on {name}:")
    last = None
    for target, label, met, measured in found:
        if target != last:
            print(f"  {target}:")
            last = target
        print(f"    [{'met' if met else 'MISSED'}] {label:<{WIDTH}} {measured}")


async def distribution(
    setup: Setup, name: str, scenario: Scenario, model: str, systems: list[System]
) -> dict[str, Any]:
    """A length distribution's entry in the report, before any round: the model's limit at the
    max batch (the demo model's from its formula, a real model's measured at ``model``) and the
    median length a lone request carries."""
    sample = scenario.workload.sample()
    [limit] = (await scenario.limits_rps(model, [setup.max_batch])).values()
    median = int(statistics.median_low(sample))
    entry: dict[str, Any] = {
        "name": name,
        "lengths": scenario.lengths,
        "model_limit_rps": round(limit, 1),
        "batch_of_one": {"median_length": median, "measured_ms_by_round": []},
        "rounds": {s.label: [] for s in systems},
    }
    how = "measured"
    if scenario.model == "demo":
        sent = scenario.cost.limit_rps(sample, setup.max_batch, seed=scenario.seed)
        entry["bodies_limit_rps"] = round(sent, 1)
        entry["batch_of_one"]["cost_model_ms"] = round(scenario.cost.batch_ms([median]), 3)
        how = f"Monte Carlo; {sent:.1f} req/s for the {scenario.workload.bodies} bodies sent"
    print(
        f"  {name} = {scenario.lengths}: model's limit at max batch {setup.max_batch} "
        f"{limit:.1f} req/s ({how}); median length {median}, longest sent {max(sample)}.",
        flush=True,
    )
    return entry


async def run(setup: Setup, plots_dir: Path) -> dict[str, Any]:
    systems = setup.systems()
    notes = {s.label: why for s in systems if (why := unavailable(s)) is not None}
    runnable = [s for s in systems if s.label not in notes]
    scenarios = {lengths_name(parse(d)): setup.scenario_for(d) for d in setup.distributions}
    base = setup.scenario
    print(
        f"{base.describe()} Max batch {setup.max_batch}, max-wait {setup.max_wait_ms:g} ms, "
        f"p99 SLO {setup.slo_ms:g} ms; {setup.rounds} rounds of {len(runnable)} systems x "
        f"{len(scenarios)} length distributions, {setup.duration_s:g} s per run. Load average "
        f"{load_average():.2f} on {machine()['cpus']} CPUs. Estimated duration "
        f"{setup.estimate_s(len(runnable)) / 60:.0f} min.",
        flush=True,
    )
    for label, why in notes.items():
        print(f"  {label}: not measured: {why}", flush=True)
    dists: dict[str, dict[str, Any]] = {}
    per_round = 1 + len(setup.shares) + setup.goodput_probes
    total = setup.rounds * len(scenarios) * len(runnable) * per_round
    async with base.serve() as model:
        for name, scenario in scenarios.items():
            dists[name] = await distribution(setup, name, scenario, model, runnable)
        with bar(total, "make bench") as progress:
            for r in range(1, setup.rounds + 1):
                # Alternate the order between rounds so no system always runs first or last.
                order = runnable if r % 2 else list(reversed(runnable))
                for name, scenario in scenarios.items():
                    dist = dists[name]
                    one = dist["batch_of_one"]
                    payload = scenario.workload.text(one["median_length"])
                    one["measured_ms_by_round"].append(
                        round(await batch_of_one_ms(model, payload), 3)
                    )
                    for system in order:
                        if system.label in notes:
                            continue
                        try:
                            dist["rounds"][system.label].append(
                                await measure(
                                    system,
                                    model,
                                    setup,
                                    scenario,
                                    dist["model_limit_rps"],
                                    r,
                                    progress,
                                    one["median_length"],
                                )
                            )
                        except StartError as exc:
                            notes[system.label] = f"did not start: {exc}"
                            print(f"  {system.label}: {notes[system.label]}", flush=True)
    every_check: list[dict[str, Any]] = []
    for name, dist in dists.items():
        rounds = {k: v for k, v in dist["rounds"].items() if v}
        dist["summary"] = aggregate(setup, rounds, dist["model_limit_rps"])
        one = dist["batch_of_one"]
        spread = arithmetic.Spread.of(one["measured_ms_by_round"])
        one["measured_ms"] = spread and spread.as_dict(3)
        found = checks(setup, name, dist["summary"], spread.median if spread else None)
        dist["targets"] = [
            {"target": t, "system": s, "met": ok, "measured": m} for t, s, ok, m in found
        ]
        every_check += [{"lengths": name, **c} for c in dist["targets"]]
        print_tables(setup, dist)
    for name, dist in dists.items():
        print_checks(
            name, [(c["target"], c["system"], c["met"], c["measured"]) for c in dist["targets"]]
        )
    report = {
        "setup": asdict(setup),
        "machine": machine(),
        "systems": {s.label: {"kind": s.kind, **asdict(s.batching)} for s in systems},
        "notes": notes,
        "targets": every_check,
        "distributions": dists,
    }
    for why in notes.values():
        print(f"Note: {why}")
    written = plots.compare(report, plots_dir)
    print("Plots: " + ", ".join(str(p) for p in written))
    return report


def _shares(text: str) -> tuple[float, ...]:
    try:
        shares = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: shares are numbers, e.g. 0.1,0.5,0.9"
        ) from None
    if not all(s > 0 for s in shares):
        raise argparse.ArgumentTypeError(f"{text!r}: shares must be above 0")
    return shares


def _distributions(text: str) -> tuple[str, ...]:
    try:
        return tuple(lengths_name(d) for d in parse_list(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    Scenario.add_arguments(
        parser,
        "compare",
        lengths=",".join(d.distributions),
        lengths_help="length distributions, comma-separated: preset names (lognormal, bimodal) "
        "or specs such as lognormal:3,0.7; each is measured in full",
    )
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
        "--shares",
        type=_shares,
        default=d.shares,
        help="open-loop loads as shares of the model's limit (0.1,0.3,0.5,0.7,0.9)",
    )
    parser.add_argument(
        "--duration-s",
        "--duration",
        dest="duration_s",
        type=float,
        default=d.duration_s,
        help="s per run; wrk's runs round it to whole seconds (%(default)s)",
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
        help="measure only this system (repeatable; give sidecar FIFO too for ratios)",
    )


def main(args: argparse.Namespace) -> int:
    try:
        distributions = _distributions(args.lengths)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"modelroll-bench compare: --lengths: {exc}") from None
    scenario = Scenario(
        fixed_ms=args.fixed_ms,
        per_token_ms=args.per_token_ms,
        parallel=args.parallel,
        seed=args.seed,
        model=args.model,
    )
    setup = Setup(
        scenario=scenario,
        distributions=distributions,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_batch_tokens=args.max_batch_tokens,
        shares=args.shares,
        slo_ms=args.slo_ms,
        duration_s=args.duration_s,
        connections=args.connections,
        rounds=args.rounds,
        goodput_probes=args.goodput_probes,
        only=tuple(args.only),
    )
    write(asyncio.run(run(setup, args.plots)), args.out)
    return 0

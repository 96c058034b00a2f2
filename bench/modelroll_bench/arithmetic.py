"""The arithmetic behind the reports, kept free of I/O so it can be tested without timing
anything: SLO checks, the goodput search, spread over rounds, the sweep's recommendation, and
latency by length decile."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .figures import LoadSummary
from .results import to_json
from .stats import percentile, rank_index, spread

MAX_ERROR_FRACTION = 0.001
"""A run meets the SLO only if at most this fraction of its requests failed."""
SATURATED = 0.95
"""Rates above this fraction of a system's saturation throughput are not worth running."""


def error_fraction(row: Mapping[str, Any]) -> float:
    requests = row.get("requests") or 0
    return sum(row.get("errors", {}).values()) / requests if requests else 1.0


def meets_slo(row: Mapping[str, Any] | LoadSummary, slo_p99_ms: float) -> bool:
    """A run meets a p99 SLO when its p99 is within it and (almost) nothing failed; a p99 that
    fell among unanswered requests (None) is not."""
    if isinstance(row, LoadSummary):
        return meets_slo(to_json(row), slo_p99_ms)
    return (
        bool(row.get("requests"))
        and row["p99_ms"] is not None
        and row["p99_ms"] <= slo_p99_ms
        and error_fraction(row) <= MAX_ERROR_FRACTION
    )


def next_probe(passing: Iterable[float], failing: Iterable[float], ceiling: float) -> float | None:
    """The next arrival rate to try in the search for the highest rate that meets the SLO.

    ``passing``/``failing`` are the rates tried so far; ``ceiling`` is the highest rate worth
    trying (the system's saturation throughput). With no failure yet, the ceiling itself; after
    that, halfway between the best pass and the lowest failure. None when there is nothing left
    to try (the ceiling passed, or a failure lies below a pass, which only noise can cause)."""
    best = max(passing, default=0.0)
    worst = min(failing, default=None)
    if worst is None:
        return None if best >= ceiling else ceiling
    if worst <= best:
        return None
    return (best + worst) / 2


@dataclass(frozen=True)
class Point:
    """One sweep measurement: a batching setting at one offered rate."""

    max_batch: int
    max_wait_ms: float
    offered_rps: float
    throughput_rps: float
    p99_ms: float
    error_fraction: float = 0.0

    @property
    def setting(self) -> tuple[int, float]:
        return (self.max_batch, self.max_wait_ms)

    def meets(self, slo_p99_ms: float) -> bool:
        """Within the SLO. (An open-loop run waits for every answer, so a server that falls
        behind shows it in its p99 and errors; its throughput is the arrivals' own rate, which
        at a few hundred requests differs from the offered rate by Poisson noise alone.)"""
        return self.p99_ms <= slo_p99_ms and self.error_fraction <= MAX_ERROR_FRACTION


@dataclass(frozen=True)
class Recommendation:
    max_batch: int
    max_wait_ms: float
    goodput_rps: float
    """The highest throughput this setting reached within the SLO."""
    p99_ms: float
    """Its p99 at that throughput."""


def median_points(rounds: Sequence[Sequence[Point]]) -> list[Point]:
    """One point per setting and rate: medians over the rounds. A round that did not run that
    rate (its setting had already fallen behind at a lower one) counts as failing there: no
    throughput, infinite p99, every request an error."""
    keys = sorted({(p.max_batch, p.max_wait_ms, p.offered_rps) for r in rounds for p in r})
    by_key = [{(p.max_batch, p.max_wait_ms, p.offered_rps): p for p in r} for r in rounds]
    out = []
    for key in keys:
        found = [r.get(key) for r in by_key]
        out.append(
            Point(
                *key,
                statistics.median(p.throughput_rps if p else 0.0 for p in found),
                statistics.median(p.p99_ms if p else math.inf for p in found),
                statistics.median(p.error_fraction if p else 1.0 for p in found),
            )
        )
    return out


def goodput_by_setting(
    points: Iterable[Point], slo_p99_ms: float
) -> dict[tuple[int, float], Point]:
    """For every setting with at least one run within the SLO, its highest-throughput such run."""
    best: dict[tuple[int, float], Point] = {}
    for p in points:
        if p.meets(slo_p99_ms):
            held = best.get(p.setting)
            if held is None or (p.throughput_rps, -p.p99_ms) > (held.throughput_rps, -held.p99_ms):
                best[p.setting] = p
    return best


def recommend(points: Iterable[Point], slo_p99_ms: float) -> Recommendation | None:
    """The setting with the highest goodput under the SLO. Settings within 2% of the best count
    as tied; among them the lowest p99 wins, then the shorter max-wait, then the smaller batch.
    None when no run met the SLO."""
    best = goodput_by_setting(points, slo_p99_ms)
    if not best:
        return None
    top = max(p.throughput_rps for p in best.values())
    tied = [p for p in best.values() if p.throughput_rps >= 0.98 * top]
    pick = min(tied, key=lambda p: (p.p99_ms, p.max_wait_ms, p.max_batch))
    return Recommendation(pick.max_batch, pick.max_wait_ms, pick.throughput_rps, pick.p99_ms)


DECILES = 10


def length_edges(lengths: Sequence[int], parts: int = DECILES) -> list[int]:
    """The upper edges of the first ``parts - 1`` length quantiles (nearest rank) of ``lengths``:
    for deciles, the 10th, 20th, ... 90th percentile of the lengths."""
    ordered = sorted(lengths)
    return (
        [ordered[rank_index(len(ordered), k / parts)] for k in range(1, parts)] if ordered else []
    )


def decile_of(length: int, edges: Sequence[int]) -> int:
    """Which decile (1..10) a length falls in: one more than the edges below it. A length equal to
    an edge belongs to the lower decile; a decile whose edges coincide with the one before (many
    requests of one length) stays empty rather than splitting equal lengths between deciles."""
    return 1 + sum(1 for edge in edges if edge < length)


def by_length_decile(
    sent: Sequence[int], timed: Sequence[tuple[int, float]]
) -> list[dict[str, Any]]:
    """Latency by length decile. ``sent``: the length of every request the run sent (the deciles
    are of these, so they do not depend on which requests failed); ``timed``: (length, latency in
    seconds) of each answered one. One row per non-empty decile: its number, the range of lengths
    in it, how many were sent and answered, and p50/p99 in ms of the answered (None if none)."""
    edges = length_edges(sent)
    rows: dict[int, dict[str, Any]] = {}
    for length in sent:
        row = rows.setdefault(
            decile_of(length, edges),
            {"lengths": [length, length], "sent": 0, "latencies": []},
        )
        row["sent"] += 1
        row["lengths"] = [min(row["lengths"][0], length), max(row["lengths"][1], length)]
    for length, latency in timed:
        decile = decile_of(length, edges)
        if decile in rows:
            rows[decile]["latencies"].append(latency)
    out = []
    for decile, row in sorted(rows.items()):
        latencies = row["latencies"]
        out.append(
            {
                "decile": decile,
                "lengths": row["lengths"],
                "sent": row["sent"],
                "ok": len(latencies),
                "p50_ms": _ms(percentile(latencies, 0.50)),
                "p99_ms": _ms(percentile(latencies, 0.99)),
            }
        )
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def median_deciles(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per decile, the median over ``runs`` (rounds) of its p99, with the widest range of lengths
    any run put in it: ``[{"decile", "lengths", "p99_ms", "low", "high", "rounds"}]``."""
    found: dict[int, list[Mapping[str, Any]]] = {}
    for run in runs:
        for row in run:
            if row.get("p99_ms") is not None:
                found.setdefault(row["decile"], []).append(row)
    out = []
    for decile, rows in sorted(found.items()):
        p99 = spread([float(r["p99_ms"]) for r in rows], 2)
        if p99 is None:  # every row found has a p99: never taken
            continue
        out.append(
            {
                "decile": decile,
                "lengths": [min(r["lengths"][0] for r in rows), max(r["lengths"][1] for r in rows)],
                "p99_ms": p99.median,
                "low": p99.low,
                "high": p99.high,
                "rounds": p99.rounds,
            }
        )
    return out


def worst_decile_gap(
    deciles: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The decile whose p99 exceeds the baseline's p99 of the same decile by the most (or falls
    short of it by the least, when every decile is faster): ``{"decile", "lengths", "p99_ms",
    "baseline_p99_ms", "gap_ms"}``; None when no decile has a p99 in both."""
    theirs = {row["decile"]: row for row in baseline if row.get("p99_ms") is not None}
    worst: dict[str, Any] | None = None
    for row in deciles:
        base = theirs.get(row["decile"])
        if base is None or row.get("p99_ms") is None:
            continue
        gap = float(row["p99_ms"]) - float(base["p99_ms"])
        if worst is None or gap > worst["gap_ms"]:
            worst = {
                "decile": row["decile"],
                "lengths": row["lengths"],
                "p99_ms": row["p99_ms"],
                "baseline_p99_ms": base["p99_ms"],
                "gap_ms": round(gap, 2),
            }
    return worst


def goodput_windows(
    timeline: Iterable[tuple[int, float, float | None]],
    start_s: float,
    width_s: float,
    count: int,
    slo_s: float,
) -> list[float]:
    """Goodput over time: for each of ``count`` consecutive windows of ``width_s`` from
    ``start_s``, the requests that arrived in it and were answered within ``slo_s``, per second.
    ``timeline``: (index, arrival in seconds, latency in seconds or None when unanswered)."""
    within = [0] * count
    for _, at, latency in timeline:
        k = math.floor((at - start_s) / width_s)
        if 0 <= k < count and latency is not None and latency <= slo_s:
            within[k] += 1
    return [n / width_s for n in within]

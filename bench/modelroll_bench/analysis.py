"""The arithmetic behind the reports, kept free of I/O so it can be tested without timing
anything: SLO checks, the goodput search, spread over rounds, and the sweep's recommendation."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_ERROR_FRACTION = 0.001
"""A run meets the SLO only if at most this fraction of its requests failed."""
SATURATED = 0.95
"""Rates above this fraction of a system's saturation throughput are not worth running."""


def error_fraction(row: Mapping[str, Any]) -> float:
    requests = row.get("requests") or 0
    return sum(row.get("errors", {}).values()) / requests if requests else 1.0


def meets_slo(row: Mapping[str, Any], slo_p99_ms: float) -> bool:
    """A run meets a p99 SLO when its p99 is within it and (almost) nothing failed."""
    return (
        bool(row.get("requests"))
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
class Spread:
    """Median and range of one figure over rounds."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(statistics.median(values), min(values), max(values), len(values))

    @property
    def relative_range(self) -> float:
        """(high - low) / median: how noisy the rounds were."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def as_dict(self, digits: int = 3) -> dict[str, float]:
        return {
            "median": round(self.median, digits),
            "low": round(self.low, digits),
            "high": round(self.high, digits),
            "relative_range": round(self.relative_range, 3),
            "rounds": self.n,
        }


def paired_ratios(values: Sequence[float | None], baseline: Sequence[float | None]) -> list[float]:
    """Round-by-round ratios ``value / baseline``, skipping rounds where either is missing or 0."""
    return [v / b for v, b in zip(values, baseline, strict=True) if v is not None and b]


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

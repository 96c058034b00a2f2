"""The statistics every suite shares: one percentile of a sample and one spread over rounds.

A percentile here is the nearest rank: the smallest value with at least a fraction ``q`` of the
sample at or below it, always a value that was measured (no interpolation). A sample with no
values has no percentile: :func:`percentile` returns None, and so does :func:`spread` for no
rounds, so a report shows "none measured" rather than a zero.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_EPSILON = 1e-9
"""Absorbs float error in ``q * n`` (0.07 * 100 is 7.000000000000001, whose ceiling is 8)."""


def rank_index(n: int, q: float) -> int:
    """The 0-based index of the nearest-rank percentile ``q`` (0..1) among ``n`` sorted values:
    rank ``ceil(q * n)``, clamped to 1..n."""
    if n <= 0:
        raise ValueError(f"a percentile of {n} values: there is none")
    rank = math.ceil(q * n - _EPSILON)
    return max(1, min(n, rank)) - 1


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank percentile ``q`` (0..1) of ``values`` (in any order), or None when there
    are none. ``math.inf`` may stand for a value never reached (an unanswered request)."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[rank_index(len(ordered), q)]


@dataclass(frozen=True)
class Spread:
    """Median and range of one figure over rounds (the median of an even count is the mean of
    the middle two, as :func:`statistics.median` takes it)."""

    median: float
    low: float
    high: float
    rounds: int


def spread(values: Iterable[float | None], digits: int = 3) -> Spread | None:
    """Median, lowest and highest of the rounds that have a value (None stands for a round
    without one), rounded to ``digits``; None when no round has one."""
    found: Sequence[float] = [v for v in values if v is not None]
    if not found:
        return None
    return Spread(
        round(statistics.median(found), digits),
        round(min(found), digits),
        round(max(found), digits),
        len(found),
    )


def paired_ratios(values: Sequence[float | None], baseline: Sequence[float | None]) -> list[float]:
    """Round-by-round ratios ``value / baseline``, skipping rounds where either is missing or 0."""
    return [v / b for v, b in zip(values, baseline, strict=True) if v is not None and b]

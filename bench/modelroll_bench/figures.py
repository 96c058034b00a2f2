"""The result shapes the suites share: one load run's counts and p50/p95/p99, how the server
batched meanwhile, one saturation run's rate and CPU, and a ratio paired by round. Each is a
dataclass that :mod:`.results` writes to JSON and reads back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .results import to_json
from .stats import Spread, paired_ratios, spread


@dataclass(frozen=True)
class Latency:
    """p50/p95/p99 in ms of one run's answered requests; None where the percentile fell among
    requests never answered (slower than anything measured) or there was no request at all."""

    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    def text(self) -> str:
        """``p50 / p95 / p99 ms``, ``-`` for a percentile not measured."""
        return " / ".join(_number(v) for v in (self.p50_ms, self.p95_ms, self.p99_ms)) + " ms"


@dataclass(frozen=True)
class LoadSummary:
    """What one open- or closed-loop run saw: its requests by outcome and its latency."""

    label: str
    offered_rps: float | None
    throughput_rps: float
    requests: int
    ok: int
    errors: dict[str, int]
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    @property
    def latency(self) -> Latency:
        return Latency(self.p50_ms, self.p95_ms, self.p99_ms)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def error_fraction(self) -> float:
        """Failed (or unanswered) requests over all sent; 1 for a run that sent none."""
        return self.error_count / self.requests if self.requests else 1.0


@dataclass(frozen=True)
class BatchSummary:
    """How a server batched during a run: batches and items, the mean batch, tokens useful and
    padded (the demo model's; 0 from the sidecar's metrics), and batches by close reason."""

    batches: int
    items: int
    mean_batch: float | None
    useful_tokens: int
    padded_tokens: int
    padding_efficiency: float | None
    closed_by: dict[str, int]


@dataclass(frozen=True)
class OpenRun:
    """One open-loop run: what the load saw, how the server batched meanwhile (None where its
    counters were not read), the requests per second answered within an SLO (None where none
    was asked), and latency by length decile."""

    load: LoadSummary
    batching: BatchSummary | None
    within_slo_rps: float | None
    by_length_decile: list[dict[str, Any]]

    def row(self) -> dict[str, Any]:
        """As JSON data, flat: what ``modelroll-bench run`` prints."""
        found: dict[str, Any] = {**to_json(self.load), "batching": to_json(self.batching)}
        if self.within_slo_rps is not None:
            found["within_slo_rps"] = self.within_slo_rps
        found["by_length_decile"] = self.by_length_decile
        return found


@dataclass(frozen=True)
class Rate:
    """One saturation run of one server: requests per second, the CPU time the server spent per
    request, and the requests that failed."""

    rps: float
    cpu_us_per_request: float
    failures: int = 0


@dataclass(frozen=True)
class Figure:
    """One figure of one system over rounds, and its ratios to the baseline's and to the best
    static configuration's of the same round (None where a system did not run or no round had
    the figure)."""

    value: Spread | None
    ratio_to_baseline: Spread | None = None
    ratio_to_best_static: Spread | None = None


@dataclass(frozen=True)
class PairedRatio:
    """``value / baseline`` taken round by round (a round where either is missing or 0 left
    out), and the median and range of those ratios: other load on the machine moves both arms
    of a round together, so the pair is steadier than a ratio of medians."""

    by_round: list[float] = field(default_factory=list)
    spread: Spread | None = None

    @classmethod
    def of(
        cls, values: Sequence[float | None], baseline: Sequence[float | None], digits: int = 3
    ) -> PairedRatio:
        ratios = [round(r, digits) for r in paired_ratios(values, baseline)]
        return cls(ratios, spread(ratios, digits))


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 1000 else f"{value:.1f}"

"""How a server batched during a run: counters read before and after it, then subtracted.

Two sources: the sidecar's Prometheus ``/metrics`` (``modelroll_batch_size`` and
``modelroll_batches_total{reason}``), and the demo model's ``/v1/stats`` (batches and items it
ran, and the useful and padded tokens in them), which sees every batcher the same way, whatever
sits in front of the model: every benchmark takes its mean batch size and padding efficiency from
there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from modelroll_common import metric_names as names

from .figures import BatchSummary
from .results import to_json


@dataclass(frozen=True)
class BatchCounters:
    """Cumulative batch counters at one moment. Tokens are the demo model's (0 from the sidecar's
    metrics): useful = the sum of the items' lengths, padded = per batch, size x longest length."""

    batches: float = 0.0
    items: float = 0.0
    reasons: dict[str, float] = field(default_factory=dict)
    useful_tokens: float = 0.0
    padded_tokens: float = 0.0

    def __sub__(self, earlier: BatchCounters) -> BatchCounters:
        return BatchCounters(
            self.batches - earlier.batches,
            self.items - earlier.items,
            {r: n - earlier.reasons.get(r, 0.0) for r, n in self.reasons.items()},
            self.useful_tokens - earlier.useful_tokens,
            self.padded_tokens - earlier.padded_tokens,
        )

    def __add__(self, other: BatchCounters) -> BatchCounters:
        reasons = dict(self.reasons)
        for r, n in other.reasons.items():
            reasons[r] = reasons.get(r, 0.0) + n
        return BatchCounters(
            self.batches + other.batches,
            self.items + other.items,
            reasons,
            self.useful_tokens + other.useful_tokens,
            self.padded_tokens + other.padded_tokens,
        )

    @property
    def mean_batch(self) -> float | None:
        return self.items / self.batches if self.batches > 0 else None

    @property
    def padding_efficiency(self) -> float | None:
        """Useful tokens over padded tokens: 1 when no batch padded anything (every batch of one
        is), lower the more of the model's work went on padding; None without token counts."""
        return self.useful_tokens / self.padded_tokens if self.padded_tokens > 0 else None

    def report(self) -> BatchSummary:
        mean, efficiency = self.mean_batch, self.padding_efficiency
        return BatchSummary(
            batches=int(self.batches),
            items=int(self.items),
            mean_batch=None if mean is None else round(mean, 2),
            useful_tokens=int(self.useful_tokens),
            padded_tokens=int(self.padded_tokens),
            padding_efficiency=None if efficiency is None else round(efficiency, 4),
            closed_by={r: int(n) for r, n in sorted(self.reasons.items())},
        )

    def summary(self) -> dict[str, Any]:
        """:meth:`report` as JSON data, for the suites that keep their rows as dicts."""
        found: dict[str, Any] = to_json(self.report())
        return found


def parse_sidecar_metrics(text: str) -> BatchCounters:
    """Batch counters from the sidecar's Prometheus exposition (summed over label sets)."""
    batches = items = 0.0
    reasons: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == names.BATCH_SIZE + "_count":
                batches += sample.value
            elif sample.name == names.BATCH_SIZE + "_sum":
                items += sample.value
            elif sample.name == names.BATCHES:
                reason = sample.labels.get("reason", "")
                reasons[reason] = reasons.get(reason, 0.0) + sample.value
    return BatchCounters(batches, items, reasons)


def parse_model_stats(stats: dict[str, Any]) -> BatchCounters:
    """Batch counters from the demo model's ``GET /v1/stats`` (a model too old to count tokens:
    0 tokens, so no padding efficiency)."""
    return BatchCounters(
        float(stats["batches"]),
        float(stats["items"]),
        useful_tokens=float(stats.get("useful_tokens", 0)),
        padded_tokens=float(stats.get("padded_tokens", 0)),
    )


async def scrape(http: aiohttp.ClientSession, url: str) -> BatchCounters:
    """Read counters from ``url``: the demo model's /v1/stats (JSON) or Prometheus text."""
    async with http.get(url) as resp:
        resp.raise_for_status()
        if resp.content_type == "application/json":
            return parse_model_stats(await resp.json())
        return parse_sidecar_metrics(await resp.text())


class Watch:
    """Counters at ``url`` over a stretch of time: ``async with Watch(url) as w: ...; w.delta``."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.delta: BatchCounters | None = None
        self._http: aiohttp.ClientSession | None = None
        self._before = BatchCounters()

    async def __aenter__(self) -> Watch:
        if self.url is not None:
            self._http = aiohttp.ClientSession()
            self._before = await scrape(self._http, self.url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is None or self.url is None:
            return
        try:
            if exc[0] is None:
                self.delta = await scrape(self._http, self.url) - self._before
        finally:
            await self._http.close()

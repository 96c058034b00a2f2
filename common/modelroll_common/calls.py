"""Which requests shared a model call: the sidecar says it on every answer, the gateway counts it.

A batch's requests succeed or fail together and share its duration, so a canary analysis takes
the model call, not the request, as its unit of evidence (docs/analysis.md). Each answer carries
the number of requests the model call that decided it held; each request is then 1/n of a call.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

CALL_SIZE_HEADER = "X-Modelroll-Batch-Size"
"""Response header: the requests of the model call that decided this answer (1: no batch)."""

MAX_CALL_SIZE = 1 << 16
"""Larger values read as this: no sidecar batch is near it."""


def call_share(value: str | None) -> float:
    """The share of a model call one answer stands for: 1/n for a valid ``n``, else 1 (an
    answer without the header, or with one that is not a positive integer, is its own call)."""
    if value is None or not value.isdigit():
        return 1.0
    size = int(value)
    return 1.0 if size <= 1 else 1.0 / min(size, MAX_CALL_SIZE)


class SharedHistogram(Collector):
    """A histogram whose observations are shares of a model call (1/n each), not one each: what
    the request histogram counts per request, counted per model call. prometheus_client's
    Histogram only adds whole observations."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = (*buckets, math.inf)
        self._series: dict[tuple[str, ...], SharedSeries] = {}
        registry.register(self)

    def labels(self, *values: str) -> SharedSeries:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = SharedSeries(self.bounds)
        return series

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        """Remove every label set that has ``labels`` (prometheus_client's method of the name)."""
        where = [(self.labelnames.index(name), value) for name, value in labels.items()]
        for values in [v for v in self._series if all(v[i] == want for i, want in where)]:
            del self._series[values]

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in self._series.items():
            family.add_metric(list(values), series.cumulative(), series.sum)
        yield family


class SharedSeries:
    """One label set of a :class:`SharedHistogram`."""

    __slots__ = ("_bounds", "_counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0.0] * len(bounds)
        self.sum = 0.0

    def observe(self, seconds: float, share: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, seconds)] += share
        self.sum += seconds * share

    def cumulative(self) -> list[tuple[str, float]]:
        out = []
        total = 0.0
        for bound, count in zip(self._bounds, self._counts, strict=True):
            total += count
            out.append(("+Inf" if math.isinf(bound) else repr(bound), total))
        return out

"""Prometheus metrics of the operator's canary analyses, served on ``--metrics-port``.

One canary (a ModelVersion with ``spec.analysis``) is one set of series, labelled ``namespace``,
``model`` and ``version`` (the canary's), from its first evaluation until :meth:`forget`. They
show what ``status.analysis`` holds (docs/design.md, "Metrics"):

- the phase as one gauge per phase, 1 for the current one and 0 for the others (as
  kube-state-metrics exports a pod's phase), the step (1-based, as the status counts it), the
  weights the analysis last set (``arm``: ``canary`` or ``baseline``), and an info gauge naming
  the baseline and the reason;
- per check (``check``: its key in ``spec.analysis.checks``), the test statistic Λ, the ratio
  of the bad rates (absent while it is unknown), the verdict (one gauge per verdict, like the
  phase) and the requests and bad requests judged in this step per arm. A step's checks start
  afresh: a check that the state no longer holds (a new step's warm-up) loses its series;
- counters of the decisions the operator made and of the metrics reads that failed, which exist
  at 0 from the canary's first appearance so that ``increase()`` sees the first one.

The series are derived from the canaries' states at each scrape (a prometheus ``Collector``), so
none is left behind when a check or a canary goes. The operator's calls come from its event loop,
the scrapes from the server's thread (:func:`serve`); a lock keeps the two apart.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import statistics
from .phases import Phase
from .state import AnalysisState

PREFIX = "modelroll_operator_analysis_"
PENDING = Phase.PENDING
"""daemon.PENDING: the phase while no analysis can start (no baseline yet)."""
PHASES = tuple(Phase)
VERDICTS = (statistics.PASS, statistics.FAIL, statistics.INCONCLUSIVE)
DECISIONS = ("step", "promote", "rollback", "pause", "hold")
"""What :meth:`AnalysisMetrics.decided` counts: a new step's weights, the promotion, the
rollback, a pause (a step marked ``pause``, a weight changed by hand), a hold."""
ARMS = ("canary", "baseline")
CANARY_LABELS = ("namespace", "model", "version")
CHECK_LABELS = (*CANARY_LABELS, "check")


@dataclass(frozen=True)
class _Canary:
    """What one canary's series show: its last observed state and its counters."""

    model: str
    state: AnalysisState | None = None
    decisions: tuple[tuple[str, int], ...] = tuple((d, 0) for d in DECISIONS)
    read_errors: int = 0


Family = GaugeMetricFamily | CounterMetricFamily
FAMILIES: tuple[tuple[str, type[Family], str, tuple[str, ...]], ...] = (
    (
        "phase",
        GaugeMetricFamily,
        "The analysis's phase (status.analysis.phase): 1 for the current one, 0 for the others",
        (*CANARY_LABELS, "phase"),
    ),
    (
        "info",
        GaugeMetricFamily,
        "Always 1: the baseline version the canary is judged against and the reason for its "
        "phase (status.analysis.reason); replaced when either changes",
        (*CANARY_LABELS, "baseline", "reason"),
    ),
    (
        "step",
        GaugeMetricFamily,
        "The analysis's current step, 1-based (status.analysis.step)",
        CANARY_LABELS,
    ),
    (
        "weight",
        GaugeMetricFamily,
        "The weights the analysis last set: the canary's (canaryWeight) and its baseline's "
        "(baselineStepWeight)",
        (*CANARY_LABELS, "arm"),
    ),
    (
        "statistic",
        GaugeMetricFamily,
        "A check's test statistic in this step (the mixture likelihood ratio): 1 when judging "
        "starts; it fails at 1/alpha, passes at 1 or below",
        CHECK_LABELS,
    ),
    (
        "ratio",
        GaugeMetricFamily,
        "A check's canary bad-request rate over the baseline's in this step; no series while "
        "unknown (no request in an arm, no bad baseline request)",
        CHECK_LABELS,
    ),
    (
        "verdict",
        GaugeMetricFamily,
        "A check's verdict: 1 for the current one, 0 for the others",
        (*CHECK_LABELS, "verdict"),
    ),
    (
        "judged_requests",
        GaugeMetricFamily,
        "Requests a check has judged in this step",
        (*CHECK_LABELS, "arm"),
    ),
    (
        "judged_bad_requests",
        GaugeMetricFamily,
        "Bad requests (errors, or slower than the bound) among those a check has judged in this "
        "step",
        (*CHECK_LABELS, "arm"),
    ),
    (
        "decisions",
        CounterMetricFamily,
        "Decisions the analysis made: a step, the promotion, the rollback, a pause, a hold",
        (*CANARY_LABELS, "decision"),
    ),
    (
        "metrics_read_errors",
        CounterMetricFamily,
        "Evaluations whose metrics could not be read (the analysis holds)",
        CANARY_LABELS,
    ),
)
"""Every family: its name after PREFIX, its type, its help and its labels."""


def _families() -> dict[str, Family]:
    """Empty families, one per entry of FAMILIES, by name."""
    return {name: kind(PREFIX + name, doc, labels=labels) for name, kind, doc, labels in FAMILIES}


def _add(families: dict[str, Family], labels: tuple[str, str, str], canary: _Canary) -> None:
    """One canary's samples: its counters always, the rest once it has a state."""
    for decision, count in canary.decisions:
        families["decisions"].add_metric([*labels, decision], count)
    families["metrics_read_errors"].add_metric(labels, canary.read_errors)
    state = canary.state
    if state is None:
        return
    for phase in PHASES:
        families["phase"].add_metric([*labels, phase], 1 if phase == state.phase else 0)
    families["info"].add_metric([*labels, state.baseline, state.reason], 1)
    families["step"].add_metric(labels, state.step + 1)
    families["weight"].add_metric([*labels, "canary"], state.canary_weight)
    families["weight"].add_metric([*labels, "baseline"], state.baseline_step_weight)
    for name, check in state.checks.items():
        at = [*labels, name]
        families["statistic"].add_metric(at, statistics.statistic(check.evidence))
        ratio = check.ratio()
        if ratio is not None and math.isfinite(ratio):
            families["ratio"].add_metric(at, ratio)
        for verdict in dict.fromkeys((*VERDICTS, check.verdict)):
            families["verdict"].add_metric([*at, verdict], 1 if verdict == check.verdict else 0)
        for arm, counts in (
            ("canary", check.evidence.canary),
            ("baseline", check.evidence.baseline),
        ):
            families["judged_requests"].add_metric([*at, arm], counts.requests)
            families["judged_bad_requests"].add_metric([*at, arm], counts.bad)


class AnalysisMetrics(Collector):
    """The analyses' series, derived at each scrape from what the operator told it: it calls
    :meth:`observe` after every evaluation, :meth:`decided` and :meth:`source_error` as they
    happen, :meth:`forget` when a canary or its analysis is gone. A check the state no longer
    holds (a new step's warm-up) has no series, and a forgotten canary none at all."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._canaries: dict[tuple[str, str], _Canary] = {}
        self._lock = threading.Lock()
        """The event loop writes, the metrics server's thread reads."""
        registry.register(self)

    # -- what the operator calls ----------------------------------------------------------------

    def observe(self, namespace: str, model: str, version: str, state: AnalysisState) -> None:
        """Show ``state``, the canary's analysis as just evaluated (or saved)."""
        with self._lock:
            canary = self._canary(namespace, model, version)
            self._canaries[(namespace, version)] = replace(canary, state=state)

    def decided(self, namespace: str, model: str, version: str, decision: str) -> None:
        """Count a decision, one of :data:`DECISIONS` (ValueError for any other)."""
        if decision not in DECISIONS:
            raise ValueError(f"unknown decision {decision!r}: not one of {', '.join(DECISIONS)}")
        with self._lock:
            canary = self._canary(namespace, model, version)
            counts = tuple((d, n + (d == decision)) for d, n in canary.decisions)
            self._canaries[(namespace, version)] = replace(canary, decisions=counts)

    def source_error(self, namespace: str, model: str, version: str) -> None:
        """Count an evaluation whose metrics could not be read."""
        with self._lock:
            canary = self._canary(namespace, model, version)
            self._canaries[(namespace, version)] = replace(
                canary, read_errors=canary.read_errors + 1
            )

    def forget(self, namespace: str, version: str) -> None:
        """Remove every series of the canary (gone, or without an analysis any more)."""
        with self._lock:
            self._canaries.pop((namespace, version), None)

    # -- what the registry calls ----------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        families = _families()
        with self._lock:
            canaries = list(self._canaries.items())
        for (namespace, version), canary in canaries:
            _add(families, (namespace, canary.model, version), canary)
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        yield from _families().values()

    def _canary(self, namespace: str, model: str, version: str) -> _Canary:
        """The canary's record, new (counters at 0, so that ``increase()`` sees the first one)
        when it has none or moved to another model (whose series it then loses)."""
        canary = self._canaries.get((namespace, version))
        if canary is None or canary.model != model:
            canary = self._canaries[(namespace, version)] = _Canary(model)
        return canary


def serve(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> WSGIServer:
    """Serve ``registry`` (and the process's own series: ``process_*``, ``python_*``) at
    ``http://host:port/metrics`` from a daemon thread; OSError when the port is taken. Stop it
    with ``shutdown()`` then ``server_close()``."""
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        with contextlib.suppress(ValueError):  # registered already: served before
            collector(registry=registry)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server

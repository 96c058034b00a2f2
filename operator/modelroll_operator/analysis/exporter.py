"""Prometheus metrics of the operator's canary analyses, served on ``--metrics-port``.

One canary (a ModelVersion with ``spec.analysis``) is one set of series, labelled ``namespace``,
``model`` and ``version`` (the canary's), from its first evaluation until :meth:`forget`. They
show what ``status.analysis`` holds (docs/design.md, "Metrics"):

- the phase as one gauge per phase, 1 for the current one and 0 for the others (as
  kube-state-metrics exports a pod's phase), the step (1-based, as the status counts it), the
  weights the analysis last set (``arm``: ``canary`` or ``baseline``), and an info gauge naming
  the baseline and the reason;
- per check (``check``: ``errors``, ``latency``), the test statistic Λ, the ratio of the bad
  rates (absent while it is unknown), the verdict (one gauge per verdict, like the phase) and the
  requests and bad requests judged in this step per arm. A step's checks start afresh: a check
  that the state no longer holds (a new step's warm-up) loses its series;
- counters of the decisions the operator made and of the metrics reads that failed, which exist
  at 0 from the canary's first appearance so that ``increase()`` sees the first one.

Every method runs in the operator's event loop; the server (:func:`serve`) reads the registry
from its own thread, which prometheus-client's locks allow.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.metrics import MetricWrapperBase

from . import machine, statistics
from .machine import AnalysisState

PREFIX = "modelroll_operator_analysis_"
PENDING = machine.PENDING
"""daemon.PENDING: the phase while no analysis can start (no baseline yet)."""
PHASES = machine.PHASES
VERDICTS = (statistics.PASS, statistics.FAIL, statistics.INCONCLUSIVE)
DECISIONS = ("step", "promote", "rollback", "pause", "hold")
"""What :meth:`AnalysisMetrics.decided` counts: a new step's weights, the promotion, the
rollback, a pause (a step marked ``pause``, a weight changed by hand), a hold."""
ARMS = ("canary", "baseline")
CANARY_LABELS = ("namespace", "model", "version")


@dataclass
class _Canary:
    """The label values one canary's series use now (to replace and remove them)."""

    model: str
    phases: set[str] = field(default_factory=set)
    info: tuple[str, str] | None = None
    """(baseline, reason) of the info series."""
    checks: dict[str, set[str]] = field(default_factory=dict)
    """Each check's verdict values that have a series."""
    ratios: set[str] = field(default_factory=set)
    """Checks whose ratio has a series."""


class AnalysisMetrics:
    """The analyses' series in ``registry``: the operator calls :meth:`observe` after every
    evaluation, :meth:`decided` and :meth:`source_error` as they happen, :meth:`forget` when a
    canary or its analysis is gone."""

    def __init__(self, registry: CollectorRegistry) -> None:
        canary = CANARY_LABELS
        check = (*CANARY_LABELS, "check")
        self.phase = Gauge(
            PREFIX + "phase",
            "The analysis's phase: 1 for the current one, 0 for the others",
            [*canary, "phase"],
            registry=registry,
        )
        self.info = Gauge(
            PREFIX + "info",
            "Always 1: the analysis's baseline version and the reason for its phase",
            [*canary, "baseline", "reason"],
            registry=registry,
        )
        self.step = Gauge(
            PREFIX + "step", "The analysis's current step (1-based)", canary, registry=registry
        )
        self.weight = Gauge(
            PREFIX + "weight",
            "The weights the analysis last set: the canary's and its baseline's",
            [*canary, "arm"],
            registry=registry,
        )
        self.statistic = Gauge(
            PREFIX + "statistic",
            "A check's test statistic (the mixture likelihood ratio): it fails at 1/alpha, "
            "passes at 1 or below",
            check,
            registry=registry,
        )
        self.ratio = Gauge(
            PREFIX + "ratio",
            "A check's canary bad-request rate over the baseline's in this step (absent while "
            "unknown)",
            check,
            registry=registry,
        )
        self.verdict = Gauge(
            PREFIX + "verdict",
            "A check's verdict: 1 for the current one, 0 for the others",
            [*check, "verdict"],
            registry=registry,
        )
        self.judged_requests = Gauge(
            PREFIX + "judged_requests",
            "Requests a check has judged in this step",
            [*check, "arm"],
            registry=registry,
        )
        self.judged_bad_requests = Gauge(
            PREFIX + "judged_bad_requests",
            "Bad requests (errors, or slower than the bound) among those a check has judged in "
            "this step",
            [*check, "arm"],
            registry=registry,
        )
        self.decisions = Counter(
            PREFIX + "decisions",
            "Decisions the analysis made: a step, the promotion, the rollback, a pause, a hold",
            [*canary, "decision"],
            registry=registry,
        )
        self.read_errors = Counter(
            PREFIX + "metrics_read_errors",
            "Evaluations whose metrics could not be read",
            canary,
            registry=registry,
        )
        self._canaries: dict[tuple[str, str], _Canary] = {}

    # -- what the operator calls ----------------------------------------------------------------

    def observe(self, namespace: str, model: str, version: str, state: AnalysisState) -> None:
        """Show ``state``, the canary's analysis as just evaluated (or saved)."""
        seen = self._canary(namespace, model, version)
        labels = (namespace, model, version)
        seen.phases.update(PHASES, (state.phase,))
        for phase in seen.phases:
            self.phase.labels(*labels, phase).set(1 if phase == state.phase else 0)
        info = (state.baseline, state.reason)
        if seen.info != info:
            if seen.info is not None:
                _remove(self.info, (*labels, *seen.info))
            self.info.labels(*labels, *info).set(1)
            seen.info = info
        self.step.labels(*labels).set(state.step + 1)
        self.weight.labels(*labels, "canary").set(state.canary_weight)
        self.weight.labels(*labels, "baseline").set(state.baseline_step_weight)
        for name in set(seen.checks) - set(state.checks):
            self._remove_check(labels, seen, name)
        for name, check in state.checks.items():
            self._observe_check(labels, seen, name, check)

    def decided(self, namespace: str, model: str, version: str, decision: str) -> None:
        """Count a decision, one of :data:`DECISIONS` (ValueError for any other)."""
        if decision not in DECISIONS:
            raise ValueError(f"unknown decision {decision!r}: not one of {', '.join(DECISIONS)}")
        self._canary(namespace, model, version)
        self.decisions.labels(namespace, model, version, decision).inc()

    def source_error(self, namespace: str, model: str, version: str) -> None:
        """Count an evaluation whose metrics could not be read."""
        self._canary(namespace, model, version)
        self.read_errors.labels(namespace, model, version).inc()

    def forget(self, namespace: str, version: str) -> None:
        """Remove every series of the canary (gone, or without an analysis any more)."""
        seen = self._canaries.pop((namespace, version), None)
        if seen is None:
            return
        labels = (namespace, seen.model, version)
        for phase in seen.phases:
            _remove(self.phase, (*labels, phase))
        if seen.info is not None:
            _remove(self.info, (*labels, *seen.info))
        _remove(self.step, labels)
        for arm in ARMS:
            _remove(self.weight, (*labels, arm))
        for name in list(seen.checks):
            self._remove_check(labels, seen, name)
        for decision in DECISIONS:
            _remove(self.decisions, (*labels, decision))
        _remove(self.read_errors, labels)

    # -- the rest -------------------------------------------------------------------------------

    def _canary(self, namespace: str, model: str, version: str) -> _Canary:
        """The canary's record; its counters at 0 when it is new. A canary that moved to
        another model loses the old model's series first."""
        seen = self._canaries.get((namespace, version))
        if seen is not None and seen.model != model:
            self.forget(namespace, version)
            seen = None
        if seen is None:
            seen = self._canaries[(namespace, version)] = _Canary(model)
            for decision in DECISIONS:
                self.decisions.labels(namespace, model, version, decision)
            self.read_errors.labels(namespace, model, version)
        return seen

    def _observe_check(
        self, labels: tuple[str, str, str], seen: _Canary, name: str, check: machine.CheckState
    ) -> None:
        at = (*labels, name)
        self.statistic.labels(*at).set(statistics.statistic(check.evidence))
        ratio = check.ratio()
        if ratio is not None and math.isfinite(ratio):
            self.ratio.labels(*at).set(ratio)
            seen.ratios.add(name)
        elif name in seen.ratios:
            _remove(self.ratio, at)
            seen.ratios.discard(name)
        verdicts = seen.checks.setdefault(name, set())
        verdicts.update(VERDICTS, (check.verdict,))
        for verdict in verdicts:
            self.verdict.labels(*at, verdict).set(1 if verdict == check.verdict else 0)
        arms = (("canary", check.evidence.canary), ("baseline", check.evidence.baseline))
        for arm, counts in arms:
            self.judged_requests.labels(*at, arm).set(counts.requests)
            self.judged_bad_requests.labels(*at, arm).set(counts.bad)

    def _remove_check(self, labels: tuple[str, str, str], seen: _Canary, name: str) -> None:
        at = (*labels, name)
        for verdict in seen.checks.pop(name, ()):
            _remove(self.verdict, (*at, verdict))
        _remove(self.statistic, at)
        _remove(self.ratio, at)
        seen.ratios.discard(name)
        for arm in ARMS:
            _remove(self.judged_requests, (*at, arm))
            _remove(self.judged_bad_requests, (*at, arm))


def _remove(metric: MetricWrapperBase, labelvalues: Iterable[str]) -> None:
    """Remove one series if it exists (older prometheus-client versions raise KeyError)."""
    with contextlib.suppress(KeyError):
        metric.remove(*labelvalues)


def serve(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> WSGIServer:
    """Serve ``registry`` (and the process's own series: ``process_*``, ``python_*``) at
    ``http://host:port/metrics`` from a daemon thread; OSError when the port is taken. Stop it
    with ``shutdown()`` then ``server_close()``."""
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        with contextlib.suppress(ValueError):  # registered already: served before
            collector(registry=registry)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server

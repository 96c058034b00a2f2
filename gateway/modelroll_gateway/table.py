"""The routes in force: per model, its route, its targets and a picker, replaced whole on change.

A request picks a `Target` and keeps it: a later update builds a new `ModelEntry` for the model
and never touches the old one, so a request already in flight finishes where it started.
Per-version counts live outside the entries and survive rebuilds, until the version has been
out of its model's route for ``series_grace`` seconds. Each version has a target for requests
routed by weight and one for those pinned by header, and with a cohort header two more, for
requests routed by their key within its budget and past it; each counts apart (the ``routing``
label), and a canary analysis judges only names.JUDGED_ROUTINGS.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram

from modelroll_common.routes import ModelRoute, VersionRoute, parse_model_route

from .cohorts import CohortPicker, KeyBudget
from .config import DEFAULT_COHORT_KEY_BUDGET, DEFAULT_SERIES_GRACE
from .metrics import (
    COHORT,
    COHORT_OVER_BUDGET,
    PIN,
    PRECREATED_CODES,
    ROUTINGS,
    UNROUTED,
    UPSTREAM_ERROR_REASONS,
    WEIGHT,
    GatewayMetrics,
)
from .shadow import SHADOW_OUTCOMES, Mirror
from .wrr import SmoothWeightedPicker

log = logging.getLogger(__name__)


class VersionStats:
    """Counts and metric children of one (model, version) and routing; shared by every entry
    that routes it."""

    __slots__ = (
        "_calls",
        "_connections",
        "_counters",
        "_metrics",
        "_queued",
        "_waiting",
        "call_duration",
        "codes",
        "duration",
        "model",
        "requests",
        "routing",
        "time_per_output_token",
        "time_to_first_token",
        "version",
    )

    def __init__(self, metrics: GatewayMetrics, model: str, version: str, routing: str) -> None:
        self.model = model
        self.version = version
        self.routing = routing
        self.requests = 0
        self.codes: dict[int, int] = {}
        self._metrics = metrics
        self._counters: dict[int, Counter] = {}
        self._calls: dict[int, Counter] = {}
        for code in PRECREATED_CODES:
            self._counters[int(code)] = metrics.requests.labels(model, version, routing, code)
            self._calls[int(code)] = metrics.calls.labels(model, version, routing, code)
        self.duration: Histogram = metrics.duration.labels(model, version, routing)
        self.call_duration = metrics.call_duration.labels(model, version, routing)
        self.time_to_first_token = metrics.llm_ttft.labels(model, version, routing)
        self.time_per_output_token = metrics.llm_tpot.labels(model, version, routing)
        for reason in UPSTREAM_ERROR_REASONS:  # at 0, so the dashboard shows them all
            metrics.upstream_errors.labels(model, version, reason)
        self._connections = metrics.upstream_connections.labels(model, version)
        self._waiting = metrics.upstream_waiting.labels(model, version)
        self._queued = metrics.upstream_queued.labels(model, version)

    # upstream.Usage: the version's connections, as its endpoint reports them

    def connections(self, count: int) -> None:
        self._connections.set(count)

    def waiting(self, count: int, *, queued: bool = False) -> None:
        self._waiting.set(count)
        if queued:
            self._queued.inc()

    def record(self, code: int, seconds: float, share: float = 1.0) -> None:
        """Count one answered request, ``share`` of the model call that answered it (hot path:
        no label lookups after the first of a code)."""
        self.requests += 1
        self.codes[code] = self.codes.get(code, 0) + 1
        counter = self._counters.get(code)
        if counter is None:
            labels = (self.model, self.version, self.routing, str(code))
            counter = self._counters[code] = self._metrics.requests.labels(*labels)
            self._calls[code] = self._metrics.calls.labels(*labels)
        counter.inc()
        self._calls[code].inc(share)
        self.duration.observe(seconds)
        self.call_duration.observe(seconds, share)


@dataclass(frozen=True, slots=True)
class Target:
    """One version as a request sees it once picked."""

    route: VersionRoute
    url: str
    """Where requests on the batch path go (the sidecar's POST /v1/infer)."""
    stats: VersionStats
    oip_url: str
    """Where Open Inference Protocol requests go (the sidecar's POST /v2/models/{model}/infer)."""

    @property
    def name(self) -> str:
        return self.route.name


@dataclass(slots=True)
class ModelEntry:
    """The routing state of one model, built once per route and never mutated afterwards."""

    route: ModelRoute
    targets: dict[str, Target]
    """By version: the targets of requests routed by weight (the picker's)."""
    pinned: dict[str, Target]
    """By version: the targets of requests pinned to it by header."""
    picker: SmoothWeightedPicker[Target]
    budget: KeyBudget
    """Which requests routed by a cohort key are judged (shared by every model)."""
    cohorts: CohortPicker[tuple[Target, Target]] | None = None
    """With the route's cohort header: picks by the header's value (sticky cohorts) a version's
    targets for requests within their key's budget and past it."""
    mirrors: tuple[Mirror, ...] = ()
    """The versions that get shadow copies of the model's requests."""

    def pick(self, headers: Mapping[str, str]) -> Target:
        """The version of a request not pinned: its cohort's, when the route names a cohort
        header and the request carries it; else the next in weighted round robin."""
        key = self._key(headers)
        if key is not None and self.cohorts is not None:
            judged, over_budget = self.cohorts.pick(key)
            return judged if self.budget.take(self.route.model, key) else over_budget
        return self.picker.pick()

    def choose(self, headers: Mapping[str, str]) -> Target:
        """The version `pick` would give a request with ``headers``, for a question about the
        model (its metadata) that no analysis judges: no key's budget is spent on it."""
        key = self._key(headers)
        if key is not None and self.cohorts is not None:
            return self.cohorts.pick(key)[0]
        return self.picker.pick()

    def _key(self, headers: Mapping[str, str]) -> str | None:
        """The request's cohort key: its cohort header's value, if the route names one."""
        header = self.route.cohort_header
        return (headers.get(header) or None) if header is not None else None


@dataclass(slots=True)
class _Rejected:
    raw: Any
    error: str


@dataclass
class RouteTable:
    """Every model's entry, plus what was rejected and whether any routes have been read yet."""

    metrics: GatewayMetrics
    source: str = ""
    models: dict[str, ModelEntry] = field(default_factory=dict)
    loaded: bool = False
    key_budget: KeyBudget = field(default_factory=lambda: KeyBudget(DEFAULT_COHORT_KEY_BUDGET))
    series_grace: float = DEFAULT_SERIES_GRACE
    """Seconds a version's series are still exported once it is out of its model's route."""
    _leaving: dict[tuple[str, str], asyncio.TimerHandle] = field(default_factory=dict)
    """By (model, version): the timers that forget a version gone from its route (version
    UNROUTED: a model gone from the routes)."""
    _rejected: dict[str, _Rejected] = field(default_factory=dict)
    _stats: dict[tuple[str, str, str], VersionStats] = field(default_factory=dict)
    _document_error: str | None = None
    _created: dict[str, int] = field(default_factory=dict)
    """When each routed model was first seen (Unix seconds): OpenAI's `created` of its model."""

    def invalid_reason(self, model: str) -> str | None:
        """Why this model's current routes document was rejected, if it was."""
        rejected = self._rejected.get(model)
        return rejected.error if rejected else None

    def apply_data(self, data: Mapping[str, Any] | None) -> None:
        """Make the routes follow a whole ConfigMap's data (None: the ConfigMap does not exist).

        Models whose value is invalid keep their last good route; models absent from `data`
        are removed; unchanged models keep their entry (and their picker's position).
        """
        data = data or {}
        self._document_error = None
        for model in [m for m in self.models if m not in data]:
            self._remove(model)
        for model in [m for m in self._rejected if m not in data]:
            del self._rejected[model]
        for model, raw in data.items():
            try:
                route = parse_model_route(model, raw)
            except ValueError as exc:
                self._reject(model, raw, str(exc))
                continue
            self._rejected.pop(model, None)
            current = self.models.get(model)
            if current is None or current.route != route:
                self._install(route, previous=current)
        self.loaded = True

    def reject_document(self, error: str) -> None:
        """The whole source could not be read as routes: keep everything as it is, and say so."""
        if error != self._document_error:
            self._document_error = error
            self.metrics.routes_invalid.inc()
            log.warning("Rejected the routes document from %s: %s", self.source, error)

    def _reject(self, model: str, raw: Any, error: str) -> None:
        previous = self._rejected.get(model)
        if previous is not None and previous.raw == raw:
            return  # the same bad value seen again (another key changed): counted once
        self._rejected[model] = _Rejected(raw, error)
        self.metrics.routes_invalid.inc()
        kept = "kept its last good route" if model in self.models else "has no routes"
        log.warning("Rejected the routes of model %s (it %s): %s", model, kept, error)

    def _stats_for(self, model: str, version: str, routing: str) -> VersionStats:
        key = (model, version, routing)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = VersionStats(self.metrics, model, version, routing)
        return stats

    def _targets(self, route: ModelRoute, routing: str) -> dict[str, Target]:
        model = route.model
        return {
            v.name: Target(
                v,
                v.infer_url,
                self._stats_for(model, v.name, routing),
                v.open_inference_url(model),
            )
            for v in route.versions
        }

    def _install(self, route: ModelRoute, previous: ModelEntry | None) -> None:
        targets = self._targets(route, WEIGHT)
        picker = SmoothWeightedPicker((t, t.route.weight) for t in targets.values())
        cohorts = None
        if route.cohort_header is not None:
            judged = self._targets(route, COHORT)
            over = self._targets(route, COHORT_OVER_BUDGET)
            cohorts = CohortPicker(
                (t.name, (t, over[t.name]), t.route.weight) for t in judged.values()
            )
        mirrors = tuple(
            Mirror(v.name, v.infer_url, v.shadow, v.open_inference_url(route.model))
            for v in route.versions
            if v.shadow > 0
        )
        for mirror in mirrors:  # at 0 from the start, so the dashboard shows each outcome
            for outcome in SHADOW_OUTCOMES:
                self.metrics.shadow_requests.labels(route.model, mirror.name, outcome)
        self.models[route.model] = ModelEntry(
            route, targets, self._targets(route, PIN), picker, self.key_budget, cohorts, mirrors
        )
        self._created.setdefault(route.model, int(time.time()))
        for name in (UNROUTED, *targets):
            self._stay(route.model, name)
        for v in route.versions:
            self.metrics.weight.labels(route.model, v.name).set(v.weight)
        if previous is not None:
            for name in previous.targets.keys() - targets.keys():
                self.metrics.weight.remove(route.model, name)
                self._leave(route.model, name)
        self.metrics.routes_updates.inc()
        weights = ", ".join(f"{v.name}={v.weight}" for v in route.versions) or "no versions"
        verb = "Updated" if previous is not None else "Added"
        log.info("%s the routes of model %s: %s", verb, route.model, weights)

    def _remove(self, model: str) -> None:
        entry = self.models.pop(model)
        del self._created[model]
        for name in entry.targets:
            self.metrics.weight.remove(model, name)
        for name in (UNROUTED, *entry.targets):
            self._leave(model, name)
        self.metrics.routes_updates.inc()
        log.info("Removed the routes of model %s", model)

    def _leave(self, model: str, version: str) -> None:
        """``version`` is out of ``model``'s route: forget it after ``series_grace`` seconds,
        unless it comes back before (Prometheus has its last counts by then)."""
        if (model, version) not in self._leaving:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(self.series_grace, self._forget, model, version)
            self._leaving[model, version] = timer

    def _stay(self, model: str, version: str) -> None:
        timer = self._leaving.pop((model, version), None)
        if timer is not None:
            timer.cancel()

    def _forget(self, model: str, version: str) -> None:
        del self._leaving[model, version]
        for routing in ROUTINGS:
            self._stats.pop((model, version, routing), None)
        self.metrics.forget(model, version)
        if version != UNROUTED:
            log.info(
                "Stopped exporting the series of version %s of model %s, out of its route for %gs",
                version,
                model,
                self.series_grace,
            )

    def unrouted_counter(self, model: str | None, code: int) -> Counter:
        """The counter for a request no version answered (unknown model, 404, 503, 413)."""
        label = model if model is not None and model in self.models else UNROUTED
        return self.metrics.requests.labels(label, UNROUTED, UNROUTED, str(code))

    def served(self, model: str) -> dict[str, Any] | None:
        """`model` as OpenAI's model object, if a client may call it (a version with weight)."""
        entry = self.models.get(model)
        if entry is None or not entry.picker:
            return None
        created = self._created[model]
        return {"id": model, "object": "model", "created": created, "owned_by": "modelroll"}

    def served_models(self) -> list[dict[str, Any]]:
        """Every model a client may call, by name, as OpenAI's model objects (GET /v1/models)."""
        served = (self.served(model) for model in sorted(self.models))
        return [item for item in served if item is not None]

    def describe(self) -> dict[str, Any]:
        """The routes as the gateway sees them, for GET /v1/routes."""
        models = []
        for name in sorted(self.models.keys() | self._rejected.keys()):
            entry = self.models.get(name)
            versions = []
            total = 0
            if entry is not None:
                total = entry.route.total_weight
                shares = entry.route.shares()
                for v in entry.route.versions:
                    responses: dict[int, int] = {}
                    for routing in ROUTINGS:
                        stats = self._stats.get((name, v.name, routing))
                        for c, n in stats.codes.items() if stats is not None else ():
                            responses[c] = responses.get(c, 0) + n
                    listed: dict[str, Any] = {
                        "name": v.name,
                        "weight": v.weight,
                        "share": round(shares[v.name], 6),
                        "endpoint": v.endpoint,
                        "requests": sum(responses.values()),
                        "responses": {str(c): n for c, n in sorted(responses.items())},
                    }
                    if v.shadow:
                        listed["shadow"] = v.shadow
                    versions.append(listed)
            item: dict[str, Any] = {
                "model": name,
                "routable": total > 0,
                "totalWeight": total,
                "versions": versions,
            }
            if entry is not None and entry.route.cohort_header is not None:
                item["cohortHeader"] = entry.route.cohort_header
            rejected = self._rejected.get(name)
            if rejected is not None:
                item["invalid"] = rejected.error
            models.append(item)
        doc: dict[str, Any] = {"source": self.source, "loaded": self.loaded, "models": models}
        if self._document_error is not None:
            doc["invalid"] = self._document_error
        return doc

"""Where a canary analysis reads its counters: the gateway pods' /metrics, or Prometheus.

By default the operator lists the gateway pods by label selector and reads every Ready pod's
/metrics itself: no Prometheus needed, and no scrape delay. With ``metrics.prometheus.url`` the
same counters come from Prometheus. Either way each source's counters come back apart (a pod's,
``pod/<name>``; in Prometheus, by its ``pod`` label, else its ``instance``): the analysis takes
deltas per source (rollout.count), so a pod that is not read adds nothing instead of looking
like a reset. A reading fails (and the analysis holds) only when no source could be read.

Requests are read by how the gateway chose their version (``routing``): those routed by weight,
and by a cohort key within its budget, are judged (names.JUDGED_ROUTINGS); those pinned by
header, or routed by a key past its budget, are kept apart; a series without the label (a
gateway that does not set it) counts as routed by weight. Stream outcomes are read too
(machine.VersionCounts), and for a spec with a stream check the judged streams' time to first
token and time per output token histograms.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from modelroll_common import metric_names as names

from ..api import UNREACHABLE, Api, KubeApiError, core_path
from ..httproute import HTTPRouteInfo, httproute_path
from ..settings import SIDECAR_PORT
from ..spec import LABEL_MODEL, LABEL_VERSION
from .machine import Snapshot, Split, Tally, VersionCounts
from .spec import MetricsSource

REQUESTS = names.GATEWAY_REQUESTS
BUCKETS = names.GATEWAY_REQUEST_DURATION + "_bucket"
OUTCOMES = names.GATEWAY_LLM_REQUESTS
CALLS = names.GATEWAY_MODEL_CALLS
CALL_BUCKETS = names.GATEWAY_MODEL_CALL_DURATION + "_bucket"
WEIGHT = names.GATEWAY_WEIGHT
AGREEMENT_SUM = names.GATEWAY_SHADOW_AGREEMENT + "_sum"
AGREEMENT_COUNT = names.GATEWAY_SHADOW_AGREEMENT + "_count"
AGREEMENT_FAMILIES = (AGREEMENT_SUM, AGREEMENT_COUNT)
"""Read only for a spec with a shadow gate: the canary's copies compared with the baseline's."""
TTFT_BUCKETS = names.GATEWAY_LLM_TTFT + "_bucket"
TPOT_BUCKETS = names.GATEWAY_LLM_TPOT + "_bucket"
FAMILIES = (REQUESTS, BUCKETS, OUTCOMES, CALLS, CALL_BUCKETS, WEIGHT)
STREAM_FAMILIES = (TTFT_BUCKETS, TPOT_BUCKETS)
"""Read only for a spec with a stream check: every version exports them, at 0 unless it streams."""
JUDGED = f'routing=~"{"|".join(names.JUDGED_ROUTINGS)}|"'
"""The PromQL matcher of the judged requests (``|``: a series without the label too)."""
READ_TIMEOUT_S = 2.0
MAX_METRICS_BYTES = 16 << 20


QUERIES = {
    REQUESTS: ("sum", "routing, code, ", False),
    BUCKETS: ("sum", "le, ", True),
    OUTCOMES: ("sum", "outcome, ", False),
    CALLS: ("sum", "code, ", True),
    CALL_BUCKETS: ("sum", "le, ", True),
    WEIGHT: ("max", "", False),
    AGREEMENT_SUM: ("sum", "primary, ", False),
    AGREEMENT_COUNT: ("sum", "primary, ", False),
    TTFT_BUCKETS: ("sum", "le, ", True),
    TPOT_BUCKETS: ("sum", "le, ", True),
}
"""How Prometheus is asked for each family: the aggregation, the labels kept besides the
version and the source, and whether only the requests routed by weight count."""


class MetricsUnavailable(Exception):
    """The counters could not be read; the message says where and why."""


_K = TypeVar("_K")


def _by_version() -> defaultdict[str, defaultdict[_K, float]]:
    """Counts by version, then by a label's value."""
    return defaultdict(lambda: defaultdict(float))


HISTOGRAMS = (BUCKETS, CALL_BUCKETS, TTFT_BUCKETS, TPOT_BUCKETS)
"""The histograms read of the requests (and streams) routed by weight."""
SIDECAR_FAMILIES = {
    REQUESTS: names.REQUESTS,
    BUCKETS: names.REQUEST_DURATION + "_bucket",
    OUTCOMES: names.LLM_REQUESTS,
    CALLS: names.MODEL_CALLS,
    CALL_BUCKETS: names.MODEL_CALL_DURATION + "_bucket",
    TTFT_BUCKETS: names.LLM_TTFT + "_bucket",
    TPOT_BUCKETS: names.LLM_TPOT + "_bucket",
}
"""For a model routed by an HTTPRoute: the sidecar's family read in place of each gateway
family. The data plane's own metrics are not modelroll's, so the versions' sidecars are the
source: the same requests and model calls, with no weights and no shadow agreement."""


class _Sums:
    """One source's counters, per version: requests by code (routed by weight, and pinned),
    histogram buckets by le, stream outcomes, and the model calls behind the weighted requests
    by code and by le."""

    def __init__(self) -> None:
        self.codes: defaultdict[str, defaultdict[str, float]] = _by_version()
        self.pinned: defaultdict[str, defaultdict[str, float]] = _by_version()
        self.outcomes: defaultdict[str, defaultdict[str, float]] = _by_version()
        self.calls: defaultdict[str, defaultdict[str, float]] = _by_version()
        self.histograms: dict[str, defaultdict[str, defaultdict[float, float]]] = {
            name: _by_version() for name in HISTOGRAMS
        }
        """By family (HISTOGRAMS), by version: cumulative counts by le."""
        self.agreement: defaultdict[tuple[str, str], defaultdict[str, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        """By (shadow version, primary version): the agreement histogram's sum and count."""
        self.weights: dict[str, float] = {}
        """The weight in force for each version, as the gateway reports it."""

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        """Add one sample; a counter that is NaN, infinite or negative is a read error."""
        if not math.isfinite(value) or value < 0:
            raise MetricsUnavailable(f"{name}{dict(labels)} reads {value}, not a count")
        version = labels.get("version", "")
        weighted = labels.get("routing", names.ROUTED_BY_WEIGHT) in names.JUDGED_ROUTINGS
        if name == REQUESTS:
            codes = self.codes if weighted else self.pinned
            codes[version][labels.get("code", "")] += value
        elif name in HISTOGRAMS:
            if weighted:
                self.histograms[name][version][float(labels.get("le", "+Inf"))] += value
        elif name == OUTCOMES:
            self.outcomes[version][labels.get("outcome", "")] += value
        elif name == CALLS and weighted:
            self.calls[version][labels.get("code", "")] += value
        elif name == WEIGHT:
            self.weights[version] = value
        elif name in AGREEMENT_FAMILIES:
            stat = "sum" if name == AGREEMENT_SUM else "count"
            self.agreement[version, labels.get("primary", "")][stat] += value

    def counts(self, version: str) -> VersionCounts:
        def histogram(name: str) -> tuple[tuple[float, float], ...]:
            return _histogram(self.histograms[name].get(version) or {})

        return VersionCounts(
            codes=dict(self.codes.get(version) or {}),
            buckets=histogram(BUCKETS),
            pinned=dict(self.pinned.get(version) or {}),
            outcomes=dict(self.outcomes.get(version) or {}),
            calls=dict(self.calls.get(version) or {}),
            call_buckets=histogram(CALL_BUCKETS),
            ttft_buckets=histogram(TTFT_BUCKETS),
            tpot_buckets=histogram(TPOT_BUCKETS),
        )

    def tally(self, at: float, canary: str, baseline: str) -> Tally:
        compared = dict(self.agreement.get((canary, baseline)) or {})
        canary_counts = replace(self.counts(canary), agreement=compared)
        return Tally(at, canary_counts, self.counts(baseline))

    def split(self, canary: str, baseline: str) -> Split:
        return Split(self.weights.get(canary), self.weights.get(baseline))


def _histogram(buckets: Mapping[float, float]) -> tuple[tuple[float, float], ...]:
    """Buckets by le as a cumulative histogram, ascending, +Inf last."""
    ordered = tuple(sorted(buckets.items()))
    if ordered and not math.isinf(ordered[-1][0]):
        ordered = (*ordered, (math.inf, ordered[-1][1]))
    return ordered


def add_exposition(
    sums: _Sums,
    text: str,
    model: str,
    versions: Iterable[str],
    families: Iterable[str] = FAMILIES,
    series: Mapping[str, str] | None = None,
) -> None:
    """Add one server's /metrics (Prometheus text format): ``families`` of ``versions`` of
    ``model``. ``series`` names the family exported in place of each (the sidecar's); by
    default each family is read under its own name (the gateway's)."""
    wanted = set(versions)
    if series is None:
        read = {f: f for f in families}
    else:
        read = {series[f]: f for f in families if f in series}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (
                    sample.name in read
                    and sample.labels.get("model") == model
                    and sample.labels.get("version") in wanted
                ):
                    sums.add(read[sample.name], sample.labels, sample.value)
    except ValueError as exc:
        raise MetricsUnavailable(f"the /metrics could not be parsed: {exc}") from exc


def source_name(labels: Mapping[str, str]) -> str:
    """The source a Prometheus series belongs to: its gateway pod (the ServiceMonitor's ``pod``
    label), else its scrape target (``instance``)."""
    if pod := labels.get("pod"):
        return f"pod/{pod}"
    return f"instance/{labels.get('instance', '')}"


class MetricsReader:
    """Reads both versions' counters for the analyses of one operator (one HTTP session)."""

    def __init__(self, api: Api, *, gateway_api: bool = False) -> None:
        self.api = api
        self.gateway_api = gateway_api
        """Whether a model may be routed by an HTTPRoute (the operator's --gateway-api)."""
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_S),
                headers={"User-Agent": "modelroll-operator"},
            )
        return self._session

    async def read(
        self,
        source: MetricsSource,
        namespace: str,
        model: str,
        canary: str,
        baseline: str,
        now: float,
        *,
        streams: bool = False,
        agreement: bool = False,
        backends: Mapping[str, str] | None = None,
    ) -> Snapshot:
        """Each source's counters of both versions now, with the stream histograms if
        ``streams``; raises MetricsUnavailable when no source could be read (a source that
        could not be read is left out).

        A model that an HTTPRoute claims is read from its versions' sidecars, and the weights
        in force are the route's once its parents accepted it; ``backends`` names each
        version's backendRef there (default: the version's own name, its Service)."""
        versions = (canary, baseline)
        families = (
            FAMILIES
            + (STREAM_FAMILIES if streams else ())
            + (AGREEMENT_FAMILIES if agreement else ())
        )
        claim = await self._claim(namespace, model) if self.gateway_api else None
        if claim is not None and agreement:
            raise MetricsUnavailable(
                f"model {model} is routed by HTTPRoute {claim.name}, and a Gateway API data "
                "plane sends no shadow copies: spec.analysis.shadow cannot be judged there"
            )
        series = SIDECAR_FAMILIES if claim is not None else None
        if source.prometheus_url:
            found = await self._prometheus(source.prometheus_url, model, versions, families, series)
        else:
            if source.url and claim is None:
                targets = [(source.url, source.url)]
            elif claim is not None:
                targets = await self._sidecar_targets(namespace, model, versions)
            else:
                targets = await self._gateway_targets(source, namespace)
            read = await asyncio.gather(
                *(self._scrape(u, model, versions, families, series) for _, u in targets)
            )
            found = {
                name: sums
                for (name, _), sums in zip(targets, read, strict=True)
                if isinstance(sums, _Sums)
            }
            if not found:
                errors = sorted({str(e) for e in read if isinstance(e, MetricsUnavailable)})
                raise MetricsUnavailable("; ".join(errors))
        if claim is not None:
            split = _route_split(claim, canary, baseline, backends or {})
            splits = {f"httproute/{claim.name}": split}
        else:
            splits = {n: sums.split(canary, baseline) for n, sums in found.items()}
        return Snapshot(
            now, {n: sums.tally(now, canary, baseline) for n, sums in found.items()}, splits
        )

    async def _claim(self, namespace: str, model: str) -> HTTPRouteInfo | None:
        """The HTTPRoute that claims the model, if one (and only one) does."""
        try:
            found = await self.api.send(
                "GET", httproute_path(namespace), params={"labelSelector": f"{LABEL_MODEL}={model}"}
            )
        except (KubeApiError, *UNREACHABLE) as exc:
            raise MetricsUnavailable(f"cannot list the HTTPRoutes: {exc}") from exc
        claims = [HTTPRouteInfo.from_body(r) for r in found.get("items") or []]
        return claims[0] if len(claims) == 1 else None

    async def _sidecar_targets(
        self, namespace: str, model: str, versions: tuple[str, str]
    ) -> list[tuple[str, str]]:
        """The Ready pods of both versions: (``pod/<name>``, its sidecar's /metrics URL) each."""
        selector = f"{LABEL_MODEL}={model},{LABEL_VERSION} in ({','.join(versions)})"
        try:
            pods = await self.api.send(
                "GET", core_path(namespace, "pods"), params={"labelSelector": selector}
            )
        except (KubeApiError, *UNREACHABLE) as exc:
            raise MetricsUnavailable(f"cannot list the versions' pods: {exc}") from exc
        targets = _pod_targets(pods, SIDECAR_PORT)
        if not targets:
            raise MetricsUnavailable(f"no Ready pod in {namespace} matches {selector}")
        return targets

    async def _scrape(
        self,
        url: str,
        model: str,
        versions: tuple[str, str],
        families: tuple[str, ...],
        series: Mapping[str, str] | None,
    ) -> _Sums | MetricsUnavailable:
        """One server's counters, or why they could not be read."""
        sums = _Sums()
        try:
            text = await self._get_text(url)
            add_exposition(sums, text, model, versions, families, series)
        except MetricsUnavailable as exc:
            return exc
        return sums

    async def _gateway_targets(
        self, source: MetricsSource, namespace: str
    ) -> list[tuple[str, str]]:
        """The Ready gateway pods: (``pod/<name>``, its /metrics URL) each."""
        where = source.namespace or namespace
        selector = ",".join(f"{k}={v}" for k, v in sorted(source.selector.items()))
        try:
            pods = await self.api.send(
                "GET", core_path(where, "pods"), params={"labelSelector": selector}
            )
        except (KubeApiError, *UNREACHABLE) as exc:
            raise MetricsUnavailable(f"cannot list the gateway pods: {exc}") from exc
        targets = _pod_targets(pods, source.port)
        if not targets:
            raise MetricsUnavailable(f"no Ready gateway pod in {where} matches {selector}")
        return targets

    async def _get_text(self, url: str) -> str:
        """The whole body at ``url``, however many reads it arrives in, up to the limit."""
        body = bytearray()
        try:
            async with self._client().get(url) as response:
                if response.status != 200:
                    raise MetricsUnavailable(f"{url} answered {response.status}")
                async for chunk in response.content.iter_any():
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        raise MetricsUnavailable(f"{url} is larger than {MAX_METRICS_BYTES} bytes")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise MetricsUnavailable(f"cannot read {url}: {exc or type(exc).__name__}") from exc
        return body.decode("utf-8", "replace")

    async def _prometheus(
        self,
        base: str,
        model: str,
        versions: tuple[str, str],
        families: tuple[str, ...],
        series: Mapping[str, str] | None,
    ) -> dict[str, _Sums]:
        """The counters Prometheus holds, by source (:func:`source_name`); ``series`` as in
        :func:`add_exposition`."""
        match = f'model="{model}",version=~"{"|".join(versions)}"'
        weighted = f"{match},{JUDGED}"
        queries = {}
        for name in families:
            if series is not None and name not in series:
                continue
            aggregation, kept, only_weighted = QUERIES[name]
            selector = weighted if only_weighted else match
            exported = series[name] if series is not None else name
            queries[name] = (
                f"{aggregation} by (version, {kept}pod, instance) ({exported}{{{selector}}})"
            )
        url = base.rstrip("/") + "/api/v1/query"
        found: defaultdict[str, _Sums] = defaultdict(_Sums)
        for name, query in queries.items():
            try:
                async with self._client().get(url, params={"query": query}) as response:
                    doc: Any = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                raise MetricsUnavailable(f"cannot query Prometheus at {base}: {exc}") from exc
            if not isinstance(doc, dict) or doc.get("status") != "success":
                error = doc.get("error") if isinstance(doc, dict) else doc
                raise MetricsUnavailable(f"Prometheus at {base} refused the query: {error}")
            for item in (doc.get("data") or {}).get("result") or []:
                labels = item.get("metric") or {}
                found[source_name(labels)].add(name, labels, float(item["value"][1]))
        return dict(found)


def _pod_targets(pods: Mapping[str, Any], port: int) -> list[tuple[str, str]]:
    """The Ready pods of a list: (``pod/<name>``, its /metrics URL on ``port``) each."""
    return [
        (
            f"pod/{(pod.get('metadata') or {}).get('name', ip)}",
            f"http://{_host(ip)}:{port}/metrics",
        )
        for pod in pods.get("items") or []
        if _ready(pod) and (ip := (pod.get("status") or {}).get("podIP"))
    ]


def _route_split(
    claim: HTTPRouteInfo, canary: str, baseline: str, backends: Mapping[str, str]
) -> Split:
    """The weights the route's data plane splits by: its rule's, once its parents accepted
    the route's current generation; nothing known before."""
    if claim.acceptance().status != "True":
        return Split(None, None)
    weights = {str(ref.get("name")): ref.get("weight", 1) for ref in claim.backend_refs()}

    def weight(version: str) -> float | None:
        found = weights.get(backends.get(version, version))
        return float(found) if isinstance(found, int) else None

    return Split(weight(canary), weight(baseline))


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _ready(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )

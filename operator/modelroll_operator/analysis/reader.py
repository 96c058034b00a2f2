"""Where a canary analysis reads its counters: the gateway pods' /metrics, or Prometheus.

By default the operator lists the gateway pods by label selector and reads every Ready pod's
/metrics itself: no Prometheus needed, and no scrape delay. With ``metrics.prometheus.url`` the
same counters come from Prometheus. Either way each source's counters come back apart (a pod's,
``pod/<name>``; in Prometheus, by its ``pod`` label, else its ``instance``): the analysis takes
deltas per source (rollout.count), so a pod that is not read adds nothing instead of looking
like a reset. A reading fails (and the analysis holds) when no source could be read, or none
had a series of the two versions.

Every place read is one the version may read (analysis/access.py); no redirect is followed, no
answer is read past MAX_ANSWER_BYTES, and what an answer held never reaches a message: a
MetricsUnavailable names the URL and what was wrong with the answer, not its content.

Requests are read by how the gateway chose their version (``routing``): those routed by weight,
and by a cohort key within its budget, are judged (names.JUDGED_ROUTINGS); those pinned by
header, or routed by a key past its budget, are kept apart; a series without the label (a
gateway that does not set it) counts as routed by weight. Stream outcomes are read too
(counts.VersionCounts), and for a spec with a stream check the judged streams' time to first
token and time per output token histograms.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from modelroll_common import metric_names as names

from ..api import UNREACHABLE, Api, KubeApiError, core_path
from ..config import SIDECAR_PORT
from ..httproute import HTTPRoutes
from ..planes import DataPlane, MetricsOrigin, Planes
from ..planes.configmap import ConfigMapKind
from ..planes.httproute import HTTPRouteKind, listed
from ..routes_configmap import RoutesConfigMap
from ..spec import LABEL_MODEL, LABEL_VERSION, BackendRef
from .access import URL_FLAG, ReadAccess, RefusedSource
from .counts import Snapshot, Split, Tally, VersionCounts
from .shapes import MAX_LABEL, MAX_VALUES
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
MAX_ANSWER_BYTES = 16 << 20
"""The most bytes read of one answer (a /metrics, a Prometheus query's): a gateway serving
thousands of models exports a few MiB; a larger answer is a read error, not a reason to grow
the operator."""
FIELD = "spec.analysis.metrics"
SOURCE_LABEL = re.compile(r"[A-Za-z0-9._:\[\]-]{0,253}")
"""What a Prometheus series' ``pod`` or ``instance`` label may hold to name a source in the
status: a pod's name, or a host:port."""


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


class BadAnswer(MetricsUnavailable):
    """An answer that is not what was asked for; the message says what was wrong with it
    ("a body that is not Prometheus text"), never what it held."""


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
            raise BadAnswer(f"a {name} sample that is not a count (NaN, infinite or negative)")
        version = labels.get("version", "")
        weighted = labels.get("routing", names.ROUTED_BY_WEIGHT) in names.JUDGED_ROUTINGS
        if name == REQUESTS:
            codes = self.codes if weighted else self.pinned
            _count(codes[version], _label(name, labels, "code"), value, name)
        elif name in HISTOGRAMS:
            if weighted:
                _count(self.histograms[name][version], _bound(name, labels), value, name)
        elif name == OUTCOMES:
            _count(self.outcomes[version], _label(name, labels, "outcome"), value, name)
        elif name == CALLS and weighted:
            _count(self.calls[version], _label(name, labels, "code"), value, name)
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


def _count(counts: defaultdict[_K, float], key: _K, value: float, name: str) -> None:
    """Add ``value`` to ``counts[key]``; a key past MAX_VALUES is a bad answer."""
    if key not in counts and len(counts) >= MAX_VALUES:
        raise BadAnswer(f"more than {MAX_VALUES} {name} series of one version")
    counts[key] += value


def _label(name: str, labels: Mapping[str, str], label: str) -> str:
    """The value of ``label`` (a status code, an outcome); a longer one than the status holds
    is a bad answer."""
    value = labels.get(label, "")
    if len(value) > MAX_LABEL[label]:
        raise BadAnswer(f"a {name} sample whose {label} is over {MAX_LABEL[label]} characters")
    return value


def _bound(name: str, labels: Mapping[str, str]) -> float:
    """A bucket's upper bound (its ``le``)."""
    try:
        return float(labels.get("le", "+Inf"))
    except ValueError:
        raise BadAnswer(f"a {name} bucket whose le is not a number") from None


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
    default each family is read under its own name (the gateway's). Raises BadAnswer."""
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
    except ValueError:
        raise BadAnswer("a body that is not Prometheus text") from None


def source_name(labels: Mapping[str, str]) -> str:
    """The source a Prometheus series belongs to: its gateway pod (the ServiceMonitor's ``pod``
    label), else its scrape target (``instance``)."""
    if pod := labels.get("pod"):
        return f"pod/{pod}"
    return f"instance/{labels.get('instance', '')}"


class MetricsReader:
    """Reads both versions' counters for the analyses of one operator (one HTTP session)."""

    def __init__(
        self, api: Api, *, gateway_api: bool = False, access: ReadAccess | None = None
    ) -> None:
        self.api = api
        self.gateway_api = gateway_api
        """Whether a model may be routed by an HTTPRoute (the operator's --gateway-api), for a
        read given no plane."""
        self.access = access or ReadAccess()
        """What an analysis may read beyond its version's namespace (the operator's flags)."""
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Bodies as sent, uncompressed: MAX_ANSWER_BYTES bounds what is held, not a
            # compressed size that could inflate past it.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_S),
                headers={"User-Agent": "modelroll-operator", "Accept-Encoding": "identity"},
                auto_decompress=False,
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
        plane: DataPlane | None = None,
    ) -> Snapshot:
        """Each source's counters of both versions now, with the stream histograms if
        ``streams``; raises MetricsUnavailable when no source could be read (a source that
        could not be read is left out), or when ``source`` names a place the version in
        ``namespace`` may not read.

        ``plane`` is the data plane that routes the model (planes/): it says where the counters
        are (the gateway's pods, or the versions' sidecars) and which weights are in force.
        Without one, the reader finds it (:meth:`_plane`), ``backends`` naming each version's
        backendRef in an HTTPRoute (default: the version's own name, its Service)."""
        await self._check(source, namespace)
        versions = (canary, baseline)
        families = (
            FAMILIES
            + (STREAM_FAMILIES if streams else ())
            + (AGREEMENT_FAMILIES if agreement else ())
        )
        if plane is None:
            plane = await self._plane(namespace, model, backends or {})
        if agreement and not plane.shadow_copies:
            raise MetricsUnavailable(
                f"model {model} is routed by {plane.name}, and {plane.data_plane} sends no "
                "shadow copies: spec.analysis.shadow cannot be judged there"
            )
        match plane.metrics:
            case MetricsOrigin.SIDECARS:
                series: Mapping[str, str] | None = SIDECAR_FAMILIES
                scraped = namespace  # the namespace of the pods Prometheus scraped
            case MetricsOrigin.GATEWAY:
                series, scraped = None, source.namespace or namespace
        if source.prometheus_url:
            found = await self._prometheus(
                source.prometheus_url, scraped, model, versions, families, series
            )
        else:
            match plane.metrics:
                case MetricsOrigin.SIDECARS:
                    targets = await self._sidecar_targets(namespace, model, versions)
                case MetricsOrigin.GATEWAY if source.url:
                    targets = [(source.url, source.url)]
                case MetricsOrigin.GATEWAY:
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
        reported = {n: sums.weights for n, sums in found.items()}
        in_force = plane.weights_in_force(reported, versions)
        return Snapshot(
            now,
            {n: sums.tally(now, canary, baseline) for n, sums in found.items()},
            {n: Split(w.get(canary), w.get(baseline)) for n, w in in_force.items()},
        )

    async def _plane(self, namespace: str, model: str, backends: Mapping[str, str]) -> DataPlane:
        """The model's data plane for a reader used without the operator's (which chooses it
        from its watches): the HTTPRoutes that claim the model are listed (only if
        ``gateway_api``), and ``backends`` names each version's backendRef there."""
        kinds = [HTTPRouteKind(listed(self.api), HTTPRoutes(self.api))] if self.gateway_api else []
        planes = Planes([*kinds, ConfigMapKind(RoutesConfigMap(self.api))], SIDECAR_PORT)
        refs = {v: BackendRef(name, "Service") for v, name in backends.items()}
        try:
            return await planes.choose((namespace, model), refs)
        except (KubeApiError, *UNREACHABLE) as exc:
            raise MetricsUnavailable(f"cannot list the HTTPRoutes: {exc}") from exc

    async def _check(self, source: MetricsSource, namespace: str) -> None:
        """Raise MetricsUnavailable unless the version in ``namespace`` may read every place
        ``source`` names (analysis/access.py): before anything is read, so that a refusal
        says nothing of what the place holds."""
        try:
            if source.namespace:
                field = f"{FIELD}.gateway.namespace"
                self.access.check_namespace(field, source.namespace, namespace)
            for field, url in (
                (f"{FIELD}.gateway.url", source.url),
                (f"{FIELD}.prometheus.url", source.prometheus_url),
            ):
                if url and (service := self.access.check_url(field, url, namespace)):
                    await self._check_service(f"{field} {url}", namespace, service)
        except RefusedSource as exc:
            raise MetricsUnavailable(str(exc)) from None

    async def _check_service(self, what: str, namespace: str, service: str) -> None:
        """Raise RefusedSource unless ``namespace`` has a Service ``service`` that is not an
        alias (ExternalName) of a host outside it."""
        try:
            found = await self.api.get(core_path(namespace, "services", service))
        except (KubeApiError, *UNREACHABLE) as exc:
            raise MetricsUnavailable(f"cannot read Service {namespace}/{service}: {exc}") from exc
        if found is None:
            raise RefusedSource(f"{what} names Service {service}, which {namespace} does not hold")
        if (found.get("spec") or {}).get("type") == "ExternalName":
            raise RefusedSource(
                f"{what} names Service {service}, an ExternalName (an alias of a host outside "
                f"the namespace), which the operator does not read; its {URL_FLAG} can allow "
                "the host it names"
            )

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
        except BadAnswer as exc:
            return MetricsUnavailable(f"{url} answered {exc}")
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
        """The body at ``url`` as text (see :meth:`_get`)."""
        return (await self._get(url)).decode("utf-8", "replace")

    async def _get(self, url: str, params: Mapping[str, str] | None = None) -> bytearray:
        """The whole body at ``url``, however many reads it arrives in, up to
        MAX_ANSWER_BYTES; a redirect is not followed. Raises MetricsUnavailable naming the URL
        and what went wrong, never what the answer held."""
        body = bytearray()
        try:
            async with self._client().get(url, params=params, allow_redirects=False) as response:
                if 300 <= response.status < 400:
                    raise MetricsUnavailable(
                        f"{url} answered {response.status}, a redirect, which the operator "
                        "does not follow"
                    )
                if response.status != 200:
                    raise MetricsUnavailable(f"{url} answered {response.status}")
                async for chunk in response.content.iter_any():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise MetricsUnavailable(
                            f"{url} answered more than {MAX_ANSWER_BYTES} bytes"
                        )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise MetricsUnavailable(f"cannot read {url}: {_failure(exc)}") from exc
        return body

    async def _prometheus(
        self,
        base: str,
        namespace: str,
        model: str,
        versions: tuple[str, str],
        families: tuple[str, ...],
        series: Mapping[str, str] | None,
    ) -> dict[str, _Sums]:
        """The counters Prometheus holds of the pods of ``namespace``, by source
        (:func:`source_name`); ``series`` as in :func:`add_exposition`."""
        match = _selector(namespace, model, versions)
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
            answer = await self._get(url, {"query": query})
            try:
                for labels, value in _instant_vector(answer):
                    found[source_name(labels)].add(name, labels, value)
            except BadAnswer as exc:
                raise MetricsUnavailable(f"Prometheus at {base} answered {exc}") from None
        if not found:
            raise MetricsUnavailable(
                f"Prometheus at {base} holds no series of model {model}'s versions "
                f"{' and '.join(versions)} in namespace {namespace}"
            )
        return dict(found)


RE2_SPECIAL = re.compile(r"[\\.+*?()|\[\]{}^$]")
"""The characters with a meaning in an RE2 pattern (Prometheus's ``=~``)."""


def _selector(namespace: str, model: str, versions: Iterable[str]) -> str:
    """The label matchers of the versions' series: exact names, never a pattern a name could
    widen (a version ``v1.0`` does not match ``v1x0``)."""
    pattern = "|".join(RE2_SPECIAL.sub(r"\\\g<0>", v) for v in versions)
    return (
        f"namespace={_promql_string(namespace)},model={_promql_string(model)},"
        f"version=~{_promql_string(pattern)}"
    )


def _promql_string(text: str) -> str:
    """``text`` as a double-quoted PromQL string."""
    return json.dumps(text)


def _instant_vector(answer: bytes | bytearray) -> Iterator[tuple[dict[str, str], float]]:
    """Each series of a Prometheus instant query's answer: its labels and its value. Raises
    BadAnswer when the answer is not one."""
    try:
        doc = json.loads(answer)
    except RecursionError:  # the decoder recurses once per level of nesting
        raise BadAnswer("a body of JSON nested too deep to decode") from None
    except ValueError:
        raise BadAnswer("a body that is not JSON") from None
    data = doc.get("data") if isinstance(doc, dict) and doc.get("status") == "success" else None
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise BadAnswer("a body that is not a query's result")
    for item in result:
        labels = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if not (
            isinstance(labels, dict)
            and all(isinstance(v, str) for v in labels.values())
            and all(SOURCE_LABEL.fullmatch(labels.get(k, "")) for k in ("pod", "instance"))
            and isinstance(value, list)
            and len(value) == 2
            and isinstance(value[1], str)
        ):
            raise BadAnswer("a result that is not an instant vector of the query's series")
        try:
            number = float(value[1])
        except ValueError:
            raise BadAnswer("a sample value that is not a number") from None
        yield labels, number


def _failure(exc: BaseException) -> str:
    """Why a read failed, in the operator's words: the error's kind, and the system's reason for
    a connection that failed, never what the other end sent."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {READ_TIMEOUT_S:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError):
        return exc.strerror or type(exc).__name__
    return type(exc).__name__


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

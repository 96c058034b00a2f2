"""Reading both versions' counters: from gateway /metrics text and from Prometheus, each source
(a gateway pod) apart."""

from __future__ import annotations

import asyncio
import math
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.pytest_plugin import AiohttpServer
from prometheus_client import CollectorRegistry, generate_latest

from modelroll_gateway.metrics import GatewayMetrics
from modelroll_operator.analysis import reader as reader_module
from modelroll_operator.analysis.access import ReadAccess
from modelroll_operator.analysis.counts import Split
from modelroll_operator.analysis.reader import (
    AGREEMENT_FAMILIES,
    FAMILIES,
    STREAM_FAMILIES,
    MetricsReader,
    MetricsUnavailable,
    _Sums,
    add_exposition,
    source_name,
)
from modelroll_operator.analysis.spec import GatewaySource, MetricsSource, PrometheusSource
from modelroll_operator.api import Api
from modelroll_operator.permissions import require
from modelroll_sidecar.metrics import SidecarMetrics
from tests.support.metrics_sites import LOOPBACK, METADATA, SECRET, Site, closing

ONE = """# HELP modelroll_gateway_requests_total Requests.
# TYPE modelroll_gateway_requests_total counter
modelroll_gateway_requests_total{model="m",version="canary",code="200"} 90.0
modelroll_gateway_requests_total{model="m",version="canary",code="422"} 10.0
modelroll_gateway_requests_total{model="m",version="stable",code="200"} 900.0
modelroll_gateway_requests_total{model="other",version="canary",code="200"} 5.0
# TYPE modelroll_gateway_request_duration_seconds histogram
modelroll_gateway_request_duration_seconds_bucket{le="0.01",model="m",version="canary"} 40.0
modelroll_gateway_request_duration_seconds_bucket{le="+Inf",model="m",version="canary"} 100.0
modelroll_gateway_request_duration_seconds_count{model="m",version="canary"} 100.0
modelroll_gateway_request_duration_seconds_sum{model="m",version="canary"} 1.5
"""


def test_one_gateways_counters_and_other_models_ignored() -> None:
    sums = _Sums()
    add_exposition(sums, ONE, "m", ("canary", "stable"))
    tally = sums.tally(1.0, "canary", "stable")
    assert tally.canary.codes == {"200": 90.0, "422": 10.0}
    assert tally.canary.buckets == ((0.01, 40.0), (math.inf, 100.0))
    assert tally.baseline.codes == {"200": 900.0}
    assert tally.baseline.buckets == ()


def test_text_that_is_not_the_exposition_format_is_unavailable() -> None:
    with pytest.raises(MetricsUnavailable, match="a body that is not Prometheus text"):
        add_exposition(_Sums(), 'modelroll_gateway_requests_total{model="m" 1\n', "m", ("a",))


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-3.0"])
def test_a_counter_that_is_no_count_is_a_read_error_not_a_crash(value: str) -> None:
    """A NaN, infinite or negative counter holds the analysis (MetricsUnavailable, said in its
    condition) instead of reaching the judge."""
    broken = ONE.replace('code="422"} 10.0', f'code="422"}} {value}')
    with pytest.raises(MetricsUnavailable, match="not a count"):
        add_exposition(_Sums(), broken, "m", ("canary", "stable"))


def pod(name: str, ip: str, ready: bool = True) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": {"name": name},
        "status": {"phase": "Running", "podIP": ip, "conditions": [condition]},
    }


class Pods:
    """The API server's answer to the gateway pods' list."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = list(pods)

    async def send(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        require(method, path)
        return {"items": self.pods}


def reader(pods: Pods, texts: dict[str, str]) -> MetricsReader:
    """A reader whose gateways answer ``texts`` by pod IP (a missing IP: a timeout)."""
    out = MetricsReader(cast(Api, pods))

    async def get_text(url: str) -> str:
        ip = url.split("//")[1].split(":")[0]
        if ip not in texts:
            raise MetricsUnavailable(f"cannot read {url}: TimeoutError")
        return texts[ip]

    out._get_text = get_text  # type: ignore[method-assign]
    return out


async def test_each_ready_gateway_pod_is_a_source_and_one_unreadable_is_left_out() -> None:
    pods = Pods(pod("gw-a", "10.0.0.1"), pod("gw-b", "10.0.0.2"), pod("gw-c", "10.0.0.3", False))
    texts = {"10.0.0.1": ONE, "10.0.0.3": ONE}
    snapshot = await reader(pods, texts).read(MetricsSource(), "ns", "m", "canary", "stable", 5.0)
    assert set(snapshot.sources) == {"pod/gw-a"}  # b does not answer, c is not Ready
    assert snapshot.sources["pod/gw-a"].canary.codes == {"200": 90.0, "422": 10.0}
    assert snapshot.sources["pod/gw-a"].at == 5.0


async def test_a_reading_fails_only_when_no_gateway_pod_could_be_read() -> None:
    pods = Pods(pod("gw-a", "10.0.0.1"), pod("gw-b", "10.0.0.2"))
    with pytest.raises(MetricsUnavailable, match="TimeoutError"):
        await reader(pods, {}).read(MetricsSource(), "ns", "m", "canary", "stable", 5.0)


WEIGHTS = """# TYPE modelroll_gateway_weight gauge
modelroll_gateway_weight{model="m",version="canary"} 10.0
modelroll_gateway_weight{model="m",version="stable"} 90.0
modelroll_gateway_weight{model="other",version="canary"} 1.0
"""


async def test_each_gateway_says_the_weights_it_routes_by() -> None:
    """gw-b has no route for the two versions (it has not seen them yet): it routes by none."""
    pods = Pods(pod("gw-a", "10.0.0.1"), pod("gw-b", "10.0.0.2"))
    texts = {"10.0.0.1": ONE + WEIGHTS, "10.0.0.2": ONE}
    snapshot = await reader(pods, texts).read(MetricsSource(), "ns", "m", "canary", "stable", 5.0)
    assert snapshot.splits == {"pod/gw-a": Split(10, 90), "pod/gw-b": Split(None, None)}
    assert snapshot.unapplied(10, 90) == ["pod/gw-b routes by none/none"]


class PrometheusAnswers:
    """What a server playing Prometheus answers to instant queries: ``requests`` for the
    requests counter, ``buckets`` for any other query; the queries it got, in order."""

    def __init__(self, requests: list[Any], buckets: list[Any]) -> None:
        self.answers = {"requests_total": requests, "bucket": buckets}
        self.queries: list[str] = []

    async def query(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        self.queries.append(query)
        found = self.answers["requests_total" if "requests_total" in query else "bucket"]
        result = [{"metric": m, "value": [0, str(v)]} for m, v in found]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )


async def prometheus(aiohttp_server: AiohttpServer, answers: PrometheusAnswers) -> str:
    """The base URL of a server that answers instant queries with ``answers``."""
    app = web.Application()
    app.router.add_get("/api/v1/query", answers.query)
    server = await aiohttp_server(app)
    return str(server.make_url("/"))


async def test_prometheus_series_are_kept_apart_by_pod_or_by_instance(
    aiohttp_server: AiohttpServer,
) -> None:
    requests = [
        ({"version": "canary", "code": "200", "pod": "gw-a", "instance": "10.0.0.1:8080"}, 10),
        ({"version": "canary", "code": "200", "pod": "gw-b", "instance": "10.0.0.2:8080"}, 20),
        ({"version": "stable", "code": "200", "instance": "127.0.0.1:9000"}, 7),
    ]
    buckets = [({"version": "canary", "le": "+Inf", "pod": "gw-a"}, 10)]
    answers = PrometheusAnswers(requests, buckets)
    source = MetricsSource(prometheus=PrometheusSource(await prometheus(aiohttp_server, answers)))
    async with closing(MetricsReader(cast(Api, Pods()), access=LOOPBACK)) as out:
        snapshot = await out.read(source, "ns", "m", "canary", "stable", 5.0)
    assert set(snapshot.sources) == {"pod/gw-a", "pod/gw-b", "instance/127.0.0.1:9000"}
    assert snapshot.sources["pod/gw-a"].canary.codes == {"200": 10.0}
    assert snapshot.sources["pod/gw-a"].canary.buckets == ((math.inf, 10.0),)
    assert snapshot.sources["pod/gw-b"].canary.codes == {"200": 20.0}
    assert snapshot.sources["instance/127.0.0.1:9000"].baseline.codes == {"200": 7.0}
    assert all("by (version," in q and "pod, instance)" in q for q in answers.queries)


async def test_prometheus_requests_are_judged_by_how_the_gateway_routed_them(
    aiohttp_server: AiohttpServer,
) -> None:
    """Routed by weight, or by a cohort key within its budget: judged; pinned, or routed by a
    key past its budget: counted apart. The histograms are asked for the judged ones alone."""
    requests = [
        ({"version": "canary", "routing": routing, "code": "500", "pod": "gw"}, n)
        for routing, n in (("weight", 1), ("cohort", 10), ("cohort_over_budget", 30), ("pin", 2))
    ]
    answers = PrometheusAnswers(requests, [])
    source = MetricsSource(prometheus=PrometheusSource(await prometheus(aiohttp_server, answers)))
    async with closing(MetricsReader(cast(Api, Pods()), access=LOOPBACK)) as out:
        snapshot = await out.read(source, "ns", "m", "canary", "stable", 5.0)
    canary = snapshot.sources["pod/gw"].canary
    assert (canary.codes, canary.pinned) == ({"500": 11.0}, {"500": 32.0})
    judged = [q for q in answers.queries if "_bucket" in q or "model_calls_total" in q]
    assert judged
    assert all('routing=~"weight|cohort|"' in q for q in judged)


async def test_an_empty_prometheus_answer_holds_and_says_where(
    aiohttp_server: AiohttpServer,
) -> None:
    """No series at all is no reading (docs/analysis.md): the analysis holds, and the message
    says which Prometheus had nothing, for which namespace."""
    base = await prometheus(aiohttp_server, PrometheusAnswers([], []))
    async with closing(MetricsReader(cast(Api, Pods()), access=LOOPBACK)) as out:
        with pytest.raises(MetricsUnavailable) as held:
            await out.read(
                MetricsSource(prometheus=PrometheusSource(base)),
                "ns",
                "m",
                "canary",
                "stable",
                5.0,
            )
    assert str(held.value) == (
        f"Prometheus at {base} holds no series of model m's versions canary and stable in "
        "namespace ns"
    )


def test_a_series_without_pod_or_instance_is_one_source() -> None:
    assert source_name({"version": "canary"}) == "instance/"
    assert source_name({"pod": "gw-a", "instance": "x"}) == "pod/gw-a"


CALLS = """# TYPE modelroll_gateway_model_calls_total counter
modelroll_gateway_model_calls_total{model="m",version="canary",routing="weight",code="502"} 1.0
modelroll_gateway_model_calls_total{model="m",version="canary",routing="weight",code="200"} 2.5
modelroll_gateway_model_calls_total{model="m",version="canary",routing="pin",code="502"} 7.0
# TYPE modelroll_gateway_model_call_duration_seconds histogram
modelroll_gateway_model_call_duration_seconds_bucket{le="0.01",model="m",version="canary"} 1.25
modelroll_gateway_model_call_duration_seconds_bucket{le="+Inf",model="m",version="canary"} 3.5
"""


def test_the_model_calls_behind_the_weighted_requests_are_read() -> None:
    sums = _Sums()
    add_exposition(sums, CALLS, "m", ("canary", "stable"))
    canary = sums.tally(1.0, "canary", "stable").canary
    assert canary.calls == {"502": 1.0, "200": 2.5}  # the pinned ones are not judged
    # a series without the routing label counts as routed by weight
    assert canary.call_buckets == ((0.01, 1.25), (math.inf, 3.5))


def many_versions(count: int) -> str:
    """A gateway exposition with ``count`` other models' series besides ``ONE``'s: big enough
    to reach the reader in many pieces."""
    lines = [
        f'modelroll_gateway_requests_total{{model="other-{i}",version="v1",code="200"}} {i}.0'
        for i in range(count)
    ]
    return ONE + "\n".join(lines) + "\n"


async def serve_in_pieces(request: web.Request) -> web.StreamResponse:
    """The exposition written 1000 bytes at a time, each flushed before the next."""
    text = request.app[TEXT].encode()
    response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
    await response.prepare(request)
    for at in range(0, len(text), 1000):
        await response.write(text[at : at + 1000])
        await asyncio.sleep(0)
    await response.write_eof()
    return response


TEXT = web.AppKey("text", str)


async def gateway(aiohttp_server: AiohttpServer, text: str) -> str:
    app = web.Application()
    app[TEXT] = text
    app.router.add_get("/metrics", serve_in_pieces)
    server = await aiohttp_server(app)
    return str(server.make_url("/metrics"))


async def test_an_exposition_that_arrives_in_pieces_is_read_whole(
    aiohttp_server: AiohttpServer,
) -> None:
    """A gateway that has served many models answers /metrics in many TCP reads: the reading
    must be the whole text, not its first piece (which ends mid-line and fails to parse)."""
    url = await gateway(aiohttp_server, many_versions(5000))
    async with closing(MetricsReader(cast(Api, Pods()), access=LOOPBACK)) as reading:
        snapshot = await reading.read(
            MetricsSource(GatewaySource(url=url)), "ns", "m", "canary", "stable", 1.0
        )
    (tally,) = snapshot.sources.values()
    assert tally.canary.codes == {"200": 90.0, "422": 10.0}
    assert tally.baseline.codes == {"200": 900.0}


async def test_an_exposition_over_the_limit_is_unavailable(
    aiohttp_server: AiohttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "MAX_ANSWER_BYTES", 50_000)
    url = await gateway(aiohttp_server, many_versions(5000))
    async with closing(MetricsReader(cast(Api, Pods()), access=LOOPBACK)) as reading:
        with pytest.raises(MetricsUnavailable, match="answered more than 50000 bytes"):
            await reading.read(
                MetricsSource(GatewaySource(url=url)), "ns", "m", "canary", "stable", 1.0
            )


def test_the_weighted_streams_histograms_are_read_from_the_gateways_own_metrics() -> None:
    """What the gateway exports for streams, read as the stream checks judge it: the streams it
    routed by weight only, and only when a stream check asks for them."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for routing, first_token in (("weight", 0.02), ("weight", 0.4), ("pin", 0.4)):
        metrics.llm_ttft.labels("m", "canary", routing).observe(first_token)
        metrics.llm_tpot.labels("m", "canary", routing).observe(first_token / 10)
    text = generate_latest(registry).decode()
    plain, streams = _Sums(), _Sums()
    add_exposition(plain, text, "m", ("canary", "stable"))
    add_exposition(streams, text, "m", ("canary", "stable"), FAMILIES + STREAM_FAMILIES)
    assert plain.tally(1.0, "canary", "stable").canary.ttft_buckets == ()
    canary = streams.tally(1.0, "canary", "stable").canary
    ttft = dict(canary.ttft_buckets)
    assert (ttft[0.025], ttft[0.5], ttft[math.inf]) == (1.0, 2.0, 2.0)
    tpot = dict(canary.tpot_buckets)
    assert (tpot[0.0025], tpot[0.05], tpot[math.inf]) == (1.0, 2.0, 2.0)


def test_the_canarys_agreement_with_its_baseline_is_read_from_the_gateways_own_metrics() -> None:
    """Only the copies compared with the baseline's answers count, and only when asked for."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for primary, score in (("stable", 1.0), ("stable", 0.5), ("other", 0.0)):
        metrics.shadow_agreement.labels("m", "canary", primary).observe(score)
    text = generate_latest(registry).decode()
    plain, gated = _Sums(), _Sums()
    add_exposition(plain, text, "m", ("canary", "stable"))
    add_exposition(gated, text, "m", ("canary", "stable"), FAMILIES + AGREEMENT_FAMILIES)
    assert plain.tally(1.0, "canary", "stable").canary.agreement == {}
    canary = gated.tally(1.0, "canary", "stable").canary
    assert canary.agreement == {"sum": 1.5, "count": 2.0}
    assert canary.mean_agreement == 0.75


def sidecar_text(version: str, answers: list[tuple[int, float]]) -> str:
    """What a version's sidecar exports after ``answers`` (status code, seconds)."""
    metrics = SidecarMetrics("m", version, CollectorRegistry())
    for code, seconds in answers:
        metrics.count_request(code, seconds)
    return generate_latest(metrics.registry).decode()


def claiming_route(accepted: str | None, weights: dict[str, int]) -> dict[str, Any]:
    """An HTTPRoute claiming model m, its rule's weights, and its parent's verdict (None: none
    yet) on its current generation."""
    refs = [{"kind": "Service", "name": n, "port": 8000, "weight": w} for n, w in weights.items()]
    parents = []
    if accepted is not None:
        conditions = [
            {"type": kind, "status": accepted, "reason": "R", "observedGeneration": 3}
            for kind in ("Accepted", "ResolvedRefs")
        ]
        parents = [{"parentRef": {"name": "edge"}, "conditions": conditions}]
    return {
        "metadata": {"name": "models", "generation": 3, "labels": {"modelroll.io/model": "m"}},
        "spec": {"rules": [{"name": "m", "backendRefs": refs}]},
        "status": {"parents": parents},
    }


class Namespace:
    """The API server's answers: the HTTPRoutes claiming the model, and the versions' pods."""

    def __init__(self, routes: list[dict[str, Any]], *pods: dict[str, Any]) -> None:
        self.routes, self.pods = routes, list(pods)
        self.selectors: list[str] = []

    async def send(self, method: str, path: str, params: dict[str, str]) -> dict[str, Any]:
        require(method, path, params)
        self.selectors.append(params["labelSelector"])
        return {"items": self.routes if path.endswith("/httproutes") else self.pods}


async def test_a_model_an_httproute_claims_is_read_from_its_versions_sidecars() -> None:
    """The data plane's metrics are not modelroll's: each version's sidecar pod is a source,
    and the weights in force are the route's, known once its parent accepted them."""
    texts = {
        "10.0.1.1": sidecar_text("canary", [(200, 0.02), (500, 0.3)]),
        "10.0.1.2": sidecar_text("stable", [(200, 0.01)] * 9),
    }
    route = claiming_route("True", {"canary": 10, "stable-svc": 90})
    namespace = Namespace([route], pod("canary-0", "10.0.1.1"), pod("stable-0", "10.0.1.2"))
    out = reader(cast(Pods, namespace), texts)
    out.gateway_api = True
    snapshot = await out.read(
        MetricsSource(), "ns", "m", "canary", "stable", 5.0, backends={"stable": "stable-svc"}
    )
    assert namespace.selectors[-1] == "modelroll.io/model=m,modelroll.io/version in (canary,stable)"
    assert snapshot.sources["pod/canary-0"].canary.requests == 2.0
    assert snapshot.sources["pod/canary-0"].canary.codes["500"] == 1.0
    assert dict(snapshot.sources["pod/canary-0"].canary.buckets)[math.inf] == 2.0
    assert snapshot.sources["pod/stable-0"].baseline.requests == 9.0
    assert snapshot.splits == {"httproute/models": Split(10, 90)}
    assert snapshot.unapplied(10, 90) == []

    namespace.routes = [claiming_route(None, {"canary": 10, "stable-svc": 90})]
    pending = await out.read(
        MetricsSource(), "ns", "m", "canary", "stable", 6.0, backends={"stable": "stable-svc"}
    )
    assert pending.unapplied(10, 90) == ["httproute/models routes by none/none"]


async def test_a_shadow_gate_on_a_model_an_httproute_claims_holds_and_says_why() -> None:
    namespace = Namespace([claiming_route("True", {"canary": 0, "stable": 100})])
    out = reader(cast(Pods, namespace), {})
    out.gateway_api = True
    with pytest.raises(MetricsUnavailable, match="sends no shadow copies"):
        await out.read(MetricsSource(), "ns", "m", "canary", "stable", 5.0, agreement=True)


# -- what an analysis may read, and what it says of an answer -----------------------------------


async def unavailable(source: MetricsSource, access: ReadAccess = LOOPBACK, api: Any = None) -> str:
    """The message of the MetricsUnavailable that reading ``source`` raises."""
    async with closing(MetricsReader(cast(Api, api or Pods()), access=access)) as out:
        with pytest.raises(MetricsUnavailable) as held:
            await out.read(source, "prod", "m", "canary", "stable", 1.0)
    return str(held.value)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_an_error_that_names_it_and_is_not_followed(
    aiohttp_server: AiohttpServer, status: int
) -> None:
    """A redirect would take the operator past the rules on what it may read (the URL is
    checked, the Location would not be)."""
    site = Site({"/metrics": status, "/api/v1/query": status})
    base = await site.start(aiohttp_server)
    message = await unavailable(MetricsSource(GatewaySource(url=f"{base}metrics")))
    assert (
        message
        == f"{base}metrics answered {status}, a redirect, which the operator does not follow"
    )
    message = await unavailable(MetricsSource(prometheus=PrometheusSource(base)))
    assert f"{base}api/v1/query answered {status}, a redirect" in message
    assert site.asked == ["/metrics", "/api/v1/query"]


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("metrics", METADATA, "answered a body that is not Prometheus text"),
        ("metrics", "ami-id\nhostname\n", "answered a body that is not Prometheus text"),
        (
            "metrics",
            f'modelroll_gateway_requests_total{{model="m",version="canary"}} {SECRET}\n',
            "answered a body that is not Prometheus text",
        ),
        ("", METADATA, "answered a body that is not a query's result"),
        ("", f'["{SECRET}"]', "answered a body that is not a query's result"),
        (
            "",
            '{"status": "error", "error": "' + SECRET + '"}',
            "answered a body that is not a query's result",
        ),
        ("", f"{SECRET}", "answered a body that is not JSON"),
        (
            "",
            '{"status": "success", "data": {"result": [{"metric": {}, "value": [0, "'
            + SECRET
            + '"]}]}}',
            "answered a sample value that is not a number",
        ),
        (
            "",
            '{"status": "success", "data": {"result": [{"metric": {"pod": "'
            + SECRET
            + ' x"}, "value": [0, "1"]}]}}',
            "answered a result that is not an instant vector of the query's series",
        ),
        ("", "[" * 100_000 + "]" * 100_000, "answered a body of JSON nested too deep to decode"),
        ("", '{"status": "success", "data": []}', "answered a body that is not a query's result"),
        (
            "",
            '{"status": "success", "data": {"result": [{"metric": {"code": [200]}, '
            '"value": [0, "1"]}]}}',
            "answered a result that is not an instant vector of the query's series",
        ),
        (
            "",
            '{"status": "success", "data": {"result": [{"metric": {"le": "high"}, '
            '"value": [0, "1"]}]}}',
            "bucket whose le is not a number",
        ),
    ],
)
async def test_an_answer_that_is_not_metrics_is_described_never_copied(
    aiohttp_server: AiohttpServer, path: str, body: str, said: str
) -> None:
    """The message (status.analysis.message, a Warning event) says what was wrong and where:
    never a byte of what came back."""
    site = Site({"/metrics": body, "/api/v1/query": body})
    base = await site.start(aiohttp_server)
    source = (
        MetricsSource(GatewaySource(url=base + path))
        if path
        else MetricsSource(prometheus=PrometheusSource(base))
    )
    message = await unavailable(source)
    assert said in message
    assert base in message
    assert SECRET not in message


async def test_a_prometheus_answer_over_the_limit_is_unavailable(
    aiohttp_server: AiohttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read whole, one answer per canary per interval could take the operator's memory."""
    monkeypatch.setattr(reader_module, "MAX_ANSWER_BYTES", 50_000)
    series = [({"version": "canary", "code": str(i), "pod": "gw-a"}, i) for i in range(5000)]
    base = await prometheus(aiohttp_server, PrometheusAnswers(series, []))
    message = await unavailable(MetricsSource(prometheus=PrometheusSource(base)))
    assert message == f"{base}api/v1/query answered more than 50000 bytes"


@pytest.mark.parametrize("field", ["gateway.url", "prometheus.url"])
async def test_a_url_outside_the_namespace_is_refused_unless_a_prefix_allows_it(
    aiohttp_server: AiohttpServer, field: str
) -> None:
    """Without the operator's --analysis-url-prefix, an analysis reads only Services of its
    own namespace: the operator never asks the server."""
    site = Site({"/metrics": ONE + WEIGHTS, "/api/v1/query": "{}"})
    base = await site.start(aiohttp_server)
    url = f"{base}metrics" if field == "gateway.url" else base
    source = (
        MetricsSource(GatewaySource(url=url))
        if field == "gateway.url"
        else MetricsSource(prometheus=PrometheusSource(url))
    )
    message = await unavailable(source, access=ReadAccess())
    assert message == (
        f"spec.analysis.metrics.{field} {url} names no Service of namespace prod (write its "
        "host as <service>.prod.svc), and the operator's --analysis-url-prefix allows no prefix "
        "of it"
    )
    assert site.asked == []
    other_port = ReadAccess.of([f"http://127.0.0.1:{int(base.split(':')[2][:-1]) + 1}"])
    assert "names no Service" in await unavailable(source, access=other_port)
    assert site.asked == []


class Namespaces:
    """The API server's answer to a list of pods, by namespace (a namespace not listed: no
    pods); the namespaces listed, in order."""

    def __init__(self, pods: dict[str, list[dict[str, Any]]]) -> None:
        self.pods = pods
        self.listed: list[str] = []

    async def send(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        require(method, path)
        namespace = path.split("/namespaces/")[1].split("/")[0]
        self.listed.append(namespace)
        return {"items": self.pods.get(namespace, [])}


async def test_gateway_pods_of_another_namespace_are_refused_unless_the_operator_allows_it() -> (
    None
):
    """The operator lists pods with its cluster-wide rights: a canary may not make it list
    another namespace's, nor learn from the message whether that namespace has any."""
    source = MetricsSource(GatewaySource(namespace="kube-system"))
    holding = Namespaces({"kube-system": [pod("etcd-0", "10.0.0.9")]})
    empty = Namespaces({})
    refused = await unavailable(source, api=holding)
    assert refused == (
        "spec.analysis.metrics.gateway.namespace kube-system is not this version's namespace "
        "(prod), and the operator's --analysis-gateway-namespace does not list it"
    )
    assert await unavailable(source, api=empty) == refused
    assert holding.listed == empty.listed == []
    allowed = ReadAccess(gateway_namespaces=("kube-system",))
    assert "no Ready gateway pod in kube-system" in await unavailable(source, allowed, empty)
    assert empty.listed == ["kube-system"]


class Services:
    """The API server's answers: a Service by name (a name not listed: 404)."""

    def __init__(self, services: dict[str, dict[str, Any]]) -> None:
        self.services = services

    async def get(self, path: str) -> dict[str, Any] | None:
        require("GET", path)
        assert path.startswith("/api/v1/namespaces/prod/services/"), path
        return self.services.get(path.rsplit("/", 1)[1])


@pytest.mark.parametrize(
    ("name", "said"),
    [
        (
            "alias",
            "names Service alias, an ExternalName (an alias of a host outside the namespace)",
        ),
        ("gone", "names Service gone, which prod does not hold"),
    ],
)
async def test_a_service_url_must_name_a_service_of_the_namespace_that_is_no_alias(
    name: str, said: str
) -> None:
    """An ExternalName Service is a DNS alias of any host (the cloud's metadata service too):
    naming it is as good as naming that host."""
    api = Services({"alias": {"spec": {"type": "ExternalName", "externalName": "example.com"}}})
    url = f"http://{name}.prod.svc:8080/metrics"
    message = await unavailable(MetricsSource(GatewaySource(url=url)), ReadAccess(), api)
    assert message.startswith(f"spec.analysis.metrics.gateway.url {url} {said}")


async def test_a_url_of_a_service_of_the_namespace_is_read() -> None:
    api = Services({"gateway": {"spec": {"type": "ClusterIP"}}})
    async with closing(MetricsReader(cast(Api, api))) as out:
        for url in (
            "http://gateway.prod.svc:8080/metrics",
            "http://gateway.prod.svc.cluster.local/",
        ):
            await out._check(MetricsSource(GatewaySource(url=url)), "prod")
            await out._check(MetricsSource(prometheus=PrometheusSource(url)), "prod")


@pytest.mark.parametrize(
    ("series", "said"),
    [
        (
            [f'code="{400 + i}"' for i in range(101)],
            "more than 100 modelroll_gateway_requests_total series of one version",
        ),
        (['code="2000000000000000000"'], "whose code is over 16 characters"),
    ],
)
def test_counters_the_status_could_not_hold_are_a_bad_answer(series: list[str], said: str) -> None:
    """status.analysis.sources keeps each source's counters within the CRD's bounds: more
    would get every status patch refused, the analysis stuck with no reason given."""
    text = "".join(
        f'modelroll_gateway_requests_total{{model="m",version="canary",{s}}} 1\n' for s in series
    )
    with pytest.raises(MetricsUnavailable, match=said):
        add_exposition(_Sums(), text, "m", ("canary", "stable"))

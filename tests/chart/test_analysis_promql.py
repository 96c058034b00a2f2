"""The canary analysis's Prometheus queries (analysis/reader.py), evaluated by a real Prometheus
that scrapes the gateways of two namespaces whose models and versions have the same names.

One Prometheus for the whole cluster is the usual setup (kube-prometheus-stack), and staging
and production often hold the same model and version names. Each namespace's gateway is served
here as the gateway exports its metrics (modelroll_gateway.metrics), and scraped with the
``namespace`` and ``pod`` labels a ServiceMonitor adds in a cluster: staging's canary fails half
its requests and is split 50/50, production's is healthy at 10/90. An analysis of either
namespace must read its own gateway's counters and weights alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from modelroll_devcluster import MissingBinaryError
from modelroll_devcluster.prometheus import (
    Prometheus,
    PrometheusAPI,
    PrometheusError,
    find_tool,
    static_job,
)
from modelroll_gateway.metrics import GatewayMetrics
from modelroll_operator.analysis import reader
from modelroll_operator.analysis.access import ReadAccess
from modelroll_operator.analysis.counts import Split
from modelroll_operator.analysis.reader import MetricsReader
from modelroll_operator.analysis.spec import MetricsSource, PrometheusSource
from modelroll_operator.api import Api
from modelroll_operator.permissions import require

MODEL = "sentiment"
CANARY, STABLE, LOOKALIKE = "v2.0", "v1.0", "v2x0"
"""The versions of both namespaces; production also has ``v2x0``, which ``v2.0`` matches as an
unescaped regular expression."""


@dataclass(frozen=True)
class Gateway:
    """What one namespace's gateway served: (version, status code, requests), and its weights."""

    pod: str
    served: tuple[tuple[str, int, int], ...]
    weights: dict[str, int]


GATEWAYS = {
    "staging": Gateway(
        "modelroll-gateway-7f9c-a",
        ((CANARY, 200, 50), (CANARY, 500, 50), (STABLE, 200, 100)),
        {CANARY: 50, STABLE: 50},
    ),
    "production": Gateway(
        "modelroll-gateway-5d2b-b",
        ((CANARY, 200, 40), (STABLE, 200, 360), (LOOKALIKE, 500, 30)),
        {CANARY: 10, STABLE: 90, LOOKALIKE: 0},
    ),
}


def exported(gateway: Gateway) -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for version, code, count in gateway.served:
        metrics.requests.labels(MODEL, version, "weight", str(code)).inc(count)
    for version, weight in gateway.weights.items():
        metrics.weight.labels(MODEL, version).set(weight)
    return registry


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping both namespaces' gateways, once it holds both; its URL."""
    try:
        find_tool("prometheus")
    except MissingBinaryError as err:
        pytest.fail(str(err), pytrace=False)
    servers = [start_http_server(0, "127.0.0.1", exported(g))[0] for g in GATEWAYS.values()]
    jobs = [
        static_job(f"gateway-{ns}", [f"127.0.0.1:{s.server_port}"], namespace=ns, pod=g.pod)
        for (ns, g), s in zip(GATEWAYS.items(), servers, strict=True)
    ]
    server = Prometheus(Path(tmp_path_factory.mktemp("prometheus")), jobs)
    try:
        try:
            server.start()
        except PrometheusError as err:
            pytest.fail(str(err), pytrace=False)
        deadline = time.monotonic() + 30
        while set(server.by_label("count by (namespace) (up == 1)", "namespace")) != set(GATEWAYS):
            assert time.monotonic() < deadline, "Prometheus did not scrape both gateways"
            time.sleep(0.2)
        yield server.url
    finally:
        server.stop()
        for s in servers:
            s.shutdown()
            s.server_close()


class NoRoutes:
    """The API server's answers the reader asks for here: no HTTPRoute claims the model."""

    async def send(
        self, method: str, path: str, params: dict[str, str] | None = None
    ) -> dict[str, Any]:
        require(method, path, params)
        return {"items": []}


@pytest.mark.parametrize("namespace", list(GATEWAYS))
async def test_an_analysis_reads_its_own_namespaces_gateway_alone(
    prometheus: str, namespace: str
) -> None:
    """Production's healthy canary is not judged on staging's errors, nor held on staging's
    weights (and the other way round)."""
    gateway = GATEWAYS[namespace]
    out = MetricsReader(cast(Api, NoRoutes()), access=ReadAccess.of([prometheus]))
    try:
        snapshot = await out.read(
            MetricsSource(prometheus=PrometheusSource(prometheus)),
            namespace,
            MODEL,
            CANARY,
            STABLE,
            1.0,
        )
    finally:
        await out.close()
    source = f"pod/{gateway.pod}"
    assert set(snapshot.sources) == {source}
    tally = snapshot.sources[source]
    served = {(v, str(c)): float(n) for v, c, n in gateway.served}
    assert tally.canary.codes == {c: n for (v, c), n in served.items() if v == CANARY}
    assert tally.baseline.codes == {c: n for (v, c), n in served.items() if v == STABLE}
    assert snapshot.splits == {source: Split(gateway.weights[CANARY], gateway.weights[STABLE])}


def test_the_version_matcher_selects_those_versions_and_no_other(prometheus: str) -> None:
    """Version names are matched as text: ``v2.0`` is not a pattern that also matches
    ``v2x0``."""
    selector = reader._selector("production", MODEL, (CANARY, STABLE))
    api = PrometheusAPI(prometheus)
    found = api.by_label(f"count by (version) (modelroll_gateway_weight{{{selector}}})")
    assert found == {CANARY: 1.0, STABLE: 1.0}

"""An HTTPRoute's backend weights, carried out by a real Gateway API data plane: Traefik on the
host sends traffic for one route to two plain Deployments on the local node, 90/10 as the route's
backendRefs say, and reports in the route's status that it accepted the route and resolved its
backends. Each Deployment runs the demo LLM (``modelroll-demo-llm``) under its own
``--served-model-name``, so every answer names the Deployment that gave it.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections import Counter
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.traefik import TraefikGateway
from tests.support.pods import IMAGE
from tests.support.stack import eventually

pytestmark = pytest.mark.node

WEIGHTS = {"stable": 90, "canary": 10}
REQUESTS = 500
TOLERANCE = 0.05
"""How far each backend's share may be from its weight: the Gateway API conformance suite's
tolerance for weighted backends over the same 500 requests (conformance/utils/weight)."""
ROUTE = "split"
PORT = 8080


def backend(name: str) -> list[dict[str, Any]]:
    """A one-replica Deployment of the demo LLM that answers as model ``name``, and its Service."""
    labels = {"app.kubernetes.io/name": name}
    probe = {"httpGet": {"path": "/readyz", "port": PORT}, "periodSeconds": 1}
    container = {
        "name": "llm",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        # 0.0.0.0: Traefik and the kubelet reach it at the pod's IP.
        "command": [
            "modelroll-demo-llm",
            "--host=0.0.0.0",
            f"--port={PORT}",
            f"--served-model-name={name}",
            "--embed-fixed-ms=1",
        ],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": probe,
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "labels": labels},
            "spec": {"selector": labels, "ports": [{"name": "http", "port": PORT}]},
        },
    ]


def http_route(gateway: TraefikGateway) -> dict[str, Any]:
    """The route as a platform team writes it: one rule, the two Services weighted 90/10."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": ROUTE},
        "spec": {
            "parentRefs": [gateway.parent_ref()],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1/"}}],
                    "backendRefs": [
                        {"name": name, "port": PORT, "weight": weight}
                        for name, weight in WEIGHTS.items()
                    ],
                }
            ],
        },
    }


def answered_by(conn: http.client.HTTPConnection) -> str:
    """One embeddings request through Traefik: the model name of the answer ('' if it failed)."""
    body = json.dumps({"input": "which deployment answers"})
    conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        return ""
    model: str = json.loads(data)["model"]
    return model


def apply_all(cluster: Cluster, docs: list[dict[str, Any]], namespace: str) -> None:
    for doc in docs:
        cluster.apply(doc, namespace=namespace)


@pytest.mark.timeout(300)
def test_an_http_route_splits_traffic_by_weight_through_traefik(
    node_cluster: Cluster,
    traefik_gateway: TraefikGateway,
    node_namespace: str,
    figures: Figures,
) -> None:
    namespace = node_namespace
    apply_all(node_cluster, [doc for name in WEIGHTS for doc in backend(name)], namespace)
    node_cluster.kubectl(
        "wait",
        "--for=condition=Available",
        "deployment",
        "--all",
        "--timeout=120s",
        namespace=namespace,
    )
    node_cluster.apply(http_route(traefik_gateway), namespace=namespace)

    conditions = traefik_gateway.wait_route(ROUTE, namespace)
    for kind in ("Accepted", "ResolvedRefs"):
        assert conditions[kind]["status"] == "True", conditions[kind]

    url = urllib.parse.urlsplit(traefik_gateway.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    try:
        # Traefik applies a configuration shortly after it writes the route's status.
        eventually(lambda: answered_by(conn), "an answer through the route", 30)
        counts = Counter(answered_by(conn) for _ in range(REQUESTS))
    finally:
        conn.close()

    shares = {name: counts[name] / REQUESTS for name in WEIGHTS}
    figures.add(
        "gateway api: split over 500 requests through Traefik (weights 90/10)",
        " / ".join(f"{name} {share:.1%}" for name, share in shares.items()),
    )
    assert sum(counts[name] for name in WEIGHTS) == REQUESTS, f"not every answer was 200: {counts}"
    for name, weight in WEIGHTS.items():
        want = weight / sum(WEIGHTS.values())
        assert abs(shares[name] - want) <= TOLERANCE, f"{name}: {shares[name]:.1%}, want {want:.0%}"

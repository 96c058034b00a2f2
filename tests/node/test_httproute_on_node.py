"""A model routed by a Gateway API HTTPRoute on the local node: the chart's operator
(``operator.gatewayAPI``) writes the weights of two managed versions into the route of
examples/gateway-api/, attached to Traefik's Gateway, and Traefik carries them out. The split
holds within the conformance tolerance, a rollback by ``kubectl patch`` stops the canary's
traffic without failing one of the stable's requests, and a canary analysis, reading the
versions' sidecars, rolls a failing canary back through the route.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from modelroll_common.routes import CONFIGMAP_NAME
from modelroll_devcluster import Cluster
from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.traefik import TraefikGateway
from modelroll_devcluster.traffic import Response, Traffic
from tests.support.incluster import EXAMPLES, InCluster
from tests.support.pods import condition
from tests.support.stack import eventually
from tests.support.story import FAST

pytestmark = pytest.mark.node

EXAMPLE = EXAMPLES.parent / "gateway-api" / "httproute.yaml"
ROUTE = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
MODEL = yaml.safe_load(EXAMPLE.read_text())["metadata"]["labels"]["modelroll.io/model"]
REQUESTS = 500
TOLERANCE = 0.05
"""The Gateway API conformance suite's tolerance for weighted backends over 500 requests."""


def version(name: str, weight: int, error_rate: float, **spec: Any) -> dict[str, Any]:
    """A managed version of MODEL: the demo model behind the sidecar, one replica."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "sentiment-canary.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"].update(model=MODEL, weight=weight, replicas=1, **spec)
    args = [a for a in doc["spec"]["server"]["args"] if not a.startswith("--error-rate")]
    doc["spec"]["server"]["args"] = [*args, f"--error-rate={error_rate}"]
    return doc


def http_route(gateway: TraefikGateway) -> dict[str, Any]:
    """examples/gateway-api/'s route, attached to Traefik's Gateway."""
    route: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    route["spec"]["parentRefs"] = [gateway.parent_ref()]
    return route


def weights_in_force(cluster: Cluster, namespace: str, want: dict[str, int]) -> bool:
    """Whether the route's backendRefs say ``want`` and every version is Ready, with the
    route accepted by Traefik for its current generation, as the versions' status says."""
    route = cluster.kubectl_json("get", "httproute", ROUTE, namespace=namespace)
    (rule,) = route["spec"]["rules"]
    written = {ref["name"]: ref["weight"] for ref in rule.get("backendRefs") or []}
    if written != want:
        return False
    for name in want:
        mv = cluster.kubectl_json("get", "mv", name, namespace=namespace)
        if condition(mv, "Ready").get("status") != "True":
            return False
        accepted = condition(mv, "HTTPRouteAccepted")
        if accepted.get("status") != "True" or mv["status"].get("httpRoute") != ROUTE:
            return False
    generation = route["metadata"]["generation"]
    return all(
        c.get("observedGeneration") == generation
        for parent in route.get("status", {}).get("parents", [])
        for c in parent.get("conditions", [])
    )


@pytest.fixture
def routed_model(
    story: InCluster, traefik_gateway: TraefikGateway, node_namespace: str
) -> Iterator[str]:
    """The HTTPRoute claiming MODEL in a namespace of its own; the versions the test applies."""
    story.cluster.apply(http_route(traefik_gateway), namespace=node_namespace)
    yield node_namespace
    story.cluster.kubectl("delete", "mv", "--all", "--wait=false", namespace=node_namespace)


def traffic(gateway: TraefikGateway) -> Traffic:
    """Load through Traefik, about 100 requests a second."""
    return Traffic(gateway.url, MODEL, window=10, rounds_per_second=10.0)


def shares(responses: list[Response]) -> dict[str, float]:
    counts = Counter(r.version for r in responses)
    return {name: n / len(responses) for name, n in counts.items()}


@pytest.mark.timeout(420)
def test_the_weights_split_and_roll_back_through_traefik(
    story: InCluster, traefik_gateway: TraefikGateway, routed_model: str, figures: Figures
) -> None:
    cluster, namespace = story.cluster, routed_model
    for name, weight in (("stable", 90), ("canary", 10)):
        cluster.apply(version(name, weight, 0.0), namespace=namespace)
    eventually(
        lambda: weights_in_force(cluster, namespace, {"canary": 10, "stable": 90}),
        "the operator's 90/10 in the route, accepted by Traefik",
        240,
    )
    # The model is in one data plane only: the modelroll gateway has no route for it.
    if cluster.exists("configmap", CONFIGMAP_NAME, namespace=namespace):
        routes = cluster.kubectl_json("get", "configmap", CONFIGMAP_NAME, namespace=namespace)
        assert MODEL not in routes.get("data", {})

    with traffic(traefik_gateway) as load:
        started = time.monotonic()
        split = load.wait_for(REQUESTS, started, timeout=60)[:REQUESTS]
        assert all(r.status == 200 for r in split), Counter(r.status for r in split)
        got = shares(split)
        figures.add(
            "gateway api: operator's 90/10 over 500 requests through Traefik",
            f"stable {got.get('stable', 0):.1%} / canary {got.get('canary', 0):.1%}",
        )
        assert abs(got.get("stable", 0) - 0.9) <= TOLERANCE, got
        assert abs(got.get("canary", 0) - 0.1) <= TOLERANCE, got

        patched = time.monotonic()
        cluster.kubectl(
            "patch",
            "mv",
            "canary",
            "--type=merge",
            "-p",
            '{"spec":{"weight":0}}',
            namespace=namespace,
        )
        eventually(
            lambda: weights_in_force(cluster, namespace, {"canary": 0, "stable": 90}),
            "the rollback in the route, accepted by Traefik",
            60,
        )

        # In force: a whole 500 requests in a row that only the stable answers.
        def only_stable() -> float | None:
            answered = load.since(patched)
            last_canary = max((r.sent for r in answered if r.version == "canary"), default=None)
            after = [r for r in answered if last_canary is None or r.sent > last_canary]
            if len(after) < REQUESTS:
                return None
            return (last_canary or patched) - patched

        canary_until = eventually(only_stable, "500 requests in a row to the stable only", 60)
    during = load.since(patched)
    failed = Counter((r.version, r.status) for r in during if r.status != 200)
    figures.add(
        "gateway api: kubectl patch to the canary's last request through Traefik",
        f"{canary_until * 1000:.0f} ms ({len(during)} requests since the patch)",
    )
    assert not failed, f"requests failed during the rollback: {failed}"


@pytest.mark.timeout(420)
def test_a_failing_canary_is_rolled_back_through_traefik(
    story: InCluster, traefik_gateway: TraefikGateway, routed_model: str, figures: Figures
) -> None:
    cluster, namespace = story.cluster, routed_model
    analysis = {**FAST, "steps": [{"weight": 30}]}
    # The canary gets its analysis only once both versions are in the route and the traffic
    # runs: applied with it, the analysis would move the canary to its step as soon as it is
    # Ready, and a wait for weight 0 could miss the moment.
    cluster.apply(version("stable", 100, 0.0), namespace=namespace)
    cluster.apply(version("canary", 0, 0.3), namespace=namespace)
    eventually(
        lambda: weights_in_force(cluster, namespace, {"canary": 0, "stable": 100}),
        "both versions in the route, accepted by Traefik",
        240,
    )

    def state() -> dict[str, Any]:
        mv = cluster.kubectl_json("get", "mv", "canary", namespace=namespace)
        found: dict[str, Any] = mv.get("status", {}).get("analysis", {})
        return found

    with traffic(traefik_gateway) as load:
        started = time.monotonic()
        patch = json.dumps({"spec": {"analysis": analysis}})
        cluster.kubectl("patch", "mv", "canary", "--type=merge", "-p", patch, namespace=namespace)
        final = eventually(
            lambda: (s := state()).get("phase") == "RolledBack" and s,
            "the analysis rolling the canary back",
            180,
        )
        eventually(
            lambda: weights_in_force(cluster, namespace, {"canary": 0, "stable": 100}),
            "the rollback in the route, accepted by Traefik",
            60,
        )
    answered = load.since(started)
    by_version = Counter((r.version, r.status) for r in answered)
    figures.add(
        "gateway api: a canary failing 30% of items, judged from its sidecar through Traefik",
        f"{final.get('reason')}: {final.get('message', '')[:160]}",
    )
    assert final.get("reason") == "CanaryWorse", json.dumps(final)[:2000]
    assert by_version[("canary", 200)] > 0, by_version  # the canary did serve at its step
    assert not [k for k in by_version if k[0] == "stable" and k[1] != 200], by_version

"""spec.scaling through the operator, KEDA and kube-controller-manager's real HPA controller: the
operator writes the ScaledObject, KEDA the HPA, and the version's replicas follow its load; while
a share moves, the HPA's minimum is the version's floor. Without an autoscaler the version says
so and keeps serving.

The load is a series the test sets (``autoscaling.in_flight``), scraped by a real Prometheus as
the chart's PodMonitor scrapes the sidecars; pods are reported Ready through their status, as in
the other tests of managed versions (no kubelet runs here).
"""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    Routes,
    StartOperator,
    condition,
    eventually,
    get,
    maybe,
    model_version,
    patch_mv,
    version_pods_ready,
)
from tests.support.autoscaling import Autoscaling
from tests.support.specs import SERVER

pytestmark = pytest.mark.integration

SCALING = {
    "minReplicas": 1,
    "maxReplicas": 4,
    "inFlight": 4,
    "scaleDownStabilizationSeconds": 0,
}


def hpa(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    return maybe(cluster, namespace, "hpa", name)


def settled(cluster: Cluster, namespace: str, name: str, replicas: int) -> bool:
    """The HPA reads its metric and wants ``replicas``, and the version and its Deployment have
    them."""
    autoscaler = hpa(cluster, namespace, name) or {}
    status = autoscaler.get("status") or {}
    active = any(
        c["type"] == "ScalingActive" and c["status"] == "True"
        for c in status.get("conditions") or []
    )
    version = get(cluster, namespace, "mv", name)["spec"]["replicas"]
    deployment = get(cluster, namespace, "deploy", name)["spec"]["replicas"]
    return active and status.get("desiredReplicas") == version == deployment == replicas


@pytest.mark.usefixtures("garbage_collector")
def test_a_version_follows_its_load_through_the_real_hpa(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    routes: Routes,
    autoscaling: Autoscaling,
) -> None:
    start_operator("--autoscaler=keda", f"--prometheus-url={autoscaling.prometheus_url}")
    cluster.apply(
        model_version("scaled", "sentiment", weight=100, server=SERVER, scaling=SCALING),
        namespace,
    )
    eventually(lambda: version_pods_ready(cluster, namespace, "scaled", 1), "a pod")
    eventually(lambda: routes.weights("sentiment") == {"scaled": 100}, "routed")
    applied = eventually(
        lambda: (
            condition(get(cluster, namespace, "mv", "scaled"), "Autoscaling")
            == ("True", "ScaledObjectApplied")
        ),
        "the Autoscaling condition",
    )
    assert applied
    scaled_object = get(cluster, namespace, "scaledobject", "scaled")
    (owner,) = scaled_object["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("ModelVersion", "scaled")
    autoscaler = eventually(lambda: hpa(cluster, namespace, "scaled"), "KEDA's HPA", within=120)
    assert autoscaler["spec"]["scaleTargetRef"]["kind"] == "ModelVersion"
    assert (autoscaler["spec"]["minReplicas"], autoscaler["spec"]["maxReplicas"]) == (1, 4)

    # Offered load: 10 requests in flight for a target of 4 per replica: 3 replicas.
    autoscaling.in_flight.set(namespace, "sentiment", "scaled", [10])
    eventually(lambda: settled(cluster, namespace, "scaled", 3), "scaled to 3", within=90)
    # The load drops: back to the minimum.
    autoscaling.in_flight.set(namespace, "sentiment", "scaled", [1, 0, 0])
    eventually(lambda: settled(cluster, namespace, "scaled", 1), "back to 1", within=90)


@pytest.mark.usefixtures("garbage_collector")
def test_while_a_share_moves_the_hpas_minimum_is_the_versions_floor(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    routes: Routes,
    autoscaling: Autoscaling,
) -> None:
    start_operator("--autoscaler=keda", f"--prometheus-url={autoscaling.prometheus_url}")
    cluster.apply(
        model_version("stable", "sentiment", weight=100, replicas=3, server=SERVER), namespace
    )
    cluster.apply(
        model_version(
            "canary",
            "sentiment",
            weight=0,
            server=SERVER,
            scaling=SCALING,
            scaleDownDelaySeconds=3,
        ),
        namespace,
    )
    eventually(lambda: version_pods_ready(cluster, namespace, "stable", 3), "3 stable pods")
    eventually(lambda: version_pods_ready(cluster, namespace, "canary", 1), "a canary pod")
    eventually(lambda: routes.weights("sentiment") == {"canary": 0, "stable": 100}, "routed")
    eventually(lambda: hpa(cluster, namespace, "canary"), "KEDA's HPA", within=120)

    patch_mv(cluster, namespace, "canary", {"spec": {"weight": 100}})
    patch_mv(cluster, namespace, "stable", {"spec": {"weight": 0}})
    # The canary needs the stable's 3 replicas for all of the traffic: the operator raises its
    # ScaledObject's minimum, and KEDA the HPA's.
    eventually(
        lambda: get(cluster, namespace, "scaledobject", "canary")["spec"]["minReplicaCount"] == 3,
        "the ScaledObject's minimum raised to 3",
    )
    eventually(
        lambda: (hpa(cluster, namespace, "canary") or {}).get("spec", {}).get("minReplicas") == 3,
        "the HPA's minimum raised to 3",
        within=90,
    )
    assert routes.weights("sentiment") == {"canary": 0, "stable": 100}
    eventually(
        lambda: version_pods_ready(cluster, namespace, "canary", 3), "3 canary pods", within=60
    )
    eventually(lambda: routes.weights("sentiment") == {"canary": 100, "stable": 0}, "promoted")
    # 3 s after the move the autoscaler owns the canary's replicas again, from its minimum.
    eventually(
        lambda: (hpa(cluster, namespace, "canary") or {}).get("spec", {}).get("minReplicas") == 1,
        "the HPA's minimum back to 1",
        within=90,
    )


def test_without_an_autoscaler_a_scaled_version_says_so_and_serves(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    cluster.apply(
        model_version("scaled", "sentiment", weight=100, server=SERVER, scaling=SCALING),
        namespace,
    )
    eventually(lambda: version_pods_ready(cluster, namespace, "scaled", 1), "a pod")
    eventually(lambda: routes.weights("sentiment") == {"scaled": 100}, "routed")

    def missing() -> dict[str, Any] | None:
        body = get(cluster, namespace, "mv", "scaled")
        return body if condition(body, "Autoscaling") == ("False", "AutoscalerMissing") else None

    body = eventually(missing, "the Autoscaling condition")
    message = next(c for c in body["status"]["conditions"] if c["type"] == "Autoscaling")
    assert "--autoscaler keda" in message["message"]
    assert condition(body, "Ready") == ("True", "ReplicasReady")

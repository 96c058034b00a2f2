"""A ModelVersion follows its load through the real autoscaling pipeline: a KEDA ScaledObject over
its scale subresource, with a Prometheus trigger on the requests its replicas have in flight,
becomes an HPA; KEDA's metrics adapter serves the metric through the aggregation layer, and
kube-controller-manager's HPA controller sets spec.replicas.

The ScaledObjects are the shape the operator writes for ``spec.scaling``; here the test writes
them, and no operator runs. The versions are external ones whose status (replicas, selector) the
test writes as a managed version's Deployment would report it, so that the scale subresource
answers as it does for a managed version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster import Cluster, MissingBinaryError
from modelroll_devcluster.keda import Keda
from modelroll_devcluster.processes import free_port
from modelroll_operator.spec import API_VERSION, KIND
from tests.support.apiserver import condition, eventually, get, model_version
from tests.support.autoscaling import Autoscaling, in_flight_query

pytestmark = pytest.mark.integration

MODEL = "sentiment"
PER_REPLICA = 4
"""Requests in flight a replica is sized for (the trigger's threshold)."""
SETTLE = 60.0
"""Seconds for a change of load to reach spec.replicas: a scrape (1 s) and an HPA sync (2 s);
the first time, up to 30 s more, until kube-controller-manager's discovery, refreshed every 30 s,
knows the ModelVersion kind."""


def scaled_object(
    name: str, prometheus_url: str, query: str, *, min_replicas: int, max_replicas: int
) -> dict[str, Any]:
    """A ScaledObject over the ModelVersion ``name``'s scale subresource: one Prometheus trigger,
    ``query`` per replica up to :data:`PER_REPLICA`, scale-down after 1 s of lower load."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": name},
            "minReplicaCount": min_replicas,
            "maxReplicaCount": max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 1}}
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": query,
                        "threshold": str(PER_REPLICA),
                    },
                }
            ],
        },
    }


def external_version(cluster: Cluster, namespace: str, name: str, replicas: int) -> None:
    """An external ModelVersion with ``replicas`` and a status that reports them, with the
    selector the scale subresource and the HPA need."""
    manifest = model_version(name, MODEL, endpoint=f"http://{name}:8000", replicas=replicas)
    cluster.apply(manifest, namespace=namespace)
    report_replicas(cluster, namespace, name, replicas)


def report_replicas(cluster: Cluster, namespace: str, name: str, replicas: int) -> None:
    """Write the version's status as its Deployment would once ``replicas`` pods run."""
    status = {"replicas": replicas, "selector": f"modelroll.io/version={name}"}
    cluster.kubectl(
        "patch",
        "mv",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        namespace=namespace,
    )


def hpa_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The one HPA over the version ``name``, as ``kubectl get hpa`` finds it."""
    hpas: list[dict[str, Any]] = [
        item
        for item in cluster.kubectl_json("get", "hpa", namespace=namespace)["items"]
        if item["spec"]["scaleTargetRef"]["name"] == name
    ]
    assert len(hpas) == 1, f"HPAs over {name}: {hpas}"
    return hpas[0]


def hpa_conditions(hpa: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in hpa.get("status", {}).get("conditions", [])}


def settled(cluster: Cluster, namespace: str, name: str, replicas: int) -> dict[str, Any] | None:
    """The HPA once it has read the metric, wants ``replicas``, and the version's spec.replicas
    is that (None before)."""
    hpa = hpa_of(cluster, namespace, name)
    wants = hpa.get("status", {}).get("desiredReplicas")
    active = hpa_conditions(hpa).get("ScalingActive", {}).get("status") == "True"
    spec = get(cluster, namespace, "mv", name)["spec"]["replicas"]
    return hpa if active and wants == replicas and spec == replicas else None


def test_a_version_scales_with_the_requests_in_flight_and_back(
    cluster: Cluster, namespace: str, crd: None, autoscaling: Autoscaling
) -> None:
    external_version(cluster, namespace, "v2", replicas=1)
    query = in_flight_query(namespace, MODEL, "v2")
    cluster.apply(
        scaled_object("v2", autoscaling.prometheus_url, query, min_replicas=1, max_replicas=5),
        namespace=namespace,
    )
    hpa = eventually(lambda: hpa_of(cluster, namespace, "v2"), "KEDA writing the HPA")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": API_VERSION, "kind": KIND, "name": "v2"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 5)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "4"}

    # 11 requests in flight on the one replica: ceil(11 / 4) = 3 replicas.
    autoscaling.in_flight.set(namespace, MODEL, "v2", [11])
    eventually(lambda: settled(cluster, namespace, "v2", 3), "scaling up to 3", within=SETTLE)
    # The new pods run and share the load: the HPA stays at 3.
    report_replicas(cluster, namespace, "v2", 3)
    autoscaling.in_flight.set(namespace, MODEL, "v2", [4, 4, 3])
    hpa = eventually(
        lambda: (
            (h := settled(cluster, namespace, "v2", 3))
            and h["status"]["currentReplicas"] == 3
            and h
        ),
        "the HPA seeing the 3 replicas",
        within=SETTLE,
    )
    (current,) = hpa["status"]["currentMetrics"]
    # 11 in all over 3 replicas: 3.666..., which Kubernetes writes in milli-units.
    assert current["external"]["current"]["averageValue"] == "3667m"

    # The load drops to 2 in all: back to the minimum, 1, once the window of 1 s has passed.
    autoscaling.in_flight.set(namespace, MODEL, "v2", [1, 1, 0])
    eventually(lambda: settled(cluster, namespace, "v2", 1), "scaling down to 1", within=SETTLE)


def test_a_prometheus_that_is_not_there_stops_scaling_and_says_so(
    cluster: Cluster, namespace: str, crd: None, autoscaling: Autoscaling
) -> None:
    external_version(cluster, namespace, "v3", replicas=2)
    nowhere = f"http://127.0.0.1:{free_port()}"
    query = in_flight_query(namespace, MODEL, "v3")
    cluster.apply(
        scaled_object("v3", nowhere, query, min_replicas=1, max_replicas=5), namespace=namespace
    )

    def refused() -> dict[str, Any] | None:
        found = hpa_conditions(hpa_of(cluster, namespace, "v3")).get("ScalingActive")
        return found if found and found["status"] == "False" else None

    active = eventually(refused, "the HPA reporting the failing metric", within=SETTLE)
    assert active["reason"] == "FailedGetExternalMetric"
    assert "s0-prometheus" in active["message"]
    # The HPA has had its turn and changed nothing.
    assert get(cluster, namespace, "mv", "v3")["spec"]["replicas"] == 2
    ready = condition(get(cluster, namespace, "scaledobject", "v3"), "Ready")
    assert ready[0] == "True", ready  # KEDA accepted the ScaledObject; the query is what fails


def test_keda_not_built_names_the_make_target(cluster: Cluster, tmp_path: Path) -> None:
    with pytest.raises(MissingBinaryError, match=r"make keda-bins"):
        Keda(cluster, tmp_path / "keda", bin_dir=tmp_path).start()

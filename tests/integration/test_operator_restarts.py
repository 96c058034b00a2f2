"""Restarts: of the operator (nothing is rewritten) and of the API server (nothing is lost)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    OperatorProcess,
    Routes,
    StartOperator,
    eventually,
    mark_pods_ready,
    model_version,
)

pytestmark = pytest.mark.integration

KINDS = "modelversions,configmaps,deployments,replicasets,services"


def resource_versions(cluster: Cluster, namespace: str) -> dict[str, str]:
    """kind/name -> resourceVersion of everything the operator reads or writes."""
    doc = cluster.kubectl_json("get", KINDS, namespace=namespace)
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
        for o in doc["items"]
        if o["metadata"]["name"] != "kube-root-ca.crt"
    }


def operator_events(cluster: Cluster, namespace: str) -> list[str]:
    doc = cluster.kubectl_json("get", "events", namespace=namespace)
    return [e["metadata"]["name"] for e in doc["items"] if e["source"].get("component") != "kopf"]


def all_routed(cluster: Cluster, namespace: str) -> bool:
    """Every version reports its current generation and is Routed."""
    for body in cluster.kubectl_json("get", "mv", namespace=namespace)["items"]:
        status: dict[str, Any] = body.get("status") or {}
        if status.get("observedGeneration") != body["metadata"]["generation"]:
            return False
        routed = [c for c in status.get("conditions") or [] if c["type"] == "Routed"]
        if not routed or routed[0]["status"] != "True":
            return False
    return True


def alive(operator: OperatorProcess) -> bool:
    with urllib.request.urlopen(operator.liveness, timeout=5) as resp:  # noqa: S310 (loopback)
        return bool(resp.status == 200)


def test_a_restarted_operator_rewrites_nothing(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    first = start_operator()
    cluster.apply(
        model_version("stable-v1", "sentiment", weight=9, endpoint="http://stable:8000"), namespace
    )
    cluster.apply(
        model_version("canary-v2", "sentiment", weight=1, server={"image": "acme/s:1"}), namespace
    )
    cluster.apply(model_version("t1", "translate", weight=2, endpoint="http://t1:8000"), namespace)
    eventually(
        lambda: mark_pods_ready(cluster, namespace, "modelroll.io/version=canary-v2"), "a pod"
    )
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}, "routes")
    eventually(lambda: all_routed(cluster, namespace), "every version reported Routed")
    eventually(
        lambda: (
            cluster.kubectl_json("get", "deploy", "canary-v2", namespace=namespace)["status"].get(
                "availableReplicas"
            )
            == 1
        ),
        "the Deployment's controllers settled",
    )
    before, events = resource_versions(cluster, namespace), operator_events(cluster, namespace)
    first.stop()

    second = start_operator("--log-level=DEBUG")
    for model in ("sentiment", "translate"):
        eventually(
            lambda: second.logged(f"Reconciled model {namespace}/{model} "),  # noqa: B023
            f"the restarted operator's pass over {model}",
        )
    assert resource_versions(cluster, namespace) == before
    assert operator_events(cluster, namespace) == events
    assert second.errors() == []


def test_an_api_server_restart_ends_with_the_same_routes_and_no_errors(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    operator = start_operator()
    cluster.apply(
        model_version("stable-v1", "sentiment", weight=9, endpoint="http://stable:8000"), namespace
    )
    cluster.apply(
        model_version("canary-v2", "sentiment", weight=1, endpoint="http://canary:8000"), namespace
    )
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}, "routes")
    eventually(lambda: all_routed(cluster, namespace), "every version reported Routed")
    before = routes.data()

    cluster.restart_apiserver()
    assert routes.data() == before

    # The operator's watches came back: a change made now is routed.
    def set_weight(name: str, weight: int) -> None:
        cluster.kubectl(
            "patch",
            "mv",
            name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"weight": weight}}),
            namespace=namespace,
        )

    set_weight("canary-v2", 3)
    eventually(
        lambda: routes.weights("sentiment") == {"canary-v2": 3, "stable-v1": 9},
        "a weight change after the restart",
        within=90,
    )
    eventually(lambda: all_routed(cluster, namespace), "statuses caught up", within=60)
    recovered = len(operator.records())

    # Nothing is left failing or retrying: another change goes through without an error.
    set_weight("canary-v2", 1)
    eventually(lambda: routes.data() == before, "the original routes")
    eventually(lambda: all_routed(cluster, namespace), "statuses caught up again")
    assert operator.errors(since=recovered) == []
    assert alive(operator)
    weights = {
        b["metadata"]["name"]: b["status"]["routedWeight"]
        for b in cluster.kubectl_json("get", "mv", namespace=namespace)["items"]
    }
    assert weights == {"canary-v2": 1, "stable-v1": 9}

"""A model claimed by an HTTPRoute: the operator writes its weights into the route's rule, leaves
the user's other rules, filters and parentRefs alone, undoes drift, reports the parents' verdict
on every version, and takes a deleted version's backendRef out; against a real API server with
the Gateway API CRDs (no data plane: the test writes the route's status as a Gateway would)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    OTHER_RULE,
    PARENTS,
    Routes,
    StartOperator,
    conditions,
    eventually,
    httproute,
    mark_pods_ready,
    model_refs,
    model_version,
    route_of,
)
from tests.support.specs import SERVER

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("gateway_api")]


def service_ref(name: str, weight: int, port: int = 8000) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": name, "port": port, "weight": weight}


def condition(cluster: Cluster, namespace: str, version: str, kind: str) -> dict[str, Any]:
    """The version's condition of that type ({} when it has none)."""
    mv = cluster.kubectl_json("get", "mv", version, namespace=namespace)
    return conditions(mv).get(kind, {})


def report(cluster: Cluster, namespace: str, accepted: str, reason: str, message: str) -> None:
    """Write the route's status as its Gateway's controller would."""
    generation = route_of(cluster, namespace)["metadata"]["generation"]
    conditions = [
        {
            "type": kind,
            "status": status,
            "reason": why,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        for kind, status, why in (
            ("Accepted", accepted, reason),
            ("ResolvedRefs", "True", "ResolvedRefs"),
        )
    ]
    status = {
        "parents": [
            {
                "parentRef": PARENTS[0],
                "controllerName": "example.com/gateway-controller",
                "conditions": conditions,
            }
        ]
    }
    cluster.kubectl(
        "patch",
        "httproute",
        "models",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        namespace=namespace,
    )


def test_weights_go_into_the_claiming_rule_and_nothing_else_changes(
    cluster: Cluster, namespace: str, routes: Routes, start_operator: StartOperator
) -> None:
    start_operator("--gateway-api")
    cluster.apply(
        model_version(
            "stable",
            "sentiment",
            weight=90,
            endpoint="http://stable:8000",
            backendRef={"name": "stable", "port": 8000},
        ),
        namespace=namespace,
    )
    eventually(lambda: routes.weights("sentiment") == {"stable": 90}, "the ConfigMap routing")
    cluster.apply(httproute("models"), namespace=namespace)
    cluster.apply(
        model_version("canary", "sentiment", weight=10, server=SERVER), namespace=namespace
    )
    # Once the ReplicaSet has made the pod (no kubelet here: the test reports it Ready).
    eventually(lambda: mark_pods_ready(cluster, namespace, "modelroll.io/version=canary"), "a pod")
    # The managed canary's backend is its own Service on the sidecar's port.
    eventually(
        lambda: (
            model_refs(cluster, namespace) == [service_ref("canary", 10), service_ref("stable", 90)]
        ),
        "the weights in the route's rule",
    )
    route = route_of(cluster, namespace)
    assert route["spec"]["rules"][0] == OTHER_RULE
    assert route["spec"]["parentRefs"] == PARENTS
    assert route["spec"]["hostnames"] == ["models.example.com"]
    assert (
        route["spec"]["rules"][1]["filters"] == httproute("models")["spec"]["rules"][1]["filters"]
    )
    # The model is in one data plane only: its ConfigMap key is gone.
    eventually(lambda: routes.weights("sentiment") is None, "the model leaving the ConfigMap")
    mv = cluster.kubectl_json("get", "mv", "stable", namespace=namespace)
    assert mv["status"]["httpRoute"] == "models"
    assert mv["status"]["routedWeight"] == 90
    pending = condition(cluster, namespace, "stable", "HTTPRouteAccepted")
    assert (pending["status"], pending["reason"]) == ("Unknown", "Pending")

    # A promotion is a weight patch: the rule follows exactly, once the canary has the
    # replicas its new share needs (scale before shift: its one replica carried half of the
    # traffic between the two patches, so 90% needs two).
    cluster.kubectl(
        "patch", "mv", "canary", "--type=merge", "-p", '{"spec":{"weight":90}}', namespace=namespace
    )
    cluster.kubectl(
        "patch", "mv", "stable", "--type=merge", "-p", '{"spec":{"weight":10}}', namespace=namespace
    )
    eventually(
        lambda: mark_pods_ready(cluster, namespace, "modelroll.io/version=canary") >= 2,
        "the canary's second pod",
    )
    eventually(
        lambda: (
            model_refs(cluster, namespace) == [service_ref("canary", 90), service_ref("stable", 10)]
        ),
        "the promoted weights",
    )

    # Drift: someone sends everything to the stable by hand; the operator writes it back.
    index = 1
    cluster.kubectl(
        "patch",
        "httproute",
        "models",
        "--type=json",
        "-p",
        json.dumps(
            [
                {
                    "op": "replace",
                    "path": f"/spec/rules/{index}/backendRefs",
                    "value": [service_ref("stable", 1)],
                }
            ]
        ),
        namespace=namespace,
    )
    eventually(
        lambda: (
            model_refs(cluster, namespace) == [service_ref("canary", 90), service_ref("stable", 10)]
        ),
        "the hand edit undone",
    )
    assert route_of(cluster, namespace)["spec"]["rules"][0] == OTHER_RULE

    # A deleted version's backendRef goes before the version does.
    cluster.kubectl("delete", "mv", "canary", "--wait=true", namespace=namespace)
    assert model_refs(cluster, namespace) == [service_ref("stable", 10)]


def test_the_parents_verdict_and_a_refused_route_are_on_every_version(
    cluster: Cluster, namespace: str, routes: Routes, start_operator: StartOperator
) -> None:
    start_operator("--gateway-api")
    cluster.apply(httproute("models"), namespace=namespace)
    for name, weight in (("stable", 90), ("canary", 10)):
        cluster.apply(
            model_version(
                name,
                "sentiment",
                weight=weight,
                endpoint=f"http://{name}:8000",
                backendRef={"name": name, "port": 8000},
            ),
            namespace=namespace,
        )
    eventually(lambda: len(model_refs(cluster, namespace)) == 2, "both versions in the route")

    report(
        cluster, namespace, "False", "NotAllowedByListeners", "no listener allows this namespace"
    )
    for version in ("stable", "canary"):

        def refused(v: str = version) -> dict[str, Any] | None:
            found = condition(cluster, namespace, v, "HTTPRouteAccepted")
            return found if found.get("status") == "False" else None

        verdict = eventually(refused, f"the refusal on {version}")
        assert verdict["reason"] == "NotAccepted"
        assert "Gateway edge refuses HTTPRoute models: NotAllowedByListeners" in verdict["message"]
    report(cluster, namespace, "True", "Accepted", "")
    eventually(
        lambda: all(
            condition(cluster, namespace, v, "HTTPRouteAccepted").get("status") == "True"
            for v in ("stable", "canary")
        ),
        "the acceptance on both versions",
    )

    # A second route claiming the model: nothing is written, and every version says why.
    cluster.apply(httproute("other-models"), namespace=namespace)
    for version in ("stable", "canary"):

        def conflict(v: str = version) -> bool:
            message = condition(cluster, namespace, v, "Routed").get("message", "")
            return "HTTPRoutes models, other-models all claim model sentiment" in message

        eventually(conflict, f"the conflict on {version}")
    assert model_refs(cluster, namespace, "other-models") == []
    # With the label gone from both, the model goes back to the routes ConfigMap.
    for name in ("models", "other-models"):
        cluster.kubectl("label", "httproute", name, "modelroll.io/model-", namespace=namespace)
    eventually(
        lambda: routes.weights("sentiment") == {"canary": 10, "stable": 90},
        "the ConfigMap routing again",
    )
    mv = cluster.kubectl_json("get", "mv", "stable", namespace=namespace)
    assert "httpRoute" not in mv["status"]
    assert condition(cluster, namespace, "stable", "HTTPRouteAccepted") == {}

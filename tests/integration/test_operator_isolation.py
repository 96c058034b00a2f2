"""One version, or the routes ConfigMap, failing never freezes a model: the route and the other
versions' statuses go on, the failure is reported where a user looks (the version's conditions
and events), and deletions complete."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    Routes,
    StartOperator,
    condition,
    eventually,
    get,
    mark_pods_ready,
    model_version,
    patch_mv,
    warning_reasons,
)
from tests.support.specs import SERVER

pytestmark = pytest.mark.integration


def conditions(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    body = get(cluster, namespace, "mv", name)
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}


def condition_reason(
    cluster: Cluster, namespace: str, name: str, kind: str, reason: str, within: float = 30.0
) -> dict[str, Any]:
    """The version's ``kind`` condition, once its reason is ``reason``."""
    found: dict[str, Any] = eventually(
        lambda: (
            (c := conditions(cluster, namespace, name).get(kind)) and c["reason"] == reason and c
        ),
        f"{reason} in {name}'s {kind} condition",
        within,
    )
    return found


def caught_up(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The version's body once its status reports on its current generation."""
    body = get(cluster, namespace, "mv", name)
    status = body.get("status") or {}
    return body if status.get("observedGeneration") == body["metadata"]["generation"] else None


def test_a_version_refused_by_a_quota_leaves_its_siblings_and_the_route_working(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "one-deployment"},
            "spec": {"hard": {"count/deployments.apps": "1"}},
        },
        namespace,
    )
    eventually(  # the quota controller has counted what exists: admission enforces it now
        lambda: (
            get(cluster, namespace, "resourcequota", "one-deployment").get("status") or {}
        ).get("used"),
        "the quota's usage",
    )
    operator = start_operator()
    cluster.apply(
        model_version("stable", "sentiment", weight=9, endpoint="http://s:8000"), namespace
    )
    cluster.apply(model_version("old", "sentiment", weight=1, server=SERVER), namespace)
    eventually(lambda: cluster.exists("deploy", "old", namespace=namespace), "old's Deployment")
    eventually(lambda: mark_pods_ready(cluster, namespace, "modelroll.io/version=old"), "pods")
    eventually(lambda: routes.weights("sentiment") == {"stable": 9, "old": 1}, "both routed")

    cluster.apply(model_version("new", "sentiment", weight=1, server=SERVER), namespace)
    ready = condition_reason(cluster, namespace, "new", "Ready", "WorkloadRefused")
    assert ready["status"] == "False"
    assert "exceeded quota: one-deployment" in ready["message"]
    eventually(
        lambda: warning_reasons(cluster, namespace, "new") == ["WorkloadRefused"],
        "one WorkloadRefused warning on new",
    )

    # While new is refused (and retried), its model lives on:
    patch_mv(cluster, namespace, "stable", {"spec": {"weight": 4}})
    eventually(lambda: routes.weights("sentiment") == {"stable": 4, "old": 1}, "the new weight")
    stable = eventually(lambda: caught_up(cluster, namespace, "stable"), "stable's status")
    assert stable["status"]["routedWeight"] == 4
    assert condition(get(cluster, namespace, "mv", "old"), "Routed") == ("True", "Routed")
    cluster.kubectl("delete", "mv", "old", "--timeout=30s", namespace=namespace)
    assert routes.weights("sentiment") == {"stable": 4}

    # Once the quota allows it, new gets its Deployment (a retry, not a restart).
    cluster.kubectl(
        "patch",
        "resourcequota",
        "one-deployment",
        "--type=merge",
        "-p",
        '{"spec": {"hard": {"count/deployments.apps": "2"}}}',
        namespace=namespace,
    )
    eventually(
        lambda: (
            condition(get(cluster, namespace, "mv", "new"), "Ready")
            == ("False", "ReplicasNotReady")
        ),
        "new's Deployment once the quota allows it",
        within=60,
    )
    assert operator.errors() == []


def test_a_configmap_made_immutable_is_replaced_and_routes_move_on(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    operator = start_operator()
    for name in ("a", "b"):
        cluster.apply(model_version(name, "m", weight=1, endpoint=f"http://{name}:8000"), namespace)
    eventually(lambda: routes.weights("m") == {"a": 1, "b": 1}, "the route")
    cluster.kubectl(
        "patch",
        "configmap",
        "modelroll-routes",
        "--type=merge",
        "-p",
        '{"immutable": true}',
        namespace=namespace,
    )

    patch_mv(cluster, namespace, "a", {"spec": {"weight": 3}})
    eventually(lambda: routes.weights("m") == {"a": 3, "b": 1}, "the new weight in force")
    assert not (routes.configmap() or {}).get("immutable")
    a = eventually(lambda: caught_up(cluster, namespace, "a"), "a's status")
    assert a["status"]["routedWeight"] == 3
    assert operator.logged("Replaced ConfigMap")
    assert operator.errors() == []


HUGE = 520
"""Versions whose route entries (2048-byte endpoints, the CRD's longest) add up to more than a
ConfigMap may hold: 520 x about 2090 bytes."""


@pytest.mark.timeout(400)
def test_a_route_over_the_configmap_limit_is_reported_and_never_holds_deletions(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    operator = start_operator()
    cluster.apply(model_version("small-v1", "small", weight=1, endpoint="http://s:8000"), namespace)
    eventually(lambda: routes.weights("small") == {"small-v1": 1}, "the small model's route")
    huge = []
    for i in range(HUGE):
        endpoint = f"http://h{i:03}:8000/".ljust(2048, "p")
        mv = model_version(f"huge-{i:03}", "huge", weight=1, endpoint=endpoint)
        mv["metadata"]["labels"] = {"extra": "yes" if i >= 100 else "no"}
        huge.append(mv)
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": huge}, namespace)

    # The route grew while the versions were being created, until it would no longer fit.
    last = f"huge-{HUGE - 1:03}"
    routed = condition_reason(cluster, namespace, last, "Routed", "RoutesNotWritten", within=240)
    assert routed["status"] == "False"
    assert "over Kubernetes' limit of 1048576 bytes" in routed["message"]
    assert "the gateway does not route it" in routed["message"]
    in_force = routes.weights("huge") or {}
    assert last not in in_force
    assert len(in_force) < HUGE
    first = conditions(cluster, namespace, "huge-000")["Routed"]
    assert first["reason"] == "RoutesNotWritten"
    assert "the gateway still routes it with weight 1" in first["message"]  # the route in force
    assert routes.weights("small") == {"small-v1": 1}
    assert any("Could not route model" in r.get("message", "") for r in operator.errors())

    # A version that is not in the route in force is deleted at once, though the route is stuck.
    cluster.kubectl("delete", "mv", last, "--timeout=30s", namespace=namespace)

    # With fewer versions it fits, and is written.
    cluster.kubectl("delete", "mv", "-l", "extra=yes", "--wait=false", namespace=namespace)
    eventually(lambda: len(routes.weights("huge") or {}) == 100, "the route that fits", within=120)
    eventually(
        lambda: (
            condition(get(cluster, namespace, "mv", "huge-007"), "Routed") == ("True", "Routed")
        ),
        "huge-007 routed",
    )


def test_a_refused_route_write_is_reported_and_statuses_keep_the_weight_in_force(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    """An admission policy refuses the operator's ConfigMap updates: the versions say so, and
    their routed weight stays the one the gateway has."""
    start_operator()
    for name, weight in (("a", 1), ("b", 1)):
        cluster.apply(
            model_version(name, "m", weight=weight, endpoint=f"http://{name}:8000"), namespace
        )
    eventually(lambda: routes.weights("m") == {"a": 1, "b": 1}, "the route")
    eventually(lambda: caught_up(cluster, namespace, "b"), "b's status")
    policy = f"freeze-routes-{namespace}"
    cluster.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["configmaps"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "object.metadata.name != 'modelroll-routes'",
                        "message": "routes are frozen for maintenance",
                    }
                ],
            },
        }
    )
    cluster.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:

        def refused() -> bool:  # the policy is in force once the API server has loaded it
            patch = json.dumps({"metadata": {"annotations": {"probe": "x"}}})
            result = cluster.kubectl(
                "patch",
                "configmap",
                "modelroll-routes",
                "--type=merge",
                "-p",
                patch,
                namespace=namespace,
                check=False,
            )
            return result.returncode != 0

        eventually(refused, "the admission policy in force")
        patch_mv(cluster, namespace, "a", {"spec": {"weight": 3}})
        routed = condition_reason(cluster, namespace, "b", "Routed", "RoutesNotWritten")
        assert "routes are frozen for maintenance" in routed["message"]
        assert routed["message"].endswith("the gateway still routes it with weight 1")
        assert get(cluster, namespace, "mv", "a")["status"]["routedWeight"] == 1  # not 3
        assert routes.weights("m") == {"a": 1, "b": 1}
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", policy, check=False)
        cluster.kubectl("delete", "validatingadmissionpolicy", policy, check=False)
    eventually(lambda: routes.weights("m") == {"a": 3, "b": 1}, "the route once allowed", within=60)
    a = eventually(
        lambda: (
            (body := get(cluster, namespace, "mv", "a"))["status"].get("routedWeight") == 3 and body
        ),
        "a's weight once the route is written",
    )
    assert condition(a, "Routed") == ("True", "Routed")

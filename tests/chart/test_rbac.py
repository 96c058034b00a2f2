"""The service accounts' Roles and ClusterRoles: the gateway reads its routes ConfigMap, the
operator gets exactly what it uses."""

from __future__ import annotations

from tests.chart.conftest import Helm, one
from tests.chart.rendering import rules_of


def test_gateway_may_only_read_its_routes_configmap(helm: Helm) -> None:
    role = one(helm.template(), "Role", "-gateway")
    assert rules_of(role) == {("", "configmaps", v) for v in ("get", "list", "watch")}
    assert role["rules"][0]["resourceNames"] == ["modelroll-routes"]


def test_operator_rbac_covers_exactly_what_it_uses(helm: Helm) -> None:
    docs = helm.template()
    namespaced = rules_of(one(docs, "ClusterRole", "-operator"))
    resources = {(g, r) for g, r, _ in namespaced}
    assert resources == {
        ("modelroll.io", "modelversions"),
        ("modelroll.io", "modelversions/status"),
        ("modelroll.io", "modelversions/finalizers"),
        ("", "configmaps"),
        ("apps", "deployments"),
        ("", "services"),
        ("", "events"),
        ("", "pods"),
    }
    # Canary analyses list the gateway pods to read their /metrics: list, nothing else.
    assert {v for _, r, v in namespaced if r == "pods"} == {"list"}
    # It patches keys; it deletes only the routes ConfigMap, to replace one made immutable.
    deletable = [
        rule
        for rule in one(docs, "ClusterRole", "-operator")["rules"]
        if "configmaps" in rule["resources"] and "delete" in rule["verbs"]
    ]
    assert [r.get("resourceNames") for r in deletable] == [["modelroll-routes"]]
    assert deletable[0]["verbs"] == ["delete"]
    assert ("modelroll.io", "modelversions", "delete") not in namespaced
    assert not any(verb in ("*", "escalate", "bind", "impersonate") for _, _, verb in namespaced)
    kopf = rules_of(one(docs, "ClusterRole", "-operator-cluster"))
    assert kopf == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }

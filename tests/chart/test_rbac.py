"""The service accounts' Roles and ClusterRoles: the gateway reads its routes ConfigMap; the
operator's rules, written from the table of its calls (modelroll_operator.permissions), follow
the chart's values."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.permissions import PERMISSIONS, Feature
from tests.support.chart import Helm, Manifest, by_kind, one
from tests.support.rendering import rules_of


def test_gateway_may_only_read_its_routes_configmap(helm: Helm) -> None:
    role = one(helm.template(), "Role", "-gateway")
    assert rules_of(role) == {("", "configmaps", v) for v in ("get", "list", "watch")}
    assert role["rules"][0]["resourceNames"] == ["modelroll-routes"]


HTTPROUTES = next(p for p in PERMISSIONS if p.feature is Feature.GATEWAY_API)
HTTPROUTE_RULE = {
    "apiGroups": [HTTPROUTES.group],
    "resources": [HTTPROUTES.resource],
    "verbs": list(HTTPROUTES.verbs),
}


def gateway_api_rules(doc: Manifest) -> list[dict[str, Any]]:
    return [r for r in doc["rules"] if "gateway.networking.k8s.io" in r["apiGroups"]]


@pytest.mark.parametrize("layout", [(), ("--set", "operator.watchNamespaces={a,b}")])
def test_without_gateway_api_the_operator_may_not_touch_httproutes(
    helm: Helm, layout: tuple[str, ...]
) -> None:
    roles = [d for d in helm.template(*layout) if d["kind"] in ("Role", "ClusterRole")]
    assert [d["metadata"]["name"] for d in roles if gateway_api_rules(d)] == []


def test_gateway_api_grants_the_httproute_rule_cluster_wide(helm: Helm) -> None:
    docs = helm.template("--set", "operator.gatewayAPI=true")
    assert gateway_api_rules(one(docs, "ClusterRole", "-operator")) == [HTTPROUTE_RULE]
    assert gateway_api_rules(one(docs, "ClusterRole", "-operator-cluster")) == []
    assert gateway_api_rules(one(docs, "Role", "-gateway")) == []


def test_gateway_api_with_watch_namespaces_grants_it_in_each_role(helm: Helm) -> None:
    """The Role of each watched namespace gets the rule. The ClusterRole that finishes a watched
    namespace's deletion gets list and watch only: the operator indexes the claiming routes, and
    kopf handles no event (no finalizer comes off) until every index is listed there."""
    docs = helm.template(
        "--set", "operator.gatewayAPI=true", "--set", "operator.watchNamespaces={a,b}"
    )
    roles = [d for d in by_kind(docs, "Role") if d["metadata"]["name"].endswith("-operator")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["a", "b"]
    for role in roles:
        assert gateway_api_rules(role) == [HTTPROUTE_RULE]
    assert [
        d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"].endswith("-operator")
    ] == []
    deletion = rules_of(one(docs, "ClusterRole", "-operator-cluster"))
    assert HTTPROUTES.deleting is not None
    assert {t for t in deletion if t[0] == HTTPROUTES.group} == {
        (HTTPROUTES.group, HTTPROUTES.resource, verb) for verb in HTTPROUTES.deleting.verbs
    }

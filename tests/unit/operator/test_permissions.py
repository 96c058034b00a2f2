"""The operator's calls against the table its chart RBAC is written from: a call the table does
not declare fails before it is sent, naming what it lacks, and kopf's watches are declared."""

from __future__ import annotations

from collections.abc import Iterable

import kopf
import pytest
from kopf._cogs.structs import references
from kubernetes import client as k8s

from modelroll_operator import handlers
from modelroll_operator.api import Api, apps_path, core_path, mv_path
from modelroll_operator.permissions import PERMISSIONS, Request, Undeclared, Verb, require


class Unreachable(k8s.ApiClient):
    """A client that fails the test if anything is sent."""

    def call_api(self, *args: object, **kwargs: object) -> k8s.rest.RESTResponse:
        raise AssertionError("an undeclared call was sent")


def test_an_undeclared_call_fails_naming_its_verb_and_resource_before_it_is_sent() -> None:
    api = Api(Unreachable())
    with pytest.raises(Undeclared) as refused:
        api.call("DELETE", mv_path("prod", "canary-v2"))
    assert str(refused.value).startswith(
        "the operator may not delete modelversions.modelroll.io named canary-v2 in namespace "
        "prod (DELETE /apis/modelroll.io/v1alpha1/namespaces/prod/modelversions/canary-v2)"
    )


def test_the_plugin_is_not_held_to_the_operators_calls() -> None:
    """kubectl modelroll runs with its user's credentials: their RBAC, not the chart's."""
    with pytest.raises(AssertionError, match="an undeclared call was sent"):
        Api(Unreachable(), permissions=None).call("DELETE", mv_path("prod", "canary-v2"))


@pytest.mark.parametrize(
    ("method", "path", "params", "said"),
    [
        ("GET", mv_path("prod"), {}, "list modelversions.modelroll.io in namespace prod"),
        (
            "GET",
            mv_path("prod"),
            {"watch": "true"},
            "watch modelversions.modelroll.io in namespace prod",
        ),
        (
            "PATCH",
            mv_path("prod", "v1", "status"),
            {},
            "patch modelversions/status.modelroll.io named v1 in namespace prod",
        ),
        ("GET", mv_path(None), {}, "list modelversions.modelroll.io cluster-wide"),
        ("POST", apps_path("prod", "deployments"), {}, "create deployments.apps in namespace prod"),
        ("GET", "/api/v1/namespaces", {}, "list namespaces cluster-wide"),
        ("GET", "/api/v1/namespaces/prod", {}, "get namespaces named prod cluster-wide"),
        ("DELETE", core_path("prod", "pods"), {}, "deletecollection pods in namespace prod"),
    ],
)
def test_a_request_reads_as_the_api_servers_authorizer_reads_it(
    method: str, path: str, params: dict[str, str], said: str
) -> None:
    assert str(Request.of(method, path, params)) == said


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", mv_path("prod", "v1")),  # versions are the user's: never deleted
        ("POST", mv_path("prod")),
        ("DELETE", core_path("prod", "configmaps", "someone-elses")),
        ("GET", core_path("prod", "pods", "p")),  # pods are listed, never read one by one
        ("GET", core_path("prod", "secrets", "s")),
        ("GET", mv_path(None)),  # granted in each served namespace, not across all of them
        ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles"),
    ],
)
def test_the_operator_may_not_reach_beyond_what_it_needs(method: str, path: str) -> None:
    with pytest.raises(Undeclared):
        require(method, path)


def test_the_routes_configmap_may_be_deleted_to_replace_an_immutable_one() -> None:
    require("DELETE", core_path("prod", "configmaps", "modelroll-routes"))


def resources(selectors: Iterable[references.Selector]) -> set[tuple[str, str]]:
    return {(s.group or "", str(s.plural or s.any_name)) for s in selectors}


def kopf_selectors(registry: kopf.OperatorRegistry) -> dict[str, set[tuple[str, str]]]:
    """(group, plural) of every resource kopf's handlers serve, by how they serve it."""
    return {
        "indexing": resources(registry._indexing.get_all_selectors()),
        "watching": resources(registry._watching.get_all_selectors()),
        "spawning": resources(registry._spawning.get_all_selectors()),
        "changing": resources(registry._changing.get_all_selectors()),
    }


def declared(group: str, plural: str, verb: Verb) -> bool:
    request = Request(verb, group, plural, "prod", None)
    return any(p.allows(request) for p in PERMISSIONS)


def test_every_resource_kopf_serves_is_declared_listed_and_watched() -> None:
    gateway_api = kopf.OperatorRegistry()
    handlers.register_gateway_api(gateway_api)
    served = kopf_selectors(kopf.get_default_registry())
    served["indexing"] |= kopf_selectors(gateway_api)["indexing"]
    every = set().union(*served.values())
    assert ("gateway.networking.k8s.io", "httproutes") in every
    missing = [
        f"{verb} {plural}.{group}"
        for group, plural in sorted(every)
        for verb in (Verb.LIST, Verb.WATCH)
        if not declared(group, plural, verb)
    ]
    assert missing == []
    # Daemons and deletion handlers hold our finalizer: kopf patches it and its annotations.
    holding = served["spawning"] | served["changing"]
    assert holding
    assert [r for r in sorted(holding) if not declared(*r, Verb.PATCH)] == []

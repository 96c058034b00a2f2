"""Writing a model's weights into the HTTPRoute that claims it: which rule, what the parents
say, and a write that never lands on a route changed since it was read."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from modelroll_common.routes import ModelRoute, VersionRoute
from modelroll_operator.api import Api, KubeApiError
from modelroll_operator.httproute import Backends, HTTPRouteInfo, HTTPRoutes, RouteChanged
from modelroll_operator.permissions import require
from modelroll_operator.spec import BackendRef

BACKENDS = Backends(
    {"stable": BackendRef("stable", "Service", 8000), "pool": BackendRef("pool", "InferencePool")},
    {"stable": "http://stable:8000", "pool": "http://pool:8000"},
)
ROUTE = ModelRoute(
    "m",
    (
        VersionRoute("pool", 10, "http://pool:8000"),
        VersionRoute("stable", 90, "http://stable:8000"),
    ),
)


def body(version: str, rules: list[dict[str, Any]], parents: list[Any] | None = None) -> Any:
    return {
        "metadata": {
            "name": "r",
            "namespace": "ns",
            "generation": 2,
            "resourceVersion": version,
            "labels": {"modelroll.io/model": "m"},
        },
        "spec": {"rules": rules},
        "status": {"parents": parents or []},
    }


def info(doc: Any) -> HTTPRouteInfo:
    found = HTTPRouteInfo.from_body(doc)
    assert found is not None
    return found


def test_the_rule_is_the_one_named_after_the_model_or_the_only_unnamed_one() -> None:
    assert info(body("1", [{"name": "other"}, {"name": "m"}])).rule() == 1
    assert info(body("1", [{}])).rule() == 0
    assert "none is named m" in str(info(body("1", [{"name": "a"}, {}])).rule())


def conditions(accepted: str, resolved: str = "True", generation: int = 2) -> list[Any]:
    return [
        {
            "parentRef": {"name": "edge"},
            "conditions": [
                {
                    "type": "Accepted",
                    "status": accepted,
                    "reason": "NoListener",
                    "message": "x",
                    "observedGeneration": generation,
                },
                {
                    "type": "ResolvedRefs",
                    "status": resolved,
                    "reason": "BackendNotFound",
                    "message": "y",
                    "observedGeneration": generation,
                },
            ],
        }
    ]


@pytest.mark.parametrize(
    ("parents", "verdict"),
    [
        (None, ("Unknown", "Pending")),
        (conditions("True", generation=1), ("Unknown", "Pending")),  # an older generation's
        (conditions("False"), ("False", "NotAccepted")),
        (conditions("True", "False"), ("False", "RefsNotResolved")),
        (conditions("True"), ("True", "Accepted")),
    ],
)
def test_the_parents_verdict_is_about_the_current_generation(
    parents: list[Any] | None, verdict: tuple[str, str]
) -> None:
    found = info(body("1", [{"name": "m"}], parents)).acceptance()
    assert (found.status, found.reason) == verdict


class Server:
    """The API server's HTTPRoute: it moved on to resourceVersion 2 since the index saw 1."""

    def __init__(self, refuse: KubeApiError | None = None) -> None:
        self.stored = body("2", [{"name": "m", "filters": [{"type": "X"}]}])
        self.refuse = refuse
        self.patches: list[list[dict[str, Any]]] = []

    async def get(self, path: str) -> Any:
        require("GET", path)
        return copy.deepcopy(self.stored)

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> Any:
        require("PATCH", path)
        self.patches.append(operations)
        if self.refuse is not None:
            raise self.refuse
        return self.stored


async def test_the_patch_is_built_on_the_route_as_it_is_now() -> None:
    server = Server()
    stale = info(body("1", [{"name": "m"}]))
    written = await HTTPRoutes(cast(Api, server)).write("m", [stale], ROUTE, BACKENDS)
    (operations,) = server.patches
    assert operations[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "2"}
    assert operations[1] == {"op": "test", "path": "/spec/rules/0/name", "value": "m"}
    assert operations[2]["value"] == [
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": "pool",
            "weight": 10,
        },
        {"group": "", "kind": "Service", "name": "stable", "port": 8000, "weight": 90},
    ]
    assert written.problem is None
    assert written.in_force == ROUTE


async def test_a_route_changed_during_the_write_is_retried_and_a_refusal_reported() -> None:
    invalid = KubeApiError(422, "Invalid", "the server rejected our request")
    raced = Server(invalid)
    original = raced.json_patch

    async def patch_then_change(path: str, operations: list[dict[str, Any]]) -> Any:
        raced.stored["metadata"]["resourceVersion"] = "3"  # a Gateway wrote its status
        return await original(path, operations)

    raced.json_patch = patch_then_change  # type: ignore[method-assign]
    with pytest.raises(KubeApiError):
        await HTTPRoutes(cast(Api, raced)).write("m", [info(body("1", [{}]))], ROUTE, BACKENDS)

    refused = Server(invalid)
    written = await HTTPRoutes(cast(Api, refused)).write(
        "m", [info(body("1", [{}]))], ROUTE, BACKENDS
    )
    assert written.problem is not None
    assert "refused to update HTTPRoute r" in written.problem
    assert written.in_force == ModelRoute("m")  # what the rule still says: nothing


async def test_a_route_whose_claim_went_meanwhile_is_retried() -> None:
    server = Server()
    server.stored["metadata"]["labels"] = {}
    with pytest.raises(RouteChanged):
        await HTTPRoutes(cast(Api, server)).write("m", [info(body("1", [{}]))], ROUTE, BACKENDS)


async def test_a_route_the_operator_may_not_read_is_reported_not_retried_in_silence() -> None:
    class Forbidden(Server):
        async def get(self, path: str) -> Any:
            raise KubeApiError(403, "Forbidden", 'cannot get resource "httproutes"')

    written = await HTTPRoutes(cast(Api, Forbidden())).write(
        "m", [info(body("1", [{}]))], ROUTE, BACKENDS
    )
    assert written.problem is not None
    assert "needs list, watch, get and patch on httproutes" in written.problem

"""Which data plane routes a model, what each plane can do, and the weights each says are in
force: chosen from the watched HTTPRoutes, never with an API call."""

from __future__ import annotations

from typing import Any, cast

import pytest

from modelroll_common.routes import ModelRoute
from modelroll_operator.analysis.daemon import Canaries
from modelroll_operator.analysis.reader import MetricsReader, MetricsUnavailable
from modelroll_operator.analysis.spec import MetricsSource
from modelroll_operator.api import Api
from modelroll_operator.httproute import HTTPRouteInfo, HTTPRoutes
from modelroll_operator.planes import MetricsOrigin, Planes
from modelroll_operator.planes.configmap import ConfigMapKind
from modelroll_operator.planes.httproute import HTTPRouteKind, indexed
from modelroll_operator.reconcile import plan_route
from modelroll_operator.routes_configmap import RoutesConfigMap
from modelroll_operator.routing import RouteWrite
from modelroll_operator.snapshots import ModelKey
from modelroll_operator.status import Readiness
from tests.support.specs import version

KEY = ("prod", "sentiment")


class NoApi:
    """An API server the choice must not call: every call fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API server was called: {name}")


def claim(
    name: str = "models", accepted: bool = True, weights: dict[str, int] | None = None
) -> HTTPRouteInfo:
    """An HTTPRoute claiming model sentiment, its rule's weights, and its parent's verdict."""
    refs = [{"kind": "Service", "name": n, "weight": w} for n, w in (weights or {}).items()]
    status = "True" if accepted else "False"
    conditions = [
        {"type": kind, "status": status, "reason": "R", "observedGeneration": 1}
        for kind in ("Accepted", "ResolvedRefs")
    ]
    info = HTTPRouteInfo.from_body(
        {
            "metadata": {
                "name": name,
                "namespace": "prod",
                "generation": 1,
                "labels": {"modelroll.io/model": "sentiment"},
            },
            "spec": {"rules": [{"name": "sentiment", "backendRefs": refs}]},
            "status": {"parents": [{"parentRef": {"name": "edge"}, "conditions": conditions}]},
        }
    )
    assert info is not None
    return info


def planes(index: dict[ModelKey, list[HTTPRouteInfo]] | None) -> Planes:
    """The operator's planes: HTTPRoutes only with --gateway-api (an index), then the
    routes ConfigMap."""
    api = cast(Api, NoApi())
    httproutes = [HTTPRouteKind(indexed(index), HTTPRoutes(api))] if index is not None else []
    return Planes([*httproutes, ConfigMapKind(RoutesConfigMap(api))], 8000)


async def test_a_model_no_httproute_claims_is_in_the_routes_configmap_which_can_do_everything() -> (
    None
):
    for chosen in (await planes(None).choose(KEY, {}), await planes({}).choose(KEY, {})):
        assert chosen.name == "ConfigMap modelroll-routes"
        assert (chosen.sticky_cohorts, chosen.shadow_copies, chosen.pinning) == (True, True, True)
        assert chosen.metrics is MetricsOrigin.GATEWAY
        assert chosen.unroutable("anything") is None


async def test_a_model_an_httproute_claims_is_in_that_route_which_splits_by_weight_alone() -> None:
    ours = planes({KEY: [claim()]})
    managed, external = version("stable"), version("ext", endpoint="http://ext:8000")
    chosen = await ours.choose(KEY, ours.backends([managed, external]))
    assert chosen.name == "HTTPRoute models"
    assert (chosen.sticky_cohorts, chosen.shadow_copies, chosen.pinning) == (False, False, False)
    assert chosen.metrics is MetricsOrigin.SIDECARS
    assert chosen.unroutable("stable") is None
    assert chosen.unroutable("ext") == (
        "Model sentiment is routed by HTTPRoute models, and an external version needs "
        "spec.backendRef there (the Service or InferencePool it sends the version's share to)"
    )


async def test_a_model_moves_between_planes_as_soon_as_the_watch_shows_it() -> None:
    """The choice reads the watched index at each call: a route labelled for the model takes
    it, and the model is back in the ConfigMap once the route is gone (or its label)."""
    index: dict[ModelKey, list[HTTPRouteInfo]] = {}
    ours = planes(index)
    assert (await ours.choose(KEY, {})).metrics is MetricsOrigin.GATEWAY
    index[KEY] = [claim()]
    assert (await ours.choose(KEY, {})).name == "HTTPRoute models"
    assert (await ours.choose(("prod", "other"), {})).metrics is MetricsOrigin.GATEWAY
    del index[KEY]
    assert (await ours.choose(KEY, {})).metrics is MetricsOrigin.GATEWAY


async def test_a_model_an_httproute_claims_leaves_the_configmap_and_never_the_reverse() -> None:
    """One plane at a time: the model's ConfigMap key goes before its route is written. A
    model back in the ConfigMap leaves the route's backendRefs as they are (the route is its
    owner's): no call."""
    released: list[tuple[str, str, ModelRoute | None]] = []

    class Routes(RoutesConfigMap):
        async def write(self, namespace: str, model: str, route: ModelRoute | None) -> RouteWrite:
            released.append((namespace, model, route))
            return RouteWrite(None, None, "refused")

    index: dict[ModelKey, list[HTTPRouteInfo]] = {KEY: [claim()]}
    api = cast(Api, NoApi())
    ours = Planes(
        [HTTPRouteKind(indexed(index), HTTPRoutes(api)), ConfigMapKind(Routes(api))], 8000
    )
    assert await ours.release_others(await ours.choose(KEY, {}), KEY) == ["refused"]
    assert released == [("prod", "sentiment", None)]
    del index[KEY]
    assert await ours.release_others(await ours.choose(KEY, {}), KEY) == []
    assert len(released) == 1


def test_a_version_s_backend_is_its_service_or_its_backend_ref() -> None:
    ours = planes(None)
    pool = version(
        "pool", endpoint="http://pool:8000", backendRef={"kind": "InferencePool", "name": "p"}
    )
    refs = ours.backends([version("stable"), pool, version("bare", endpoint="http://b:8000")])
    assert {n: (r.name, r.kind, r.port) for n, r in refs.items()} == {
        "stable": ("stable", "Service", 8000),
        "pool": ("p", "InferencePool", None),
    }


@pytest.mark.parametrize(
    ("claims", "in_force"),
    [
        ([claim(weights={"canary": 10, "stable-svc": 90})], {"canary": 10.0, "stable": 90.0}),
        ([claim(accepted=False, weights={"canary": 10, "stable-svc": 90})], {}),
        ([claim(weights={"canary": 10}), claim("second", weights={"canary": 10})], {}),
    ],
    ids=["accepted", "refused by its parent", "claimed twice"],
)
async def test_the_weights_in_force_behind_an_httproute_are_its_accepted_rules(
    claims: list[HTTPRouteInfo], in_force: dict[str, float]
) -> None:
    ours = planes({KEY: claims})
    stable = version(
        "stable", endpoint="http://s:8000", backendRef={"name": "stable-svc", "port": 80}
    )
    chosen = await ours.choose(KEY, ours.backends([stable]))
    reported = {"pod/gw-a": {"canary": 1.0, "stable": 1.0}}  # no gateway routes the model
    assert chosen.weights_in_force(reported, ("canary", "stable")) == {"httproute/models": in_force}


async def test_the_weights_in_force_in_the_configmap_are_what_each_gateway_pod_reports() -> None:
    chosen = await planes(None).choose(KEY, {})
    reported = {"pod/gw-a": {"canary": 10.0, "stable": 90.0, "other": 5.0}, "pod/gw-b": {}}
    assert chosen.weights_in_force(reported, ("canary", "stable")) == {
        "pod/gw-a": {"canary": 10.0, "stable": 90.0},
        "pod/gw-b": {},
    }


class Pods:
    """The API server's answers to lists, recorded: the versions' pods, and no HTTPRoute."""

    def __init__(self) -> None:
        self.listed: list[str] = []

    async def send(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.listed.append(path)
        return {"items": []}


async def test_an_analysis_given_its_plane_lists_no_httproute() -> None:
    """The operator's analyses get the plane their model's pass would choose, from the watch:
    a look lists the versions' pods, never the HTTPRoutes."""
    api = Pods()
    ours = planes({KEY: [claim(weights={"canary": 10, "stable": 90})]})
    chosen = await ours.choose(KEY, {})
    reader = MetricsReader(cast(Api, api), gateway_api=True)
    try:
        with pytest.raises(MetricsUnavailable, match="no Ready pod in prod matches"):
            await reader.read(MetricsSource(), *KEY, "canary", "stable", 1.0, plane=chosen)
        with pytest.raises(MetricsUnavailable, match="HTTPRoute models, and a Gateway API"):
            await reader.read(
                MetricsSource(), *KEY, "canary", "stable", 1.0, agreement=True, plane=chosen
            )
    finally:
        await reader.close()
    assert api.listed == ["/api/v1/namespaces/prod/pods"]


async def test_a_route_holds_what_its_plane_can_do_and_only_the_versions_it_can_route() -> None:
    """Behind an HTTPRoute an external version without spec.backendRef is not Ready, and the
    route has no cohort header and no shadow share (the data plane splits by weight alone);
    the ConfigMap's route has both."""
    stable = version("stable", endpoint="http://s:8000", weight=9, cohortHeader="X-User")
    shadow = version("shadow", endpoint="http://sh:8000", weight=0, shadow={"percent": 5})
    pool = version(
        "pool",
        endpoint="http://p:8000",
        weight=1,
        backendRef={"kind": "InferencePool", "name": "p"},
    )
    live = [pool, shadow, stable]
    ready = {
        v.name: Readiness(True, "ExternalEndpoint", "up", endpoint=v.spec.endpoint)
        for v in live
        if v.spec
    }

    ours = planes({KEY: [claim()]})
    behind_route = await ours.choose(KEY, ours.backends(live))
    readiness, route = plan_route("sentiment", live, ready, behind_route)
    assert (readiness["stable"].ready, readiness["stable"].reason) == (False, "NoBackendRef")
    assert readiness["pool"] == ready["pool"]
    assert route is not None
    assert [(v.name, v.weight, v.shadow) for v in route.versions] == [("pool", 1, 0)]
    assert route.cohort_header is None

    in_configmap = await planes(None).choose(KEY, {})
    readiness, route = plan_route("sentiment", live, ready, in_configmap)
    assert readiness == ready
    assert route is not None
    assert [(v.name, v.shadow) for v in route.versions] == [
        ("pool", 0),
        ("shadow", 5),
        ("stable", 0),
    ]
    assert route.cohort_header == "X-User"


async def test_an_analysis_sees_the_plane_and_backends_its_models_pass_sees() -> None:
    """The canary's look takes the plane from the same watched index as the model's pass, and
    each version's backend from its spec: the weights in force are the route's, read by the
    external baseline's backendRef, and nothing is asked of the API server."""
    index: dict[ModelKey, list[HTTPRouteInfo]] = {}
    ours = planes(index)
    stable = version("stable", endpoint="http://s:8000", backendRef={"name": "svc", "port": 80})
    canaries = Canaries(
        cast(Api, NoApi()),
        lambda key: [stable, version("canary")],
        MetricsReader(cast(Api, NoApi())),
        planes=ours,
    )
    chosen = await canaries._plane(KEY)
    assert chosen is not None
    assert chosen.metrics is MetricsOrigin.GATEWAY
    index[KEY] = [claim(weights={"canary": 10, "svc": 90})]
    chosen = await canaries._plane(KEY)
    assert chosen is not None
    assert chosen.metrics is MetricsOrigin.SIDECARS
    assert chosen.weights_in_force({}, ("canary", "stable")) == {
        "httproute/models": {"canary": 10.0, "stable": 90.0}
    }

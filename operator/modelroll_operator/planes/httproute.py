"""The HTTPRoute's plane: a Gateway API data plane routes the model by the backendRefs of the
HTTPRoute that claims it (httproute.py writes them).

Such a data plane splits by weight alone: no sticky cohorts, no shadow copies, no pinning by
header. Its own metrics are not modelroll's, so a canary analysis reads the versions' sidecars,
and the weights in force are the route's once every parent accepted its generation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from modelroll_common.routes import ModelRoute

from ..api import Api
from ..httproute import Backends, HTTPRouteInfo, HTTPRoutes, httproute_path
from ..routing import RouteWrite
from ..snapshots import ModelKey
from ..spec import LABEL_MODEL, BackendRef
from . import MetricsOrigin, Weights

Claims = Callable[[ModelKey], Awaitable[Sequence[HTTPRouteInfo]]]
"""The HTTPRoutes that claim a model (labelled modelroll.io/model with its name)."""


@dataclass(frozen=True)
class HTTPRoutePlane:
    """One model's weights in the HTTPRoute that claims it (or the routes that all do)."""

    kind: HTTPRouteKind
    model: str
    claims: tuple[HTTPRouteInfo, ...]
    backends: Mapping[str, BackendRef]
    """Each version's backendRef in the route, by version name."""

    data_plane = "a Gateway API data plane"
    sticky_cohorts = False
    shadow_copies = False
    pinning = False
    metrics = MetricsOrigin.SIDECARS

    @property
    def name(self) -> str:
        return f"HTTPRoute {self.claims[0].name}"

    def unroutable(self, version: str) -> str | None:
        if version in self.backends:
            return None
        return (
            f"Model {self.model} is routed by {self.name}, and an external version needs "
            "spec.backendRef there (the Service or InferencePool it sends the version's share to)"
        )

    async def write(self, route: ModelRoute | None, endpoints: Mapping[str, str]) -> RouteWrite:
        backends = Backends(self.backends, endpoints)
        return await self.kind.writer.write(self.model, self.claims, route, backends)

    def weights_in_force(
        self, reported: Mapping[str, Weights], versions: Iterable[str]
    ) -> dict[str, Weights]:
        """The route's rule's weights once its parents accepted its current generation (none
        known before, nor while several routes claim the model: none is written then)."""
        claim = self.claims[0]
        source = f"httproute/{claim.name}"
        if len(self.claims) > 1 or claim.acceptance().status != "True":
            return {source: {}}
        weights = {str(ref.get("name")): ref.get("weight", 1) for ref in claim.backend_refs()}
        found = {}
        for version in versions:
            backend = self.backends.get(version)
            weight = weights.get(backend.name if backend is not None else version)
            if isinstance(weight, int):
                found[version] = float(weight)
        return {source: found}


class HTTPRouteKind:
    """The HTTPRoutes labelled modelroll.io/model: each claims the model its label names."""

    def __init__(self, claims: Claims, writer: HTTPRoutes) -> None:
        self.claims = claims
        self.writer = writer

    async def claim(
        self, key: ModelKey, backends: Mapping[str, BackendRef]
    ) -> HTTPRoutePlane | None:
        claims = tuple(await self.claims(key))
        return HTTPRoutePlane(self, key[1], claims, dict(backends)) if claims else None

    async def release(self, key: ModelKey) -> str | None:
        """Nothing: the route is its owner's, and keeps the backendRefs it had when it stopped
        claiming the model."""
        return None


def indexed(index: Mapping[ModelKey, Iterable[HTTPRouteInfo]]) -> Claims:
    """The claims as the operator's watch of HTTPRoutes holds them (kopf's index): no API
    call, and as fresh as the watch."""

    async def claims(key: ModelKey) -> list[HTTPRouteInfo]:
        return list(index.get(key) or ())

    return claims


def listed(api: Api) -> Claims:
    """The claims as the API server lists them now, for a reader without the operator's
    watch; API failures raise."""

    async def claims(key: ModelKey) -> list[HTTPRouteInfo]:
        namespace, model = key
        found = await api.send(
            "GET", httproute_path(namespace), params={"labelSelector": f"{LABEL_MODEL}={model}"}
        )
        every = (HTTPRouteInfo.from_body(r) for r in found.get("items") or [])
        return [c for c in every if c is not None]

    return claims

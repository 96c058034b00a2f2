"""The routes ConfigMap's plane: the modelroll gateway routes the model by its key there.

Every model no other plane claims is routed here (routes_configmap.py writes the key). The
gateway does all a route says: sticky cohorts, shadow copies, pinning by header. A canary
analysis reads the gateway's pods, which report the weights each routes by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from modelroll_common.routes import CONFIGMAP_NAME, ModelRoute

from ..routes_configmap import RoutesConfigMap
from ..routing import RouteWrite
from ..snapshots import ModelKey
from ..spec import BackendRef
from . import MetricsOrigin, Weights


@dataclass(frozen=True)
class ConfigMapPlane:
    """One model's key in its namespace's routes ConfigMap."""

    kind: ConfigMapKind
    namespace: str
    model: str

    name = f"ConfigMap {CONFIGMAP_NAME}"
    data_plane = "the modelroll gateway"
    sticky_cohorts = True
    shadow_copies = True
    pinning = True
    metrics = MetricsOrigin.GATEWAY

    def unroutable(self, version: str) -> str | None:
        return None

    async def write(self, route: ModelRoute | None, endpoints: Mapping[str, str]) -> RouteWrite:
        return await self.kind.routes.write(self.namespace, self.model, route)

    def weights_in_force(
        self, reported: Mapping[str, Weights], versions: Iterable[str]
    ) -> dict[str, Weights]:
        """What each gateway pod reports it routes by."""
        wanted = set(versions)
        return {
            source: {v: w for v, w in weights.items() if v in wanted}
            for source, weights in reported.items()
        }


class ConfigMapKind:
    """The routes ConfigMaps: they claim every model (so this kind comes last)."""

    def __init__(self, routes: RoutesConfigMap) -> None:
        self.routes = routes

    async def claim(self, key: ModelKey, backends: Mapping[str, BackendRef]) -> ConfigMapPlane:
        return ConfigMapPlane(self, *key)

    async def release(self, key: ModelKey) -> str | None:
        """Remove the model's key: another plane routes it."""
        return (await self.routes.write(key[0], key[1], None)).problem

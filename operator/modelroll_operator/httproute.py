"""The operator's side of Gateway API HTTPRoutes: a model's weights as a rule's backendRefs.

An HTTPRoute labelled ``modelroll.io/model: <model>`` in the model's namespace claims the model:
the data plane that serves the route (Envoy Gateway, Istio, Cilium, Traefik...) then routes the
model, and the routes ConfigMap has no key for it, so a model is never half in each mode. The
user owns the route: its parentRefs, hostnames, matches, filters and other rules. The operator
writes only the ``backendRefs`` of one rule, the one named after the model (or the route's only
rule, when it has one and no rule is named after the model): one backendRef per routed version,
its weight exactly the version's weight. Gateway API's ``rules`` list is atomic, so a
server-side apply of one rule would take every rule; the write is a JSON patch of that rule's
backendRefs alone, guarded by the route's resourceVersion and the rule's name, so that it never
lands on a rule edited meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelroll_common.routes import ModelRoute, VersionRoute

from .api import Api, KubeApiError
from .routing import Acceptance, RouteWrite
from .snapshots import ModelKey
from .spec import LABEL_MODEL, BackendRef

log = logging.getLogger("modelroll_operator")

GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
HTTPROUTES = "httproutes"
INFERENCE_GROUP = "inference.networking.k8s.io"
"""The Gateway API Inference Extension's group: an InferencePool backendRef's."""
MAX_BACKEND_REFS = 16
"""Gateway API's limit on a rule's backendRefs: a model routes at most this many versions."""


def httproute_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{GATEWAY_GROUP}/{GATEWAY_VERSION}/namespaces/{namespace}/{HTTPROUTES}"
    return f"{base}/{name}" if name else base


def backend_ref(backend: BackendRef, weight: int) -> dict[str, Any]:
    """A backendRef as the operator writes it: every defaulted field explicit, so that the
    stored object reads back equal."""
    group = INFERENCE_GROUP if backend.kind == "InferencePool" else ""
    ref: dict[str, Any] = {"group": group, "kind": backend.kind, "name": backend.name}
    if backend.port is not None:
        ref["port"] = backend.port
    ref["weight"] = weight
    return ref


def _identity(ref: Mapping[str, Any]) -> tuple[str, str, str, int | None]:
    """What a backendRef points at (the API server's defaults filled in)."""
    port = ref.get("port")
    return (
        str(ref.get("group") or ""),
        str(ref.get("kind") or "Service"),
        str(ref.get("name") or ""),
        port if isinstance(port, int) else None,
    )


@dataclass(frozen=True)
class HTTPRouteInfo:
    """An HTTPRoute that claims a model, as last seen."""

    namespace: str
    name: str
    model: str
    generation: int
    resource_version: str
    rules: tuple[Mapping[str, Any], ...] = ()
    parents: tuple[Mapping[str, Any], ...] = ()
    """Its status.parents: each parent's (Gateway's) conditions about the route."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> HTTPRouteInfo | None:
        """A snapshot of an HTTPRoute; None when it claims no model."""
        meta = body.get("metadata") or {}
        model = (meta.get("labels") or {}).get(LABEL_MODEL)
        if not isinstance(model, str) or not model:
            return None
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            model=model,
            generation=int(meta.get("generation") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
            rules=tuple(r for r in spec.get("rules") or () if isinstance(r, Mapping)),
            parents=tuple(p for p in status.get("parents") or () if isinstance(p, Mapping)),
        )

    @property
    def model_key(self) -> ModelKey:
        return (self.namespace, self.model)

    def rule(self) -> int | str:
        """The index of the rule the operator writes, or why there is none."""
        named = [i for i, r in enumerate(self.rules) if r.get("name") == self.model]
        if named:
            return named[0]
        if len(self.rules) == 1 and not self.rules[0].get("name"):
            return 0
        return (
            f"HTTPRoute {self.name} has {len(self.rules)} rules and none is named "
            f"{self.model}: name the rule whose backendRefs modelroll writes after the model"
        )

    def backend_refs(self) -> list[Mapping[str, Any]]:
        """The backendRefs of the operator's rule ([] when it has none, or there is no rule)."""
        index = self.rule()
        if isinstance(index, str):
            return []
        refs = self.rules[index].get("backendRefs") or []
        return [r for r in refs if isinstance(r, Mapping)]

    def acceptance(self) -> Acceptance:
        """What the route's parents say of its current generation: every one Accepted with its
        references resolved, one refusing it (its reason and message), or not known yet."""
        if not self.parents:
            return Acceptance(
                "Unknown",
                "Pending",
                f"HTTPRoute {self.name} has no status from a parent yet: is a Gateway of a "
                "running controller among its parentRefs?",
            )
        seen = []
        for parent in self.parents:
            ref = parent.get("parentRef") or {}
            who = f"{ref.get('kind') or 'Gateway'} {ref.get('name')}"
            conditions = {
                c.get("type"): c for c in parent.get("conditions") or () if isinstance(c, Mapping)
            }
            for kind in ("Accepted", "ResolvedRefs"):
                cond = conditions.get(kind)
                if cond is None or int(cond.get("observedGeneration") or 0) < self.generation:
                    return Acceptance(
                        "Unknown",
                        "Pending",
                        f"{who} has not yet reported on generation {self.generation} of "
                        f"HTTPRoute {self.name}",
                    )
                if cond.get("status") != "True":
                    why = "refuses" if kind == "Accepted" else "cannot resolve the backends of"
                    return Acceptance(
                        "False",
                        "NotAccepted" if kind == "Accepted" else "RefsNotResolved",
                        f"{who} {why} HTTPRoute {self.name}: {cond.get('reason')}: "
                        f"{cond.get('message') or 'no message'}",
                    )
            seen.append(who)
        return Acceptance(
            "True", "Accepted", f"HTTPRoute {self.name} accepted by {', '.join(seen)}"
        )


@dataclass(frozen=True)
class Backends:
    """Each version's backend in its model's HTTPRoute, and where the version answers."""

    refs: Mapping[str, BackendRef] = field(default_factory=dict)
    """By version name: what the route sends its share to."""
    endpoints: Mapping[str, str] = field(default_factory=dict)
    """By version name: its endpoint (a routed version's, in ModelRoute)."""

    def wanted(self, route: ModelRoute | None, live: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The backendRefs that say ``route``, in its order (by version name). A live
        backendRef's own fields (its filters) are kept."""
        by_identity = {_identity(r): r for r in live}
        refs = []
        for version in route.versions if route is not None else ():
            ref = backend_ref(self.refs[version.name], version.weight)
            kept = by_identity.get(_identity(ref), {})
            refs.append({**kept, **ref})
        return refs

    def route(self, model: str, refs: Iterable[Mapping[str, Any]]) -> ModelRoute:
        """The route that backendRefs say: the versions they point at, with their weights
        (a backendRef of no known version routes nothing modelroll knows of)."""
        names = {_identity(backend_ref(b, 0)): name for name, b in self.refs.items()}
        versions = []
        for ref in refs:
            name = names.get(_identity(ref))
            weight = ref.get("weight", 1)
            if name is None or name not in self.endpoints or not isinstance(weight, int):
                continue
            versions.append(VersionRoute(name, min(weight, 1000), self.endpoints[name]))
        return ModelRoute(model, tuple(sorted(versions, key=lambda v: v.name)))


class RouteChanged(Exception):
    """The route changed between its index entry and the write: the pass is tried again."""


class HTTPRoutes:
    """Writes models' weights into the HTTPRoutes that claim them."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def write(
        self,
        model: str,
        claims: Sequence[HTTPRouteInfo],
        route: ModelRoute | None,
        backends: Backends,
    ) -> RouteWrite:
        """Make the claiming route's rule send ``route``'s weights. A route that cannot take
        them (two routes claim the model, no rule to write, a write the API server refuses)
        comes back as a problem with what the route says now; transient failures raise."""
        if len(claims) > 1:
            names = ", ".join(sorted(c.name for c in claims))
            first = min(claims, key=lambda c: c.name)
            before = backends.route(model, first.backend_refs())
            problem = (
                f"HTTPRoutes {names} all claim model {model} (label {LABEL_MODEL}): "
                "label only one, the others' weights are left as they are"
            )
            return RouteWrite(before, before, problem, first.name, first.acceptance())
        (claim,) = claims
        before = backends.route(model, claim.backend_refs())
        index = claim.rule()
        if isinstance(index, str):
            return RouteWrite(before, before, index, claim.name, claim.acceptance())
        count = len(route.versions) if route is not None else 0
        if count > MAX_BACKEND_REFS:
            problem = (
                f"model {model} has {count} Ready versions, and an HTTPRoute rule takes at most "
                f"{MAX_BACKEND_REFS} backendRefs"
            )
            return RouteWrite(before, before, problem, claim.name, claim.acceptance())
        live = claim.backend_refs()
        want = backends.wanted(route, live)
        if want == [dict(r) for r in live]:
            return RouteWrite(before, route, None, claim.name, claim.acceptance())
        path = httproute_path(claim.namespace, claim.name)
        # The index may lag the route (its Gateways write its status after each change): the
        # patch is built on the route as it is now, so that its test operations hold.
        try:
            fresh = HTTPRouteInfo.from_body(await self.api.get(path) or {})
            if fresh is None or fresh.model != model or fresh.rule() != index:
                raise RouteChanged(f"HTTPRoute {claim.name} changed while {model} was written")
        except KubeApiError as exc:
            if exc.status != 403:
                raise
            return self._refused(model, claim, before, exc)
        claim, live = fresh, fresh.backend_refs()
        want = backends.wanted(route, live)
        if want == [dict(r) for r in live]:
            return RouteWrite(before, route, None, claim.name, claim.acceptance())
        rule_path = f"/spec/rules/{index}"
        operations: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": claim.resource_version},
        ]
        if name := claim.rules[index].get("name"):
            operations.append({"op": "test", "path": f"{rule_path}/name", "value": name})
        operations.append({"op": "add", "path": f"{rule_path}/backendRefs", "value": want})
        try:
            written = await self.api.json_patch(path, operations)
        except KubeApiError as exc:
            if exc.status in (404, 409) or (exc.status != 403 and await self._changed(path, claim)):
                # Changed or gone since it was read (a Gateway writing the route's status is
                # enough): a failed test operation is a 422 like any invalid patch. The pass is
                # retried, and the route's watch event brings the new version.
                raise
            return self._refused(model, claim, before, exc)
        weights = ", ".join(f"{v.name}={v.weight}" for v in route.versions) if route else ""
        log.info(
            "Routed model %s/%s in HTTPRoute %s: %s",
            claim.namespace,
            model,
            claim.name,
            weights or "no Ready version",
        )
        now = HTTPRouteInfo.from_body(written) or claim
        return RouteWrite(before, route, None, claim.name, now.acceptance())

    @staticmethod
    def _refused(
        model: str, claim: HTTPRouteInfo, before: ModelRoute, exc: KubeApiError
    ) -> RouteWrite:
        """The API server refuses the write for good (an invalid patch, no access): reported
        on the versions, never retried in silence."""
        problem = f"the API server refused to update HTTPRoute {claim.name}: {exc}"
        if exc.status == 403:
            problem += " (the operator needs list, watch, get and patch on httproutes)"
        log.warning("Could not route model %s/%s: %s", claim.namespace, model, problem)
        return RouteWrite(before, before, problem, claim.name, claim.acceptance())

    async def _changed(self, path: str, claim: HTTPRouteInfo) -> bool:
        """Whether the route is gone or at another resourceVersion than ``claim``'s."""
        live = await self.api.get(path)
        return (
            live is None
            or (live.get("metadata") or {}).get("resourceVersion") != claim.resource_version
        )

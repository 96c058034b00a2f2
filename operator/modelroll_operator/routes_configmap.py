"""The operator's side of a namespace's routes ConfigMap: write one model's key, and say what the
gateway has when a write cannot be made.

The operator owns every key of the ConfigMap (``modelroll-routes``): one per model that has
ModelVersions; the key of a model without any is removed. A write that the API server refuses
is never left at a log line: the caller gets the route still in force with the reason, and
reports both on every version of the model. What the operator can repair, it repairs: a missing
ConfigMap is created, and one someone made ``immutable`` (which would freeze every model's
routes) is replaced. A namespace's routes must fit in one ConfigMap (:data:`CONFIGMAP_LIMIT`); a
route that would not fit is refused before it is sent, with the sizes in the message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from modelroll_common.routes import (
    CONFIGMAP_NAME,
    ModelRoute,
    RoutesError,
    dump_model_route,
    parse_model_route,
)

from .api import Api, KubeApiError, core_path
from .routing import RouteWrite
from .snapshots import ModelKey
from .spec import LABEL_MANAGED_BY, MANAGED_BY

log = logging.getLogger("modelroll_operator")

CONFIGMAP_LIMIT = 1024 * 1024
"""Kubernetes refuses a ConfigMap whose keys and values add up to more than 1 MiB."""


def data_size(data: Mapping[str, str]) -> int:
    """The size Kubernetes counts against CONFIGMAP_LIMIT: every key and value, in bytes."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())


def _parse(model: str, text: str | None) -> ModelRoute | None:
    if text is None:
        return None
    try:
        return parse_model_route(model, text)
    except RoutesError:
        return None


class RoutesConfigMap:
    """Reads and writes the routes ConfigMaps, remembering what each model's key holds."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._known: dict[ModelKey, str | None] = {}
        """Per model, its key's text as last written or read by the operator (None: absent)."""

    def differs(self, namespace: str, data: Mapping[str, str], models: set[str]) -> set[str]:
        """The models whose key in `data` (the ConfigMap as a watch event shows it) is not what
        the operator last wrote or read: edited or deleted by someone else, never seen yet, or
        the key of a model with no ModelVersions (not in `models`), which must go."""
        changed = {m for m in data if m not in models}
        for model in models | {m for ns, m in self._known if ns == namespace}:
            key = (namespace, model)
            if key not in self._known or self._known[key] != data.get(model):
                changed.add(model)
        return changed

    def forget(self, namespace: str) -> None:
        """The ConfigMap is gone: nothing of it is known any more."""
        for key in [k for k in self._known if k[0] == namespace]:
            del self._known[key]

    async def write(self, namespace: str, model: str, route: ModelRoute | None) -> RouteWrite:
        """Make `model`'s key say `route` (None: no key). Transient API failures raise; a write
        the API server refuses, or one that would not fit, comes back as a problem."""
        path = core_path(namespace, "configmaps", CONFIGMAP_NAME)
        configmap = await self.api.get(path)
        data: dict[str, str] = dict((configmap or {}).get("data") or {})
        old_text = data.get(model)
        before = _parse(model, old_text)
        key = (namespace, model)
        want = dump_model_route(route) if route is not None else None
        if want == old_text:
            self._known[key] = old_text
            return RouteWrite(before, route)
        if want is None:
            del data[model]
        else:
            data[model] = want
            size = data_size(data)
            if size > CONFIGMAP_LIMIT:
                problem = (
                    f"the routes of namespace {namespace} would take {size} bytes in ConfigMap "
                    f"{CONFIGMAP_NAME}, over Kubernetes' limit of {CONFIGMAP_LIMIT} bytes "
                    f"(model {model}: {len(want)} bytes for {len(route.versions) if route else 0} "
                    "Ready versions); shorten endpoints or split models across namespaces"
                )
                log.error("Could not route model %s/%s: %s", namespace, model, problem)
                return RouteWrite(before, before, problem)
        # Known before the write: its watch event may be handled before the write returns.
        self._known[key] = want
        try:
            if configmap is None:
                await self._create(namespace, data)
            elif configmap.get("immutable"):
                await self._replace(namespace, configmap, data)
            else:
                await self.api.merge_patch(path, {"data": {model: want}})
        except KubeApiError as exc:
            self._known[key] = old_text
            problem = f"the API server refused to update ConfigMap {CONFIGMAP_NAME}: {exc}"
            log.warning("Could not route model %s/%s: %s", namespace, model, problem)
            return RouteWrite(before, before, problem)
        except BaseException:
            self._known.pop(key, None)  # unknown: whatever the next event shows is re-checked
            raise
        if route is None:
            log.info(
                "Removed model %s/%s from ConfigMap %s: it has no versions left",
                namespace,
                model,
                CONFIGMAP_NAME,
            )
        else:
            weights = ", ".join(f"{v.name}={v.weight}" for v in route.versions)
            log.info(
                "Routed model %s/%s in ConfigMap %s: %s",
                namespace,
                model,
                CONFIGMAP_NAME,
                weights or "no Ready version",
            )
        if old_text is not None and before is None:
            log.warning(
                "Replaced an invalid entry for model %s/%s in ConfigMap %s",
                namespace,
                model,
                CONFIGMAP_NAME,
            )
        return RouteWrite(before, route)

    def _manifest(self, namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": CONFIGMAP_NAME,
                "namespace": namespace,
                "labels": {LABEL_MANAGED_BY: MANAGED_BY, "app.kubernetes.io/part-of": "modelroll"},
            },
            "data": dict(data),
        }

    async def _create(self, namespace: str, data: Mapping[str, str]) -> None:
        try:
            await self.api.create(
                core_path(namespace, "configmaps"), self._manifest(namespace, data)
            )
        except KubeApiError as exc:
            if exc.status == 409:  # created meanwhile (another operator, a person): patch it
                await self.api.merge_patch(
                    core_path(namespace, "configmaps", CONFIGMAP_NAME), {"data": dict(data)}
                )
                return
            if exc.status == 403 and "being terminated" in exc.message:
                log.info(
                    "Did not create ConfigMap %s/%s: the namespace is being deleted",
                    namespace,
                    CONFIGMAP_NAME,
                )
                return
            raise
        log.info("Created ConfigMap %s/%s", namespace, CONFIGMAP_NAME)

    async def _replace(
        self, namespace: str, configmap: Mapping[str, Any], data: Mapping[str, str]
    ) -> None:
        """An immutable ConfigMap cannot change: delete exactly that one (preconditions: its
        uid and resourceVersion) and create it again, mutable, with `data`."""
        meta = configmap.get("metadata") or {}
        path = core_path(namespace, "configmaps", CONFIGMAP_NAME)
        await self.api.send(
            "DELETE",
            path,
            {
                "preconditions": {
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                },
            },
        )
        await self._create(namespace, data)
        log.warning(
            "Replaced ConfigMap %s/%s: it was immutable, which would have frozen every model's "
            "routes (the gateway may have seen it missing for a moment)",
            namespace,
            CONFIGMAP_NAME,
        )

"""Level-triggered reconciliation of one model: workloads, its routes entry, its versions' status.

kopf's handlers only say *which* model may have changed (a ModelVersion, a managed Deployment or
Service, or the routes ConfigMap moved). A few workers take those models from a de-duplicated
queue and recompute everything from kopf's indices, so bursts collapse into one pass, the same
state always writes the same documents, and a failed pass is retried with backoff until it
succeeds (for example after the API server was away).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from modelroll_gateway.routes import (
    CONFIGMAP_NAME,
    ModelRoute,
    RoutesError,
    VersionRoute,
    configmap_delete_patch,
    configmap_patch,
    dump_model_route,
    parse_model_route,
    validate_model_name,
)

from .kube import UNREACHABLE, Api, KubeApiError, apps_path, core_path, mv_path
from .routing import Candidate, compute_route, route_changes
from .settings import OperatorConfig
from .spec import ANNOTATION_SPEC_HASH, LABEL_MANAGED_BY, MANAGED_BY
from .state import ModelKey, VersionInfo, VersionKey, WorkloadInfo
from .status import Readiness, desired_status, now_rfc3339, status_patch
from .workload import deployment_manifest, selector_string, service_endpoint, service_manifest

log = logging.getLogger("modelroll_operator")

VersionIndex = kopf.Index[ModelKey, VersionInfo]
WorkloadIndex = kopf.Index[VersionKey, WorkloadInfo]
TRANSIENT = (KubeApiError, *UNREACHABLE, TimeoutError)
"""Failures worth a retry: the API said no for now, or could not be reached."""


def _ref(version: VersionInfo) -> dict[str, Any]:
    """The object reference kopf's JSON log formatter puts under "object"."""
    return {"k8s_ref": {"kind": "ModelVersion", "namespace": version.namespace,
                        "name": version.name, "uid": version.uid}}  # fmt: skip


def _refused_for_good(exc: KubeApiError) -> bool:
    """The API server refused the object itself: retrying the same manifest cannot help.

    Server-side apply reports a field it cannot convert (a malformed quantity, say) as a 500
    "failed to convert new object"; invalid values are 422, malformed requests 400.
    """
    return exc.status in (400, 422) or (exc.status == 500 and "failed to convert" in exc.message)


def _first(store: Iterable[WorkloadInfo] | None) -> WorkloadInfo | None:
    return next(iter(store), None) if store is not None else None


class Reconciler:
    """Owns the queue of models to reconcile and the workers that drain it."""

    def __init__(
        self,
        api: Api,
        config: OperatorConfig,
        versions: VersionIndex,
        deployments: WorkloadIndex,
        services: WorkloadIndex,
    ) -> None:
        self.api = api
        self.config = config
        self.versions = versions
        self.deployments = deployments
        self.services = services
        self._queue: asyncio.Queue[ModelKey] = asyncio.Queue()
        self._queued: set[ModelKey] = set()
        self._locks: defaultdict[ModelKey, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._failures: dict[ModelKey, int] = {}
        self._retries: dict[ModelKey, asyncio.TimerHandle] = {}
        self._rejected: dict[ModelKey, dict[tuple[str, str], tuple[str, str]]] = {}
        """Per model, (kind, version name) -> (manifest hash, why the API server refused it)."""
        self._workers: list[asyncio.Task[None]] = []
        self._active = 0

    # -- queue ---------------------------------------------------------------------------

    def start(self) -> None:
        self._workers = [
            asyncio.create_task(self._work(), name=f"modelroll-reconciler-{i}")
            for i in range(self.config.workers)
        ]

    async def stop(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        for task in self._workers:
            task.cancel()
        # Whatever a worker died of, shutting down must not fail (kopf would retry the cleanup).
        await asyncio.gather(*self._workers, return_exceptions=True)

    def enqueue(self, key: ModelKey) -> None:
        """Reconcile this model soon (once, however often it is asked before the pass starts)."""
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def enqueue_namespace(self, namespace: str) -> None:
        """Reconcile every model that has versions in ``namespace``."""
        for key in list(self.versions):
            if key[0] == namespace:
                self.enqueue(key)

    @property
    def pending(self) -> int:
        """Models queued, waiting for a retry, or being reconciled right now."""
        return len(self._queued) + len(self._retries) + self._active

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active += 1
            try:
                await self.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                try:
                    self._retry(key, exc)
                except Exception:  # never let a worker die: the queue would stall
                    log.exception("Scheduling a retry of model %s/%s failed", *key)
            else:
                self._failures.pop(key, None)
            finally:
                self._active -= 1

    def _retry(self, key: ModelKey, exc: Exception) -> None:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.config.retry_max_s, self.config.retry_initial_s * 2**failures)
        what = f"model {key[0]}/{key[1]}"
        if isinstance(exc, TRANSIENT):
            log.warning("Reconciling %s failed (%s); retrying in %.1fs", what, exc, delay)
        else:
            log.exception("Reconciling %s failed; retrying in %.1fs", what, delay)
        if old := self._retries.pop(key, None):
            old.cancel()
        self._retries[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)

    def _fire(self, key: ModelKey) -> None:
        self._retries.pop(key, None)
        self.enqueue(key)

    # -- one pass ------------------------------------------------------------------------

    async def reconcile(self, key: ModelKey) -> None:
        """One full pass over a model; raises when it could not finish."""
        async with self._locks[key]:
            await self._reconcile(key)

    async def _reconcile(self, key: ModelKey) -> None:
        namespace, model = key
        try:
            validate_model_name(model)
        except RoutesError as exc:  # the CRD prevents this; an old object might not
            log.warning("Skipped model %s/%s: %s", namespace, model, exc)
            return
        versions = sorted(self.versions.get(key) or (), key=lambda v: v.name)
        live = [v for v in versions if not v.deleting]
        names = {v.name for v in live}
        rejected = self._rejected.pop(key, {})
        if kept := {k: v for k, v in rejected.items() if k[1] in names}:
            self._rejected[key] = kept
        readiness = {v.name: await self._workload(v) for v in live}
        candidates = []
        for v in live:
            r = readiness[v.name]
            candidates.append(
                Candidate(v.name, v.spec.weight if v.spec else 0, r.endpoint, r.ready)
            )
        route = compute_route(model, candidates)
        before = await self._write_route(namespace, model, route)
        await self._post_route_events(model, before, route, versions)
        now = now_rfc3339()
        for v in live:
            await self._write_status(v, readiness[v.name], route, now)
        log.debug("Reconciled model %s/%s (%d versions)", namespace, model, len(versions))

    # -- routes ---------------------------------------------------------------------------

    async def _write_route(
        self, namespace: str, model: str, route: ModelRoute | None
    ) -> ModelRoute | None:
        """Make the model's key say ``route`` (None: no key); returns what it said before."""
        path = core_path(namespace, "configmaps", CONFIGMAP_NAME)
        configmap = await self.api.get(path)
        data: Mapping[str, Any] = (configmap or {}).get("data") or {}
        old_text = data.get(model)
        before, invalid = None, ""
        if old_text is not None:
            try:
                before = parse_model_route(model, old_text)
            except RoutesError as exc:
                invalid = str(exc)  # rewritten below, since it differs from what we write
        if route is None:
            if old_text is not None:
                await self.api.merge_patch(path, configmap_delete_patch(model))
                log.info(
                    "Removed model %s/%s from ConfigMap %s: it has no versions left",
                    namespace, model, CONFIGMAP_NAME,
                )  # fmt: skip
            return before
        text = dump_model_route(route)
        if configmap is None:
            await self._create_configmap(namespace, {model: text})
        elif old_text != text:
            await self.api.merge_patch(path, configmap_patch(route))
        else:
            return before
        weights = ", ".join(f"{v.name}={v.weight}" for v in route.versions) or "no Ready version"
        log.info(
            "Routed model %s/%s in ConfigMap %s: %s", namespace, model, CONFIGMAP_NAME, weights
        )
        if invalid:
            log.warning(
                "Replaced an invalid entry for model %s/%s in ConfigMap %s: %s",
                namespace, model, CONFIGMAP_NAME, invalid,
            )  # fmt: skip
        return before

    async def _create_configmap(self, namespace: str, data: dict[str, str]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": CONFIGMAP_NAME,
                "namespace": namespace,
                "labels": {LABEL_MANAGED_BY: MANAGED_BY, "app.kubernetes.io/part-of": "modelroll"},
            },
            "data": data,
        }
        try:
            await self.api.create(core_path(namespace, "configmaps"), body)
        except KubeApiError as exc:
            if exc.status == 409:  # created meanwhile (another operator, a person): patch it
                await self.api.merge_patch(
                    core_path(namespace, "configmaps", CONFIGMAP_NAME), {"data": data}
                )
                return
            if exc.status == 403 and "being terminated" in exc.message:
                log.info("Did not create ConfigMap %s/%s: the namespace is being deleted",
                         namespace, CONFIGMAP_NAME)  # fmt: skip
                return
            raise
        log.info("Created ConfigMap %s/%s", namespace, CONFIGMAP_NAME)

    async def _post_route_events(
        self,
        model: str,
        before: ModelRoute | None,
        after: ModelRoute | None,
        versions: list[VersionInfo],
    ) -> None:
        """One event per version whose place in the route changed (best effort)."""
        by_name = {v.name: v for v in versions}
        for change in route_changes(before, after):
            version = by_name.get(change.version)
            if version is None:
                continue
            try:
                await self.api.post_event(
                    version.owner_body(), change.reason(), change.message(model)
                )
            except TRANSIENT as exc:  # events help but must not fail the pass
                log.debug("Could not post an event for %s: %s", version.name, exc)

    async def _warn(self, version: VersionInfo, reason: str, message: str) -> None:
        """A Warning event on the version (best effort)."""
        try:
            await self.api.post_event(version.owner_body(), reason, message, kind="Warning")
        except TRANSIENT as exc:
            log.debug("Could not post an event for %s: %s", version.name, exc)

    # -- status ---------------------------------------------------------------------------

    async def _write_status(
        self, version: VersionInfo, readiness: Readiness, route: ModelRoute | None, now: str
    ) -> None:
        desired = desired_status(
            name=version.name,
            model=version.model,
            generation=version.generation,
            readiness=readiness,
            route=route,
            current=version.status,
            now=now,
        )
        patch = status_patch(version.status, desired)
        if patch is None:
            return
        try:
            await self.api.merge_patch(
                mv_path(version.namespace, version.name, "status"), {"status": patch}
            )
        except KubeApiError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to report on
                raise

    # -- workloads ------------------------------------------------------------------------

    async def _workload(self, version: VersionInfo) -> Readiness:
        """Make the version's workload match its spec; say whether it can serve."""
        spec = version.spec
        if spec is None:
            return Readiness(False, "InvalidSpec", version.spec_error or "invalid spec")
        if spec.server is None:
            await self._remove_workload(version)
            try:
                VersionRoute(version.name, spec.weight, spec.endpoint or "")
            except RoutesError as exc:  # the CRD prevents this; an old object might not
                return Readiness(False, "InvalidSpec", str(exc))
            return Readiness(
                True, "ExternalEndpoint", f"External mode: requests go to {spec.endpoint}",
                endpoint=spec.endpoint,
            )  # fmt: skip
        endpoint = service_endpoint(version.name, version.namespace, self.config.sidecar_port)
        selector = selector_string(spec.model, version.name)
        service = service_manifest(version, self.config)
        applied = await self._ensure(version, service, self.services, "services")
        if not isinstance(applied, Readiness):
            deployment = deployment_manifest(version, self.config)
            applied = await self._ensure(version, deployment, self.deployments, "deployments")
        if isinstance(applied, Readiness):
            return Readiness(
                False, applied.reason, applied.message, endpoint=endpoint, selector=selector
            )
        live = applied or _first(self.deployments.get(version.key))
        replicas = live.replicas if live else 0
        ready = live.ready_replicas if live else 0
        figures = {"replicas": replicas, "ready_replicas": ready}
        if spec.replicas == 0:
            return Readiness(
                False, "ScaledToZero", "spec.replicas is 0: no pod runs the model",
                endpoint=endpoint, selector=selector, **figures,
            )  # fmt: skip
        if ready < 1:
            return Readiness(
                False, "ReplicasNotReady",
                f"{ready} of {spec.replicas} replicas of Deployment {version.name} are ready",
                endpoint=endpoint, selector=selector, **figures,
            )  # fmt: skip
        return Readiness(
            True, "ReplicasReady",
            f"{ready} of {spec.replicas} replicas of Deployment {version.name} are ready",
            endpoint=endpoint, selector=selector, **figures,
        )  # fmt: skip

    async def _ensure(
        self,
        version: VersionInfo,
        manifest: dict[str, Any],
        index: WorkloadIndex,
        plural: str,
    ) -> Readiness | WorkloadInfo | None:
        """Apply ``manifest`` unless the live object already carries its hash.

        Returns a not-Ready Readiness when the object cannot be had (rejected, or someone else's),
        the applied object's snapshot when it was just applied, or None when nothing changed.
        """
        kind = manifest["kind"]
        name = manifest["metadata"]["name"]
        want = manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        make_path = apps_path if plural == "deployments" else core_path
        path = make_path(version.namespace, plural, name)
        seen = _first(index.get(version.key))
        if seen is not None and seen.spec_hash == want and version.uid in seen.owner_uids:
            return None
        if seen is None:
            existing = await self.api.get(path)
            if existing is not None and not self._ours(existing, version):
                return Readiness(
                    False, "WorkloadConflict",
                    f"{kind} {name} already exists and is not managed by this ModelVersion",
                )  # fmt: skip
        rejections = self._rejected.setdefault(version.model_key, {})
        rejected = rejections.get((kind, version.name))
        if rejected is not None and rejected[0] == want:
            return Readiness(False, "InvalidSpec", rejected[1])
        try:
            applied = await self.api.apply(path, manifest)
        except KubeApiError as exc:
            if not _refused_for_good(exc):
                raise
            message = f"The API server rejected {kind} {name}: {exc.message}"
            rejections[(kind, version.name)] = (want, message)
            log.warning("%s; ModelVersion %s/%s stays not Ready until its spec changes",
                        message, version.namespace, version.name, extra=_ref(version))  # fmt: skip
            await self._warn(version, "InvalidSpec", message)
            return Readiness(False, "InvalidSpec", message)
        rejections.pop((kind, version.name), None)
        verb = "Created" if seen is None else "Updated"
        log.info("%s %s %s/%s for ModelVersion %s", verb, kind, version.namespace, name,
                 version.name, extra=_ref(version))  # fmt: skip
        return WorkloadInfo.from_body(kind, applied)

    @staticmethod
    def _ours(obj: Mapping[str, Any], version: VersionInfo) -> bool:
        meta = obj.get("metadata") or {}
        owners = {str(o.get("uid")) for o in meta.get("ownerReferences") or []}
        labels = meta.get("labels") or {}
        return version.uid in owners or labels.get(LABEL_MANAGED_BY) == MANAGED_BY

    async def _remove_workload(self, version: VersionInfo) -> None:
        """External mode: delete a Deployment and Service left from managed mode."""
        for index, plural, make_path in (
            (self.deployments, "deployments", apps_path),
            (self.services, "services", core_path),
        ):
            seen = _first(index.get(version.key))
            if seen is None or version.uid not in seen.owner_uids:
                continue
            if await self.api.delete(make_path(version.namespace, plural, seen.name)):
                log.info(
                    "Deleted %s %s/%s: ModelVersion %s is in external mode now",
                    seen.kind, version.namespace, seen.name, version.name, extra=_ref(version),
                )  # fmt: skip

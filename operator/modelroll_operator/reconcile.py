"""Level-triggered reconciliation of one model: workloads, its routes entry, its versions' status.

kopf's handlers only say *which* model may have changed (a ModelVersion, a managed Deployment or
Service, or the routes ConfigMap moved). The models go into a work queue (queue.py) whose workers
recompute everything from kopf's indices, so bursts collapse into one pass, the same state always
writes the same documents, and a failed pass is retried with backoff until it succeeds (for
example after the API server was away).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from modelroll_common.routes import ModelRoute, RoutesError, VersionRoute, validate_model_name

from .api import UNREACHABLE, Api, KubeApiError, apps_path, core_path, mv_path
from .config import OperatorConfig
from .httproute import HTTPRouteInfo, HTTPRoutes, RouteChanged
from .manifests import (
    conflict,
    deployment_manifest,
    selector_string,
    service_endpoint,
    service_manifest,
)
from .planes import DataPlane, PlaneKind, Planes
from .planes.configmap import ConfigMapKind
from .planes.httproute import HTTPRouteKind, indexed
from .pod_security import forbidden
from .queue import Backoff, WorkQueue
from .routes_configmap import RoutesConfigMap
from .routing import Candidate, RouteWrite, compute_route, route_changes
from .snapshots import ModelKey, VersionInfo, VersionKey, WorkloadInfo
from .spec import ANNOTATION_SPEC_HASH, LABEL_MANAGED_BY, MANAGED_BY
from .status import Readiness, ReadyReason, desired_status, now_rfc3339, status_patch

log = logging.getLogger("modelroll_operator")

VersionIndex = kopf.Index[ModelKey, VersionInfo]
WorkloadIndex = kopf.Index[VersionKey, WorkloadInfo]
HTTPRouteIndex = kopf.Index[ModelKey, HTTPRouteInfo]
TRANSIENT = (KubeApiError, *UNREACHABLE, TimeoutError, RouteChanged)
"""Failures worth a retry: the API said no for now, or could not be reached, or an HTTPRoute
changed while the pass wrote it."""
RESYNC_S = 600.0
"""How often every managed object is applied again, whatever the watches said (drift that no
watch event shows, such as a label removed by hand, is undone within this time)."""
WARN_EVERY_S = 300.0
"""A version's repeated Warning event (same reason) is posted at most this often."""
MAX_EVENTS_PER_PASS = 10
"""Routing events per model and pass; more changes than this are logged, not posted."""


@dataclass(frozen=True)
class PassResult:
    """What a pass over a model achieved."""

    in_force: ModelRoute | None
    """The model's route as the gateway has it after the pass."""
    problems: tuple[str, ...] = ()
    """What could not be done (the pass did everything else); the model is tried again."""


class PassIncomplete(Exception):
    """A pass did all it could, but some of it failed; the message lists what."""


def _ref(version: VersionInfo) -> dict[str, Any]:
    """The object reference kopf's JSON log formatter puts under "object"."""
    return {
        "k8s_ref": {
            "kind": "ModelVersion",
            "namespace": version.namespace,
            "name": version.name,
            "uid": version.uid,
        }
    }


PERMANENT_500S = ("failed to convert", "duplicate entries for key")
"""Server-side apply's 500s about the object itself: a field it cannot convert (a malformed
quantity), or a list whose keys repeat (two equal imagePullSecrets, an init container's env
naming a variable twice)."""


def _refused_for_good(exc: KubeApiError) -> bool:
    """The API server refused the object itself: retrying the same manifest cannot help.
    Invalid values are 422, malformed requests 400, and some faults server-side apply's 500."""
    return exc.status in (400, 422) or (
        exc.status == 500 and any(text in exc.message for text in PERMANENT_500S)
    )


def _first(store: Iterable[WorkloadInfo] | None) -> WorkloadInfo | None:
    return next(iter(store), None) if store is not None else None


def _candidate(version: VersionInfo, readiness: Readiness, plane: DataPlane) -> Candidate:
    """The version as its model's route may hold it, with what ``plane`` can do: a cohort
    header and a shadow share only where the plane honours them."""
    spec = version.spec
    header = spec.cohort_header if spec and plane.sticky_cohorts else None
    shadow = spec.shadow_percent if spec and plane.shadow_copies else 0
    weight = spec.weight if spec else 0
    return Candidate(version.name, weight, readiness.endpoint, readiness.ready, header, shadow)


class Reconciler:
    """Reconciles models: a pass over one model, and the work queue that schedules the passes."""

    def __init__(
        self,
        api: Api,
        config: OperatorConfig,
        versions: VersionIndex,
        deployments: WorkloadIndex,
        services: WorkloadIndex,
        httproutes: HTTPRouteIndex | None = None,
        *,
        resync_s: float = RESYNC_S,
    ) -> None:
        self.api = api
        self.config = config
        self.versions = versions
        self.deployments = deployments
        self.services = services
        self.routes = RoutesConfigMap(api)
        kinds: list[PlaneKind] = []
        if httproutes is not None:
            kinds.append(HTTPRouteKind(indexed(httproutes), HTTPRoutes(api)))
        kinds.append(ConfigMapKind(self.routes))  # last: it routes every model no other claims
        self.planes = Planes(kinds, config.sidecar_port)
        """The data planes a model's route can be in (planes/), chosen once per pass."""
        self._claimed: dict[tuple[str, str], str] = {}
        """Per HTTPRoute (namespace, name), the model it claimed when last seen."""
        self.passes = 0
        """Passes started since the operator started (the liveness probe shows it)."""
        self._applied: dict[tuple[str, str, str], str] = {}
        """Per managed object (kind, namespace, name), its revision right after the operator
        applied it: any other revision means someone else changed it."""
        self._warned: dict[VersionKey, tuple[str, float]] = {}
        self._locks: defaultdict[ModelKey, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._queue = WorkQueue(
            self._process,
            self._failed,
            workers=config.workers,
            backoff=Backoff(config.retry_initial_s, config.retry_max_s),
            resync_s=resync_s,
            resync=self._resync,
            name="modelroll-reconciler",
        )
        self._rejected: dict[ModelKey, dict[tuple[str, str], tuple[str, str]]] = {}
        """Per model, (kind, version name) -> (manifest hash, why the API server refused it)."""

    def start(self) -> None:
        self._queue.start()

    async def stop(self) -> None:
        await self._queue.stop()

    def enqueue(self, key: ModelKey) -> None:
        """Reconcile this model soon (once, however often it is asked before the pass starts)."""
        self._queue.add(key)

    def _resync(self) -> list[ModelKey]:
        self._applied.clear()  # every managed object is applied once more
        return list(self.versions)

    def routes_changed(self, namespace: str, data: Mapping[str, str] | None) -> None:
        """The routes ConfigMap of ``namespace`` changed (None: it was deleted). Reconcile the
        models whose key is not what the operator wrote: the operator's own writes re-queue
        nothing, a hand edit re-queues the models it touched, and a key of a model without
        ModelVersions is removed by its (empty) model's pass."""
        models = {
            key[1] for key, store in list(self.versions.items()) if key[0] == namespace and store
        }
        if data is None:
            self.routes.forget(namespace)
            data = {}
        for model in self.routes.differs(namespace, data, models):
            self.enqueue((namespace, model))

    def httproute_changed(self, namespace: str, name: str, model: str | None) -> None:
        """An HTTPRoute claiming ``model`` changed (None: it claims none any more, or is gone):
        reconcile that model, and the one it claimed before if that was another."""
        before = self._claimed.pop((namespace, name), None)
        if model is not None:
            self._claimed[(namespace, name)] = model
        for each in {before, model} - {None}:
            self.enqueue((namespace, str(each)))

    @property
    def pending(self) -> int:
        """Models queued, waiting for a retry, or being reconciled right now."""
        return self._queue.pending

    async def _process(self, key: ModelKey) -> None:
        result = await self.reconcile(key)
        if result.problems:
            raise PassIncomplete("; ".join(result.problems))

    def _failed(self, key: ModelKey, exc: Exception, delay: float) -> None:
        what = f"model {key[0]}/{key[1]}"
        if isinstance(exc, PassIncomplete):
            log.warning("Reconciled %s but for: %s; retrying in %.1fs", what, exc, delay)
        elif isinstance(exc, TRANSIENT):
            log.warning("Reconciling %s failed (%s); retrying in %.1fs", what, exc, delay)
        else:
            log.exception("Reconciling %s failed; retrying in %.1fs", what, delay)

    # -- one pass ------------------------------------------------------------------------

    async def reconcile(self, key: ModelKey) -> PassResult:
        """One full pass over a model. What fails for one version (its workload refused, its
        status not written) or for the route is reported in the result and on the versions, and
        the rest of the pass goes on; it raises only when the API server cannot be reached."""
        async with self._locks[key]:
            return await self._reconcile(key)

    async def _reconcile(self, key: ModelKey) -> PassResult:
        self.passes += 1
        namespace, model = key
        try:
            validate_model_name(model)
        except RoutesError as exc:  # the CRD prevents this; an old object might not
            log.warning("Skipped model %s/%s: %s", namespace, model, exc)
            return PassResult(None)
        versions = sorted(self.versions.get(key) or (), key=lambda v: v.name)
        live = [v for v in versions if not v.deleting]
        names = {v.name for v in live}
        rejected = self._rejected.pop(key, {})
        if kept := {k: v for k, v in rejected.items() if k[1] in names}:
            self._rejected[key] = kept
        problems: list[str] = []
        readiness = {v.name: await self._workload(v, problems) for v in live}
        plane = await self.planes.choose(key, self.planes.backends(live))
        endpoints = {n: r.endpoint for n, r in readiness.items() if r.endpoint}
        candidates = []
        for v in live:
            r = readiness[v.name]
            if r.ready and (unroutable := plane.unroutable(v.name)) is not None:
                r = readiness[v.name] = Readiness(
                    False, "NoBackendRef", unroutable, endpoint=r.endpoint
                )
            candidates.append(_candidate(v, r, plane))
        route = compute_route(model, candidates)
        problems.extend(await self.planes.release_others(plane, key))
        written = await plane.write(route, endpoints)
        if written.problem is not None:
            problems.append(written.problem)
        await self._post_route_events(model, written.before, written.in_force, versions)
        now = now_rfc3339()
        for v in live:
            try:
                await self._write_status(v, readiness[v.name], written, now)
            except KubeApiError as exc:
                problems.append(f"status of {v.name}: {exc}")
        log.debug("Reconciled model %s/%s (%d versions)", namespace, model, len(versions))
        return PassResult(written.in_force, tuple(problems))

    async def _post_route_events(
        self,
        model: str,
        before: ModelRoute | None,
        after: ModelRoute | None,
        versions: list[VersionInfo],
    ) -> None:
        """One event per version whose own place in the route changed: routed, unrouted, a new
        weight or endpoint (best effort). A share that moved only because another version
        changed gets none: one change to a model of 300 versions posts one event, not 300."""
        by_name = {v.name: v for v in versions}
        changes = [c for c in route_changes(before, after) if c.own]
        if len(changes) > MAX_EVENTS_PER_PASS:
            log.info(
                "%d versions of model %s changed their routing at once; events are posted for "
                "the first %d",
                len(changes),
                model,
                MAX_EVENTS_PER_PASS,
            )
        for change in changes[:MAX_EVENTS_PER_PASS]:
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
        """A Warning event on the version (best effort), at most every WARN_EVERY_S for the
        same reason, so that a failure retried with backoff does not flood the namespace."""
        now = time.monotonic()
        last = self._warned.get(version.key)
        if last is not None and last[0] == reason and now - last[1] < WARN_EVERY_S:
            return
        self._warned[version.key] = (reason, now)
        try:
            await self.api.post_event(version.owner_body(), reason, message, kind="Warning")
        except TRANSIENT as exc:
            log.debug("Could not post an event for %s: %s", version.name, exc)

    # -- status ---------------------------------------------------------------------------

    async def _write_status(
        self, version: VersionInfo, readiness: Readiness, written: RouteWrite, now: str
    ) -> None:
        desired = desired_status(
            name=version.name,
            model=version.model,
            generation=version.generation,
            readiness=readiness,
            route=written.in_force,
            current=version.status,
            now=now,
            route_problem=written.problem,
            httproute=written.httproute,
            acceptance=written.acceptance,
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

    async def _workload(self, version: VersionInfo, problems: list[str]) -> Readiness:
        """Make the version's workload match its spec; say whether it can serve. What the API
        server refuses goes into `problems` and the version's Ready condition, never further:
        the model's other versions and its route go on."""
        spec = version.spec
        if spec is None:
            return Readiness(False, "InvalidSpec", version.spec_error or "invalid spec")
        if spec.server is None:
            try:
                await self._remove_workload(version)
            except KubeApiError as exc:  # left over, but the version is served elsewhere
                problems.append(f"removing the workload of {version.name}: {exc}")
            try:
                VersionRoute(version.name, spec.weight, spec.endpoint or "")
            except RoutesError as exc:  # the CRD prevents this; an old object might not
                return Readiness(False, "InvalidSpec", str(exc))
            message = f"External mode: requests go to {spec.endpoint}"
            if ignored := spec.ignored_settings():
                verb = "is" if len(ignored) == 1 else "are"
                note = (
                    f"{', '.join(ignored)} {verb} ignored: an external version runs no "
                    "modelroll sidecar"
                )
                message = f"{message}; {note}"
                await self._warn(version, "SettingsIgnored", note)
            return Readiness(True, "ExternalEndpoint", message, endpoint=spec.endpoint)
        endpoint = service_endpoint(version.name, version.namespace, self.config.sidecar_port)
        selector = selector_string(spec.model, version.name)
        clash = conflict(spec.server, self.config.sidecar_port) or forbidden(
            spec.server.baseline_violations, self.config.pod_security
        )
        if clash is not None:
            await self._warn(version, "InvalidSpec", clash)
            return self._not_applied(version, "InvalidSpec", clash, endpoint, selector)
        try:
            # The Deployment first: a version whose pods the API server refuses gets no Service.
            deployment = deployment_manifest(version, self.config)
            applied = await self._ensure(version, deployment, self.deployments, "deployments")
            if not isinstance(applied, Readiness):
                service = service_manifest(version, self.config)
                refused = await self._ensure(version, service, self.services, "services")
                if isinstance(refused, Readiness):
                    applied = refused
        except KubeApiError as exc:
            problems.append(f"workload of {version.name}: {exc}")
            return await self._refused(version, exc, endpoint, selector)
        if isinstance(applied, Readiness):
            return self._not_applied(version, applied.reason, applied.message, endpoint, selector)
        live = applied or _first(self.deployments.get(version.key))
        replicas = live.replicas if live else 0
        ready = live.ready_replicas if live else 0
        figures = {"replicas": replicas, "ready_replicas": ready}
        if spec.replicas == 0:
            return Readiness(
                False,
                "ScaledToZero",
                "spec.replicas is 0: no pod runs the model",
                endpoint=endpoint,
                selector=selector,
                **figures,
            )
        message = f"{ready} of {spec.replicas} replicas of Deployment {version.name} are ready"
        failure = live.failure if live else None
        if failure is not None:
            message = f"{message}; the ReplicaSet cannot create pods: {failure}"
            await self._warn(version, "PodsRefused", message)
        if ready < 1:
            reason: ReadyReason = "PodsRefused" if failure is not None else "ReplicasNotReady"
            return Readiness(
                False, reason, message, endpoint=endpoint, selector=selector, **figures
            )
        return Readiness(
            True, "ReplicasReady", message, endpoint=endpoint, selector=selector, **figures
        )

    def _not_applied(
        self,
        version: VersionInfo,
        reason: ReadyReason,
        message: str,
        endpoint: str,
        selector: str,
    ) -> Readiness:
        """The version's new spec cannot be applied: for good (InvalidSpec: the operator or the
        API server refuses it), or because its workload is someone else's. A refused edit never
        changes what serves: a version whose earlier pods still serve stays Ready on them."""
        if reason == "InvalidSpec":
            why = f"The new spec is not applied until it changes: {message}"
            if kept := self._on_previous_spec(version, why, endpoint, selector):
                return kept
        return Readiness(False, reason, message, endpoint=endpoint, selector=selector)

    async def _refused(
        self, version: VersionInfo, exc: KubeApiError, endpoint: str, selector: str
    ) -> Readiness:
        """The API server refused the version's Service or Deployment for now (a quota, an
        admission webhook, a conflict): tried again with backoff. A version whose earlier
        workload still serves stays Ready on it; one that never ran is not Ready."""
        message = f"The API server refused the workload of ModelVersion {version.name}: {exc}"
        log.warning("%s; trying again", message, extra=_ref(version))
        await self._warn(version, "WorkloadRefused", message)
        if kept := self._on_previous_spec(version, message, endpoint, selector):
            return kept
        return Readiness(False, "WorkloadRefused", message, endpoint=endpoint, selector=selector)

    def _on_previous_spec(
        self, version: VersionInfo, why: str, endpoint: str, selector: str
    ) -> Readiness | None:
        """UpdateRefused when the version's Deployment (its own) and Service exist and a pod of
        it is ready, so that it stays routed on its previous spec; else None."""
        deployment = _first(self.deployments.get(version.key))
        service = _first(self.services.get(version.key))
        if deployment is None or service is None or deployment.ready_replicas < 1:
            return None
        if version.uid not in deployment.owner_uids:
            return None
        return Readiness(
            True,
            "UpdateRefused",
            f"{deployment.ready_replicas} of {deployment.replicas} replicas of Deployment "
            f"{version.name} are ready, running its previous spec. {why}",
            endpoint=endpoint,
            selector=selector,
            replicas=deployment.replicas,
            ready_replicas=deployment.ready_replicas,
        )

    async def _ensure(
        self,
        version: VersionInfo,
        manifest: dict[str, Any],
        index: WorkloadIndex,
        plural: str,
    ) -> Readiness | WorkloadInfo | None:
        """Apply ``manifest`` (server-side apply, the operator's field manager, forced) unless
        the live object carries its hash and nobody else has changed it since the operator last
        applied it. So hand changes (an image, a replica count, a selector) are undone as soon
        as their watch event arrives, and once after every start and resync.

        Returns a not-Ready Readiness when the object cannot be had (rejected, or someone else's),
        the applied object's snapshot when it was just applied, or None when nothing changed.
        Raises KubeApiError when the API server refuses it for now.
        """
        kind = manifest["kind"]
        name = manifest["metadata"]["name"]
        want = manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        make_path = apps_path if plural == "deployments" else core_path
        path = make_path(version.namespace, plural, name)
        seen = _first(index.get(version.key))
        ident = (kind, version.namespace, name)
        if (
            seen is not None
            and seen.spec_hash == want
            and version.uid in seen.owner_uids
            and self._applied.get(ident) == seen.revision
        ):
            return None
        if seen is None:
            existing = await self.api.get(path)
            if existing is not None and not self._ours(existing, version):
                return Readiness(
                    False,
                    "WorkloadConflict",
                    f"{kind} {name} already exists and is not managed by this ModelVersion",
                )
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
            log.warning(
                "%s; ModelVersion %s/%s stays not Ready until its spec changes",
                message,
                version.namespace,
                version.name,
                extra=_ref(version),
            )
            await self._warn(version, "InvalidSpec", message)
            return Readiness(False, "InvalidSpec", message)
        rejections.pop((kind, version.name), None)
        info = WorkloadInfo.from_body(kind, applied)
        if info is None:
            return None
        self._applied[ident] = info.revision
        why = ""
        if seen is None:
            verb = "Created"
        elif seen.resource_version == info.resource_version:
            return info  # it already was as the operator wants it
        elif seen.spec_hash == want:
            verb, why = "Restored", ": someone else had changed it"
        else:
            verb = "Updated"
        log.info(
            "%s %s %s/%s for ModelVersion %s%s",
            verb,
            kind,
            version.namespace,
            name,
            version.name,
            why,
            extra=_ref(version),
        )
        return info

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
                    seen.kind,
                    version.namespace,
                    seen.name,
                    version.name,
                    extra=_ref(version),
                )

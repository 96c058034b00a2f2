"""Level-triggered reconciliation of one model: workloads, its route, its versions' status.

A pass decides, then applies, each step in turn: each version's workload (``workloads.plan``,
then :class:`~.workloads.Workloads`), the model's data plane (planes/, chosen once per pass)
and its route there (:func:`plan_route`; with scale before shift, capacity.py decides whether
its new weights go in force yet, and a version whose share rises gets its replicas first;
then the plane's write), and each version's status (``status.desired_status``, then a merge
patch when it differs).

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
from dataclasses import dataclass, replace

import kopf

from modelroll_common.routes import ModelRoute, RoutesError, validate_model_name

from .api import UNREACHABLE, Api, KubeApiError, mv_path
from .autoscaling import Autoscalers
from .capacity import CapacityStatus, Decision, Floor, Member, Verdict, decide
from .config import OperatorConfig
from .httproute import HTTPRouteInfo, HTTPRoutes, RouteChanged
from .planes import DataPlane, PlaneKind, Planes
from .planes.configmap import ConfigMapKind
from .planes.httproute import HTTPRouteKind, indexed
from .queue import Backoff, WorkQueue
from .routes_configmap import RoutesConfigMap
from .routing import Candidate, RouteWrite, compute_route, route_changes
from .schema import decode
from .snapshots import ModelKey, VersionInfo, VersionKey, WorkloadInfo
from .status import (
    CAPACITY,
    ROUTED,
    Autoscaling,
    Readiness,
    desired_status,
    now_rfc3339,
    status_patch,
)
from .workloads import Managed, Workloads, plan

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


def plan_route(
    model: str, live: Iterable[VersionInfo], readiness: Mapping[str, Readiness], plane: DataPlane
) -> tuple[dict[str, Readiness], ModelRoute | None]:
    """The model's route in ``plane``, from its versions and whether each can serve: a Ready
    version the plane cannot route is not Ready (NoBackendRef), and a cohort header and
    shadow shares go into the route only where the plane honours them."""
    readiness = dict(readiness)
    candidates = []
    for v in live:
        r = readiness[v.name]
        if r.ready and (unroutable := plane.unroutable(v.name)) is not None:
            r = readiness[v.name] = Readiness(
                False, "NoBackendRef", unroutable, endpoint=r.endpoint
            )
        spec = v.spec
        header = spec.cohort_header if spec and plane.sticky_cohorts else None
        shadow = spec.shadow_percent if spec and plane.shadow_copies else 0
        weight = spec.weight if spec else 0
        # Scaled to zero, or woken from it and no replica Ready yet: on standby.
        standby = plane.pinning and (
            r.reason == "ScaledToZero" or (not r.ready and _reason(v, ROUTED) == "ScaledToZero")
        )
        candidates.append(
            Candidate(v.name, weight, r.endpoint, r.ready, header, shadow, standby=standby)
        )
    return readiness, compute_route(model, candidates)


def stored_floor(version: VersionInfo) -> Floor | None:
    """The version's floor as its status holds it (status.capacity), if it holds a valid one."""
    raw = version.status.get("capacity")
    if not isinstance(raw, Mapping):
        return None
    try:
        return Floor.from_status(decode(CapacityStatus, raw, "status.capacity"))
    except ValueError:  # edited by hand: no floor, as if none was kept
        return None


def in_force(versions: Iterable[VersionInfo]) -> dict[str, int]:
    """The weights the model's route in force gives its versions, as their statuses say."""
    weights = {}
    for v in versions:
        weight = v.status.get("routedWeight")
        if isinstance(weight, int) and not isinstance(weight, bool):
            weights[v.name] = weight
    return weights


def member(version: VersionInfo, readiness: Readiness, live: WorkloadInfo | None) -> Member:
    """A managed version as capacity.py decides about it."""
    spec = version.spec
    assert spec is not None
    return Member(
        name=version.name,
        replicas=spec.replicas,
        ready=readiness.ready_replicas or 0,
        floor=stored_floor(version),
        delay_s=spec.scale_down_delay_seconds,
        max_replicas=spec.scaling.max_replicas if spec.scaling else None,
        failure=live.failure if live else None,
    )


def held(route: ModelRoute, weights: Mapping[str, int]) -> ModelRoute:
    """``route`` with the weights in force kept: what it routes to, and how, changes; how much
    each version gets waits (a version new to the route gets weight 0 meanwhile; one on
    standby keeps 0)."""
    versions = tuple(
        v if v.standby else replace(v, weight=weights.get(v.name, 0)) for v in route.versions
    )
    return replace(route, versions=versions)


def _reason(version: VersionInfo, kind: str) -> str | None:
    """The reason of the version's ``kind`` condition as stored."""
    for c in version.status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return str(c.get("reason"))
    return None


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
        self._warned: dict[VersionKey, tuple[str, float]] = {}
        self._timers: dict[ModelKey, tuple[float, asyncio.TimerHandle]] = {}
        """Per model, when its next floor ends and the pass then queued."""
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
        self.workloads = Workloads(api, deployments, services, self._warn)
        self.autoscalers = Autoscalers(api, config)

    def start(self) -> None:
        self._queue.start()

    async def stop(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        await self._queue.stop()

    def enqueue(self, key: ModelKey) -> None:
        """Reconcile this model soon (once, however often it is asked before the pass starts)."""
        self._queue.add(key)

    def _resync(self) -> list[ModelKey]:
        self.workloads.forget_applied()  # every managed object is applied once more
        self.autoscalers.forget_applied()
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
        self.workloads.keep_rejections(key, {v.name for v in live})
        problems: list[str] = []
        floors = {v.name: f.replicas if (f := stored_floor(v)) else 0 for v in live}
        plans = {v.name: plan(v, self.config, floors[v.name]) for v in live}
        readiness = {
            v.name: await self.workloads.reconcile(v, plans[v.name], problems) for v in live
        }
        plane = await self.planes.choose(key, self.planes.backends(live))
        readiness, route = plan_route(model, live, readiness, plane)
        decision = None
        managed = [v for v in live if isinstance(plans[v.name], Managed)]
        if self.config.scale_before_shift and route is not None:
            members = [
                member(v, readiness[v.name], next(iter(self.deployments.get(v.key) or ()), None))
                for v in managed
            ]
            # A version on standby is routed at weight 0 while its spec's weight waits for a
            # replica: the decision sees that weight, so that raising it wakes the version.
            weights_of = {v.name: v.spec.weight for v in live if v.spec is not None}
            wanted = {
                v.name: weights_of.get(v.name, 0) if v.standby else v.weight for v in route.versions
            }
            weights = in_force(live)
            decision = decide(model, members, wanted, weights, time.time())
            if not decision.shift:
                route = held(route, weights)
                log.info(
                    "Model %s/%s waits for replicas: %s",
                    namespace,
                    model,
                    "; ".join(decision.waiting),
                )
            await self._apply_floors(managed, floors, decision, problems)
            self._wake_at(key, decision.next_change())
        autoscaling: dict[str, Autoscaling | None] = {}
        for v in live:
            verdict = decision.verdicts.get(v.name) if decision else None
            floor = verdict.floor.replicas if verdict and verdict.floor else 0
            try:
                autoscaling[v.name] = await self.autoscalers.reconcile(v, floor)
            except KubeApiError as exc:
                problems.append(f"autoscaler of {v.name}: {exc}")
                autoscaling[v.name] = None
        endpoints = {n: r.endpoint for n, r in readiness.items() if r.endpoint}
        problems.extend(await self.planes.release_others(plane, key))
        written = await plane.write(route, endpoints)
        if written.problem is not None:
            problems.append(written.problem)
        await self._post_route_events(model, written.before, written.in_force, versions)
        now = now_rfc3339()
        for v in live:
            verdict = decision.verdicts.get(v.name) if decision else None
            try:
                await self._write_status(
                    v, readiness[v.name], written, now, verdict, autoscaling.get(v.name)
                )
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

    # -- capacity -------------------------------------------------------------------------

    async def _apply_floors(
        self,
        managed: list[VersionInfo],
        floors: Mapping[str, int],
        decision: Decision,
        problems: list[str],
    ) -> None:
        """Apply again the workload of each version whose floor moved, and say on each version
        that starts to wait for replicas what for (an event, once)."""
        for v in managed:
            verdict = decision.verdicts[v.name]
            floor = verdict.floor.replicas if verdict.floor else 0
            if floor != floors[v.name]:
                await self.workloads.reconcile(v, plan(v, self.config, floor), problems)
            if not verdict.ready and _reason(v, CAPACITY) != verdict.reason:
                await self._post(v, verdict)

    async def _post(self, version: VersionInfo, verdict: Verdict) -> None:
        kind = "Warning" if verdict.reason == "ReplicasUnavailable" else "Normal"
        try:
            await self.api.post_event(
                version.owner_body(), verdict.reason, verdict.message, kind=kind
            )
        except TRANSIENT as exc:  # events help but must not fail the pass
            log.debug("Could not post an event for %s: %s", version.name, exc)

    def _wake_at(self, key: ModelKey, at: float | None) -> None:
        """Reconcile the model again when its next floor ends (the last such call wins)."""
        current = self._timers.get(key)
        if current is not None and current[0] == at:
            return
        if current is not None:
            current[1].cancel()
            del self._timers[key]
        if at is None:
            return
        delay = max(0.0, at - time.time()) + 1.0  # a second late: the floor has surely ended
        handle = asyncio.get_running_loop().call_later(delay, self._woken, key)
        self._timers[key] = (at, handle)

    def _woken(self, key: ModelKey) -> None:
        self._timers.pop(key, None)
        self.enqueue(key)

    # -- status ---------------------------------------------------------------------------

    async def _write_status(
        self,
        version: VersionInfo,
        readiness: Readiness,
        written: RouteWrite,
        now: str,
        capacity: Verdict | None = None,
        autoscaling: Autoscaling | None = None,
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
            capacity=capacity,
            autoscaling=autoscaling,
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

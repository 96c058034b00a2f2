"""One version's workload in a pass: what it should be (``plan``, pure), and making it so
(:class:`Workloads`, the API calls).

A plan is one of a small set of typed outcomes (:data:`WorkloadPlan`): a spec that did not
parse, an external version (no workload of its own), a spec the operator refuses, or a managed
version's Deployment and Service manifests (manifests.py). Applying it says whether the version
can serve (a Readiness); what the API server refuses goes into the version's Ready condition
and the pass's problems, never further: the model's other versions and its route go on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from modelroll_common.routes import RoutesError, VersionRoute

from .api import Api, KubeApiError, apps_path, core_path
from .config import OperatorConfig
from .manifests import (
    conflict,
    deployment_manifest,
    selector_string,
    service_endpoint,
    service_manifest,
)
from .pod_security import forbidden
from .snapshots import ModelKey, VersionInfo, VersionKey, WorkloadInfo
from .spec import ANNOTATION_SPEC_HASH, LABEL_MANAGED_BY, MANAGED_BY, ModelVersionSpec
from .status import Readiness, ReadyReason

log = logging.getLogger("modelroll_operator")

ByVersion = Mapping[VersionKey, Iterable[WorkloadInfo]]
"""Managed Deployments (or Services) by version, as kopf's index holds them."""
Warn = Callable[[VersionInfo, str, str], Awaitable[None]]
"""Posts a Warning event on a version: its reason and message."""

PERMANENT_500S = ("failed to convert", "duplicate entries for key")
"""Server-side apply's 500s about the object itself: a field it cannot convert (a malformed
quantity), or a list whose keys repeat (two equal imagePullSecrets, an init container's env
naming a variable twice)."""


def log_ref(version: VersionInfo) -> dict[str, Any]:
    """The object reference kopf's JSON log formatter puts under "object"."""
    return {
        "k8s_ref": {
            "kind": "ModelVersion",
            "namespace": version.namespace,
            "name": version.name,
            "uid": version.uid,
        }
    }


def _refused_for_good(exc: KubeApiError) -> bool:
    """The API server refused the object itself: retrying the same manifest cannot help.
    Invalid values are 422, malformed requests 400, and some faults server-side apply's 500."""
    return exc.status in (400, 422) or (
        exc.status == 500 and any(text in exc.message for text in PERMANENT_500S)
    )


def _first(store: Iterable[WorkloadInfo] | None) -> WorkloadInfo | None:
    return next(iter(store), None) if store is not None else None


# -- the plan (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Unparsed:
    """The spec did not parse: not Ready, nothing applied."""

    message: str


@dataclass(frozen=True)
class External:
    """External mode: no workload of its own (one left from managed mode goes)."""

    readiness: Readiness
    ignored: str | None = None
    """Why settings of the spec do nothing (a Warning event), if some do."""


@dataclass(frozen=True)
class Refused:
    """The operator refuses the spec (a port or name it takes, a pod-security violation)."""

    message: str
    endpoint: str
    selector: str


@dataclass(frozen=True)
class Managed:
    """Managed mode: the Deployment and the Service to apply, in that order."""

    spec: ModelVersionSpec
    deployment: dict[str, Any]
    service: dict[str, Any]
    endpoint: str
    selector: str


WorkloadPlan = Unparsed | External | Refused | Managed


def plan(version: VersionInfo, config: OperatorConfig, floor: int = 0) -> WorkloadPlan:
    """What the version's workload should be, from its spec and ``floor``, the replicas its
    share of the model's traffic needs at least (capacity.py)."""
    spec = version.spec
    if spec is None:
        return Unparsed(version.spec_error or "invalid spec")
    if spec.server is None:
        try:
            VersionRoute(version.name, spec.weight, spec.endpoint or "")
        except RoutesError as exc:  # the CRD prevents this; an old object might not
            return External(Readiness(False, "InvalidSpec", str(exc)))
        message = f"External mode: requests go to {spec.endpoint}"
        note = None
        if ignored := spec.ignored_settings():
            verb = "is" if len(ignored) == 1 else "are"
            note = (
                f"{', '.join(ignored)} {verb} ignored: an external version runs no modelroll "
                "sidecar"
            )
            message = f"{message}; {note}"
        return External(Readiness(True, "ExternalEndpoint", message, endpoint=spec.endpoint), note)
    endpoint = service_endpoint(version.name, version.namespace, config.sidecar_port)
    selector = selector_string(spec.model, version.name)
    clash = conflict(spec.server, config.sidecar_port) or forbidden(
        spec.server.baseline_violations, config.pod_security
    )
    if clash is not None:
        return Refused(clash, endpoint, selector)
    return Managed(
        spec,
        deployment_manifest(version, config, floor),
        service_manifest(version, config),
        endpoint,
        selector,
    )


def serving(
    version: str, managed: Managed, live: WorkloadInfo | None
) -> tuple[Readiness, str | None]:
    """Whether a managed version whose workload is applied can serve, from its Deployment as
    last seen; and the Warning to post, if its pods cannot be created."""
    replicas = live.replicas if live else 0
    ready = live.ready_replicas if live else 0
    figures: dict[str, Any] = {
        "endpoint": managed.endpoint,
        "selector": managed.selector,
        "replicas": replicas,
        "ready_replicas": ready,
    }
    planned = int(managed.deployment["spec"]["replicas"])
    if planned == 0:
        return Readiness(
            False, "ScaledToZero", "spec.replicas is 0: no pod runs the model", **figures
        ), None
    message = f"{ready} of {planned} replicas of Deployment {version} are ready"
    failure = live.failure if live else None
    if failure is not None:
        message = f"{message}; the ReplicaSet cannot create pods: {failure}"
    if ready < 1:
        reason: ReadyReason = "PodsRefused" if failure is not None else "ReplicasNotReady"
        return Readiness(False, reason, message, **figures), message if failure else None
    return Readiness(True, "ReplicasReady", message, **figures), message if failure else None


# -- applying it ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Unchanged:
    """The live object is as the operator applied it: nothing was sent."""


@dataclass(frozen=True)
class Applied:
    """The object was applied; what the API server answered (None: not a workload)."""

    info: WorkloadInfo | None


@dataclass(frozen=True)
class NotApplied:
    """The object cannot be had: refused for good, or someone else's."""

    reason: ReadyReason
    message: str


Ensured = Unchanged | Applied | NotApplied


class Workloads:
    """Applies versions' workload plans, remembering what it applied and what was refused."""

    def __init__(
        self,
        api: Api,
        deployments: ByVersion,
        services: ByVersion,
        warn: Warn,
    ) -> None:
        self.api = api
        self.deployments = deployments
        self.services = services
        self.warn = warn
        self._applied: dict[tuple[str, str, str], str] = {}
        """Per managed object (kind, namespace, name), its revision right after the operator
        applied it: any other revision means someone else changed it."""
        self._rejected: dict[ModelKey, dict[tuple[str, str], tuple[str, str]]] = {}
        """Per model, (kind, version name) -> (manifest hash, why the API server refused it)."""

    def forget_applied(self) -> None:
        """Apply every managed object once more, on its next pass."""
        self._applied.clear()

    def keep_rejections(self, model: ModelKey, names: set[str]) -> None:
        """Forget the refusals of versions of ``model`` not in ``names`` (gone)."""
        rejected = self._rejected.pop(model, {})
        if kept := {k: v for k, v in rejected.items() if k[1] in names}:
            self._rejected[model] = kept

    async def reconcile(
        self, version: VersionInfo, wanted: WorkloadPlan, problems: list[str]
    ) -> Readiness:
        """Make the version's workload what ``wanted`` says; say whether it can serve. What
        the API server refuses goes into ``problems`` and the readiness, never further."""
        match wanted:
            case Unparsed(message):
                return Readiness(False, "InvalidSpec", message)
            case External(readiness, ignored):
                try:
                    await self._remove(version)
                except KubeApiError as exc:  # left over, but the version is served elsewhere
                    problems.append(f"removing the workload of {version.name}: {exc}")
                if ignored is not None:
                    await self.warn(version, "SettingsIgnored", ignored)
                return readiness
            case Refused(message, endpoint, selector):
                await self.warn(version, "InvalidSpec", message)
                return self.not_applied(version, "InvalidSpec", message, endpoint, selector)
            case Managed():
                try:
                    return await self._managed(version, wanted)
                except KubeApiError as exc:
                    problems.append(f"workload of {version.name}: {exc}")
                    return await self.refused(version, exc, wanted)

    async def _managed(self, version: VersionInfo, wanted: Managed) -> Readiness:
        """Apply the Deployment, then the Service: a version whose pods the API server
        refuses gets no Service."""
        applied: WorkloadInfo | None = None
        match await self._ensure(version, wanted.deployment, self.deployments, "deployments"):
            case NotApplied(reason, message):
                return self.not_applied(version, reason, message, wanted.endpoint, wanted.selector)
            case Applied(info):
                applied = info
        match await self._ensure(version, wanted.service, self.services, "services"):
            case NotApplied(reason, message):
                return self.not_applied(version, reason, message, wanted.endpoint, wanted.selector)
        live = applied or _first(self.deployments.get(version.key))
        readiness, warning = serving(version.name, wanted, live)
        if warning is not None:
            await self.warn(version, "PodsRefused", warning)
        return readiness

    def not_applied(
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

    async def refused(self, version: VersionInfo, exc: KubeApiError, wanted: Managed) -> Readiness:
        """The API server refused the version's Service or Deployment for now (a quota, an
        admission webhook, a conflict): tried again with backoff. A version whose earlier
        workload still serves stays Ready on it; one that never ran is not Ready."""
        endpoint, selector = wanted.endpoint, wanted.selector
        message = f"The API server refused the workload of ModelVersion {version.name}: {exc}"
        log.warning("%s; trying again", message, extra=log_ref(version))
        await self.warn(version, "WorkloadRefused", message)
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
        index: ByVersion,
        plural: str,
    ) -> Ensured:
        """Apply ``manifest`` (server-side apply, the operator's field manager, forced) unless
        the live object carries its hash and nobody else has changed it since the operator last
        applied it. So hand changes (an image, a replica count, a selector) are undone as soon
        as their watch event arrives, and once after every start and resync.

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
            return Unchanged()
        if seen is None:
            existing = await self.api.get(path)
            if existing is not None and not self._ours(existing, version):
                return NotApplied(
                    "WorkloadConflict",
                    f"{kind} {name} already exists and is not managed by this ModelVersion",
                )
        rejections = self._rejected.setdefault(version.model_key, {})
        rejected = rejections.get((kind, version.name))
        if rejected is not None and rejected[0] == want:
            return NotApplied("InvalidSpec", rejected[1])
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
                extra=log_ref(version),
            )
            await self.warn(version, "InvalidSpec", message)
            return NotApplied("InvalidSpec", message)
        rejections.pop((kind, version.name), None)
        info = WorkloadInfo.from_body(kind, applied)
        if info is None:
            return Applied(None)
        self._applied[ident] = info.revision
        why = ""
        if seen is None:
            verb = "Created"
        elif seen.resource_version == info.resource_version:
            return Applied(info)  # it already was as the operator wants it
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
            extra=log_ref(version),
        )
        return Applied(info)

    @staticmethod
    def _ours(obj: Mapping[str, Any], version: VersionInfo) -> bool:
        meta = obj.get("metadata") or {}
        owners = {str(o.get("uid")) for o in meta.get("ownerReferences") or []}
        labels = meta.get("labels") or {}
        return version.uid in owners or labels.get(LABEL_MANAGED_BY) == MANAGED_BY

    async def _remove(self, version: VersionInfo) -> None:
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
                    extra=log_ref(version),
                )

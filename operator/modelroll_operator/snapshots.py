"""What the operator's indices hold: small immutable snapshots of the objects it watches.

Every routing and status decision is a function of these snapshots, so the same cluster state
always leads to the same writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .spec import (
    ANNOTATION_SPEC_HASH,
    API_VERSION,
    KIND,
    LABEL_VERSION,
    ModelVersionSpec,
    SpecError,
    parse_spec,
)

ModelKey = tuple[str, str]
"""(namespace, model): one entry of the routes ConfigMap."""
VersionKey = tuple[str, str]
"""(namespace, ModelVersion name)."""


@dataclass(frozen=True)
class VersionInfo:
    """One ModelVersion as last seen: identity, parsed spec (or why it did not parse), status."""

    namespace: str
    name: str
    uid: str
    generation: int
    model: str
    spec: ModelVersionSpec | None
    spec_error: str | None = None
    deleting: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    status: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> VersionInfo | None:
        """A snapshot of a ModelVersion body; None when it names no model (nothing to route)."""
        meta = body.get("metadata") or {}
        raw_spec = body.get("spec") or {}
        model = raw_spec.get("model")
        if not isinstance(model, str) or not model:
            return None
        spec: ModelVersionSpec | None
        try:
            spec, error = parse_spec(raw_spec), None
        except SpecError as exc:
            spec, error = None, str(exc)
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            generation=int(meta.get("generation") or 0),
            model=model,
            spec=spec,
            spec_error=error,
            deleting=bool(meta.get("deletionTimestamp")),
            labels=dict(meta.get("labels") or {}),
            status=dict(body.get("status") or {}),
        )

    @property
    def key(self) -> VersionKey:
        return (self.namespace, self.name)

    @property
    def ready(self) -> bool:
        """Whether its status says it is Ready (the reconciler's condition)."""
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in self.status.get("conditions") or []
            if isinstance(c, Mapping)
        )

    @property
    def model_key(self) -> ModelKey:
        return (self.namespace, self.model)

    def owner_body(self) -> dict[str, Any]:
        """Enough of the object for kopf.adopt() and for events' involvedObject."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "labels": dict(self.labels),
            },
        }


@dataclass(frozen=True)
class WorkloadInfo:
    """A Deployment or Service the operator manages, as last seen."""

    kind: str
    namespace: str
    name: str
    version: str
    owner_uids: tuple[str, ...]
    spec_hash: str | None
    replicas: int = 0
    ready_replicas: int = 0
    generation: int = 0
    resource_version: str = ""
    failure: str | None = None
    """A Deployment's ReplicaFailure condition, when True: why its ReplicaSet cannot create
    pods (a ResourceQuota, Pod Security admission, a webhook), in the API server's words."""

    @classmethod
    def from_body(cls, kind: str, body: Mapping[str, Any]) -> WorkloadInfo | None:
        meta = body.get("metadata") or {}
        version = (meta.get("labels") or {}).get(LABEL_VERSION)
        if not version:
            return None
        status = body.get("status") or {}
        return cls(
            kind=kind,
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            version=str(version),
            owner_uids=tuple(str(o.get("uid")) for o in meta.get("ownerReferences") or []),
            spec_hash=(meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH),
            replicas=int(status.get("replicas") or 0),
            ready_replicas=int(status.get("readyReplicas") or 0),
            generation=int(meta.get("generation") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
            failure=_replica_failure(status),
        )

    @property
    def revision(self) -> str:
        """What changes when someone changes the object's spec: a Deployment's generation (its
        status changes all the time, its generation only with its spec); a Service's
        resourceVersion (it has no generation, and hardly any status)."""
        if self.kind == "Deployment":
            return f"generation {self.generation}"
        return f"resourceVersion {self.resource_version}"

    @property
    def key(self) -> VersionKey:
        return (self.namespace, self.version)


def _replica_failure(status: Mapping[str, Any]) -> str | None:
    """The message of a True ReplicaFailure condition (the Deployment controller copies it from
    the ReplicaSet's FailedCreate), else None."""
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "ReplicaFailure"
            and condition.get("status") == "True"
        ):
            return str(condition.get("message") or condition.get("reason") or "ReplicaFailure")
    return None

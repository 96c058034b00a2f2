"""The API calls the operator makes, declared once: the Helm chart's RBAC rules for it are
written from :data:`PERMISSIONS` (``make generate``, ``hack/rbac.py``), and :class:`~.api.Api`
refuses a call the table does not declare, so a missing rule fails in the unit tests with the
verb and resource it lacks, not as a 403 in a cluster.

kopf's own calls (its watches, the finalizer and annotations it patches, the events it posts,
peering) do not go through :class:`~.api.Api`: they are rows here all the same, and a unit test
holds every resource kopf's handlers watch to them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from modelroll_common.routes import CONFIGMAP_NAME

from .spec import GROUP, PLURAL

__all__ = [
    "PERMISSIONS",
    "Deleting",
    "Feature",
    "Permission",
    "Request",
    "Scope",
    "Undeclared",
    "Verb",
    "require",
]


class Verb(enum.StrEnum):
    """An RBAC verb, as the API server names what a request does."""

    GET = "get"
    LIST = "list"
    WATCH = "watch"
    CREATE = "create"
    UPDATE = "update"
    PATCH = "patch"
    DELETE = "delete"
    DELETECOLLECTION = "deletecollection"


GET, LIST, WATCH, CREATE, UPDATE, PATCH, DELETE = (
    Verb.GET,
    Verb.LIST,
    Verb.WATCH,
    Verb.CREATE,
    Verb.UPDATE,
    Verb.PATCH,
    Verb.DELETE,
)


class Scope(enum.Enum):
    """Where a permission is granted."""

    CLUSTER = "cluster"
    """A cluster-scoped resource (CRDs, namespaces): always cluster-wide."""
    NAMESPACED = "namespaced"
    """In the namespaces the operator serves: a Role in each watched namespace, or one
    ClusterRole when it watches every namespace."""


class Feature(enum.Enum):
    """What a permission is needed for: always, or only with one of the operator's options."""

    ALWAYS = "always"
    GATEWAY_API = "gatewayAPI"
    """--gateway-api: the operator writes the weights of HTTPRoutes that claim models."""
    PEERING = "peering"
    """--peering: replicas elect their active one through a kopf peering object."""
    CLUSTER_PEERING = "clusterPeering"
    """--peering while serving every namespace: kopf's peering object is cluster-wide."""
    AUTOSCALER = "autoscaler"
    """--autoscaler keda: the operator writes a KEDA ScaledObject per autoscaled version."""


@dataclass(frozen=True)
class Deleting:
    """What of a namespaced permission the operator keeps, cluster-wide, to finish the deletion
    of a watched namespace: deleting the namespace deletes its Role and RoleBinding too, in no
    set order, while its ModelVersions wait for the operator to remove our finalizer."""

    verbs: tuple[Verb, ...]
    why: str
    names: tuple[str, ...] = ()
    """Only the objects of these names (``resourceNames``), when not empty."""


@dataclass(frozen=True)
class Permission:
    """Verbs on one resource that the operator's code (or kopf, for it) uses, and why."""

    group: str
    """The API group, "" for the core group."""
    resource: str
    """The plural, with ``/subresource`` for a subresource."""
    verbs: tuple[Verb, ...]
    why: str
    scope: Scope = Scope.NAMESPACED
    names: tuple[str, ...] = ()
    """Only the objects of these names (``resourceNames``), when not empty."""
    feature: Feature = Feature.ALWAYS
    deleting: Deleting | None = None

    def allows(self, request: Request) -> bool:
        namespaced = self.scope is Scope.NAMESPACED
        return (
            (request.group, request.resource) == (self.group, self.resource)
            and request.verb in self.verbs
            and (request.namespace is not None) == namespaced
            and (not self.names or request.name in self.names)
        )


KOPF = "kopf.dev"
GATEWAY_API = "gateway.networking.k8s.io"
KEDA = "keda.sh"

PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        GROUP,
        PLURAL,
        (GET, LIST, WATCH, PATCH),
        "kopf watches ModelVersions and patches our finalizer and its annotations onto them; "
        "an analysis reads its version and its baseline, and patches weights and its record.",
        deleting=Deleting(
            (LIST, WATCH, PATCH),
            "kopf's watch runs the on.delete handler; kopf patches our finalizer off (and "
            "records a handler's retries in annotations).",
        ),
    ),
    Permission(
        GROUP,
        f"{PLURAL}/status",
        (GET, PATCH),
        "Each pass merge-patches its versions' status (conditions, the weight in force).",
    ),
    Permission(
        GROUP,
        f"{PLURAL}/finalizers",
        (UPDATE,),
        "Children are adopted with blockOwnerDeletion, which needs this where the "
        "OwnerReferencesPermissionEnforcement admission plugin runs.",
    ),
    Permission(
        "",
        "configmaps",
        (GET, LIST, WATCH, CREATE, PATCH),
        "The routes ConfigMap: kopf watches it by name; each pass reads it, creates it when "
        "missing and merge-patches its model's key.",
        deleting=Deleting(
            (GET, LIST, WATCH, PATCH),
            "The routes ConfigMap, by name only: the on.delete handler reads it and removes the "
            "deleted version's entry (it is never created in a namespace being deleted; create "
            "cannot be limited by name anyway).",
            names=(CONFIGMAP_NAME,),
        ),
    ),
    Permission(
        "",
        "configmaps",
        (DELETE,),
        "Only to replace a routes ConfigMap someone made immutable (it cannot be changed "
        "otherwise).",
        names=(CONFIGMAP_NAME,),
    ),
    Permission(
        "apps",
        "deployments",
        (GET, LIST, WATCH, CREATE, PATCH, DELETE),
        "Managed versions' Deployments: kopf indexes them; server-side applied, deleted when "
        "a version leaves managed mode.",
        deleting=Deleting(
            (LIST, WATCH),
            "kopf handles no event before every indexed resource is listed in every served "
            "namespace, and an operator (re)started while the namespace is being deleted would "
            "otherwise be refused that listing, and stop.",
        ),
    ),
    Permission(
        "",
        "services",
        (GET, LIST, WATCH, CREATE, PATCH, DELETE),
        "Managed versions' Services, like their Deployments; an analysis checks that a "
        "metrics URL names a Service of the version's namespace.",
        deleting=Deleting((LIST, WATCH), "Indexed, like Deployments."),
    ),
    Permission(
        "",
        "events",
        (CREATE,),
        "Events on ModelVersions, the operator's and kopf's (warnings).",
    ),
    Permission(
        "",
        "pods",
        (LIST,),
        "Canary analyses find the gateway pods, or the versions' sidecars, by label and read "
        "their /metrics (list only: no get, watch or anything that reaches into a pod).",
    ),
    Permission(
        GATEWAY_API,
        "httproutes",
        (GET, LIST, WATCH, PATCH),
        "The HTTPRoutes that claim models (labelled modelroll.io/model): kopf indexes them, a "
        "pass patches the backendRefs of the model's rule on the route read just before, an "
        "analysis lists them to find the claim.",
        feature=Feature.GATEWAY_API,
        deleting=Deleting(
            (LIST, WATCH),
            "Indexed, like Deployments. Without patch, a version still in a claiming route's "
            "backendRefs keeps its finalizer until the namespace's deletion removes that route; "
            "the model then falls back to the routes ConfigMap, from which the version is "
            "removed.",
        ),
    ),
    Permission(
        KEDA,
        "scaledobjects",
        (CREATE, PATCH, DELETE),
        "The ScaledObjects of versions with spec.scaling: server-side applied (which creates "
        "one that is missing), deleted when spec.scaling goes; never read or watched.",
        feature=Feature.AUTOSCALER,
    ),
    Permission(
        KOPF,
        "kopfpeerings",
        (GET, LIST, WATCH, PATCH),
        "kopf's peering in each served namespace: replicas announce themselves in it.",
        feature=Feature.PEERING,
        deleting=Deleting(
            (GET, LIST, WATCH, PATCH),
            "kopf watches the peering of every served namespace and keeps its replica's entry "
            "in it fresh.",
        ),
    ),
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        (LIST, WATCH),
        "kopf finds the CRDs of the resources it serves.",
        scope=Scope.CLUSTER,
    ),
    Permission(
        "",
        "namespaces",
        (LIST, WATCH),
        "kopf finds the namespaces it serves.",
        scope=Scope.CLUSTER,
    ),
    Permission(
        KOPF,
        "clusterkopfpeerings",
        (GET, LIST, WATCH, PATCH),
        "kopf's peering when the operator serves every namespace.",
        scope=Scope.CLUSTER,
        feature=Feature.CLUSTER_PEERING,
    ),
)
"""Every API call the operator makes, by resource."""


@dataclass(frozen=True)
class Request:
    """What the API server's authorizer sees of a request."""

    verb: Verb
    group: str
    resource: str
    namespace: str | None
    name: str | None

    @classmethod
    def of(cls, method: str, path: str, params: Mapping[str, str] | None = None) -> Request:
        """The request for ``method`` on the REST ``path`` (``/api/v1/...`` or
        ``/apis/<group>/<version>/...``), as the API server reads it."""
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, rest = "", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, rest = parts[1], parts[3:]
        else:
            raise ValueError(f"{path} is not a Kubernetes API path")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest:
            raise ValueError(f"{path} names no resource")
        name = rest[1] if len(rest) > 1 else None
        resource = "/".join([rest[0], *rest[2:3]])
        return cls(_verb(method, name, params or {}), group, resource, namespace, name)

    def __str__(self) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        where = f" in namespace {self.namespace}" if self.namespace else " cluster-wide"
        named = f" named {self.name}" if self.name else ""
        return f"{self.verb} {resource}{named}{where}"


def _verb(method: str, name: str | None, params: Mapping[str, str]) -> Verb:
    match method.upper(), name:
        case "GET", None:
            return WATCH if params.get("watch") in ("true", "1") else LIST
        case "GET", _:
            return GET
        case "POST", _:
            return CREATE
        case "PUT", _:
            return UPDATE
        case "PATCH", _:
            return PATCH
        case "DELETE", None:
            return Verb.DELETECOLLECTION
        case "DELETE", _:
            return DELETE
    raise ValueError(f"{method} is not a Kubernetes API method")


class Undeclared(Exception):
    """A call that :data:`PERMISSIONS` does not declare: the chart would not grant it."""


def require(
    method: str,
    path: str,
    params: Mapping[str, str] | None = None,
    permissions: tuple[Permission, ...] = PERMISSIONS,
) -> Request:
    """The request, if ``permissions`` declares it; else raise :class:`Undeclared`."""
    request = Request.of(method, path, params)
    if not any(p.allows(request) for p in permissions):
        raise Undeclared(
            f"the operator may not {request} ({method} {path}): no row of "
            "modelroll_operator.permissions.PERMISSIONS declares it, so the chart's RBAC would "
            "refuse it"
        )
    return request

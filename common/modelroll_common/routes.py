"""The routes document: one ConfigMap data key per model, its value a JSON route.

The contract between the operator, which writes it, and the gateway, which follows it. Parsing is
strict (unknown fields are errors) because both sides ship from this one module.

    {"model": "sentiment",
     "versions": [{"name": "stable-v1", "weight": 9, "endpoint": "http://stable-v1:8000"}, ...],
     "cohortHeader": "X-User-Id"}

``cohortHeader`` is optional: with it, a request that carries that header goes to the version
its value hashes to (sticky cohorts, weighted by the same weights). A version's ``shadow`` is
optional too: the percentage of the model's requests the gateway copies to it (shadow traffic);
and so is its ``standby``: it has no Ready replica (scaled to zero), so the gateway answers a
request pinned to it 503 with Retry-After, and routes it nothing else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CONFIGMAP_NAME",
    "MAX_WEIGHT",
    "VERSION_HEADER",
    "ModelRoute",
    "RoutesError",
    "VersionRoute",
    "configmap_delete_patch",
    "configmap_patch",
    "dump_model_route",
    "format_share",
    "parse_configmap_data",
    "parse_model_route",
    "validate_cohort_header",
    "validate_model_name",
    "validate_version_name",
]

CONFIGMAP_NAME = "modelroll-routes"
"""The ConfigMap the operator writes and the gateway watches, one per namespace."""

MAX_WEIGHT = 1000
"""Weights are integers in 0..MAX_WEIGHT (the ModelVersion CRD's bounds)."""

VERSION_HEADER = "X-Modelroll-Version"
"""The header that pins a request to a version of its model, and that says which version
answered it."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ROUTE_FIELDS = frozenset({"model", "versions", "cohortHeader"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
"""An HTTP header name (RFC 9110's token), at most 64 characters."""
_VERSION_FIELDS = frozenset({"name", "weight", "endpoint"})
_OPTIONAL_VERSION_FIELDS = frozenset({"shadow", "standby"})


class RoutesError(ValueError):
    """A routes document (or one field of it) is invalid; the message says which and why."""


def validate_model_name(name: object) -> str:
    """A model name is a DNS label (it is also a ConfigMap data key)."""
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
        raise RoutesError(f"model name {name!r} is not a DNS label (lowercase a-z, 0-9, '-')")
    return name


def validate_version_name(name: object) -> str:
    """A version name is a ModelVersion's metadata.name: a DNS subdomain."""
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise RoutesError(f"version name {name!r} is not a DNS subdomain name")
    return name


def validate_cohort_header(name: object) -> str:
    """A header that may key sticky cohorts: a header name, not the version header."""
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        raise RoutesError(f"cohort header {name!r} is not an HTTP header name of 1-64 characters")
    if name.lower() == VERSION_HEADER.lower():
        raise RoutesError(f"cohort header {name!r} is the version header, which pins requests")
    return name


def _validate_weight(weight: object, where: str) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise RoutesError(f"{where}: weight must be an integer, got {weight!r}")
    if not 0 <= weight <= MAX_WEIGHT:
        raise RoutesError(f"{where}: weight {weight} is outside 0..{MAX_WEIGHT}")
    return weight


def _validate_endpoint(endpoint: object, where: str) -> str:
    if not isinstance(endpoint, str):
        raise RoutesError(f"{where}: endpoint must be a string, got {endpoint!r}")
    try:
        parts = urlsplit(endpoint)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise RoutesError(f"{where}: endpoint {endpoint!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RoutesError(f"{where}: endpoint {endpoint!r} must be an http(s) URL with a host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise RoutesError(f"{where}: endpoint {endpoint!r} must not carry query, fragment or user")
    return endpoint.rstrip("/")


@dataclass(frozen=True, slots=True)
class VersionRoute:
    """One version of a model: where it answers and its relative weight."""

    name: str
    weight: int
    endpoint: str
    shadow: int = 0
    """The percentage of the model's requests copied to this version (0: none)."""
    standby: bool = False
    """No replica is Ready (scaled to zero): a request pinned to it is answered 503 with
    Retry-After, and it gets no other traffic (its weight and shadow are 0)."""

    def __post_init__(self) -> None:
        where = f"version {self.name!r}"
        validate_version_name(self.name)
        _validate_weight(self.weight, where)
        object.__setattr__(self, "endpoint", _validate_endpoint(self.endpoint, where))
        shadow = self.shadow
        if isinstance(shadow, bool) or not isinstance(shadow, int) or not 0 <= shadow <= 100:
            raise RoutesError(f"{where}: shadow must be an integer percentage, got {shadow!r}")
        if not isinstance(self.standby, bool):
            raise RoutesError(f"{where}: standby must be true or false, got {self.standby!r}")
        if self.standby and (self.weight or shadow):
            raise RoutesError(f"{where}: a version on standby has weight 0 and no shadow")

    @property
    def infer_url(self) -> str:
        """The sidecar's inference URL for this version."""
        return f"{self.endpoint}/v1/infer"

    def open_inference_model_url(self, model: str) -> str:
        """Where the sidecar serves ``model``'s metadata in the Open Inference Protocol (KServe
        v2)."""
        return f"{self.endpoint}/v2/models/{model}"

    def open_inference_url(self, model: str) -> str:
        """The sidecar's Open Inference Protocol inference URL for this version of ``model``."""
        return f"{self.open_inference_model_url(model)}/infer"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "weight": self.weight, "endpoint": self.endpoint}
        if self.shadow:
            doc["shadow"] = self.shadow
        if self.standby:
            doc["standby"] = True
        return doc


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Every routed version of one model. Share = weight / total; a zero total routes nothing."""

    model: str
    versions: tuple[VersionRoute, ...] = field(default=())
    cohort_header: str | None = None
    """The header whose value keys a request's sticky cohort (None: every request by weight)."""

    def __post_init__(self) -> None:
        validate_model_name(self.model)
        if self.cohort_header is not None:
            validate_cohort_header(self.cohort_header)
        object.__setattr__(self, "versions", tuple(self.versions))
        seen: set[str] = set()
        for version in self.versions:
            if not isinstance(version, VersionRoute):
                raise RoutesError(f"model {self.model!r}: versions must be VersionRoute objects")
            if version.name in seen:
                raise RoutesError(f"model {self.model!r}: version {version.name!r} is listed twice")
            seen.add(version.name)

    @property
    def total_weight(self) -> int:
        return sum(v.weight for v in self.versions)

    def version(self, name: str) -> VersionRoute | None:
        for v in self.versions:
            if v.name == name:
                return v
        return None

    def shares(self) -> dict[str, float]:
        """Each version's fraction of traffic, 0.0..1.0 (all 0.0 when the total weight is 0)."""
        total = self.total_weight
        return {v.name: (v.weight / total if total else 0.0) for v in self.versions}

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "model": self.model,
            "versions": [v.to_json() for v in self.versions],
        }
        if self.cohort_header is not None:
            doc["cohortHeader"] = self.cohort_header
        return doc


def format_share(share: float) -> str:
    """A share as ModelVersion status shows it: 0.1 -> "10.0%"."""
    return f"{share * 100:.1f}%"


def _parse_version(raw: object, model: str, index: int) -> VersionRoute:
    where = f"model {model!r} versions[{index}]"
    if not isinstance(raw, dict):
        raise RoutesError(f"{where}: must be an object, got {type(raw).__name__}")
    unknown = set(raw) - _VERSION_FIELDS - _OPTIONAL_VERSION_FIELDS
    if unknown:
        raise RoutesError(f"{where}: unknown field(s) {sorted(unknown)}")
    missing = _VERSION_FIELDS - set(raw)
    if missing:
        raise RoutesError(f"{where}: missing field(s) {sorted(missing)}")
    try:
        return VersionRoute(
            name=raw["name"],
            weight=raw["weight"],
            endpoint=raw["endpoint"],
            shadow=raw.get("shadow", 0),
            standby=raw.get("standby", False),
        )
    except RoutesError as exc:
        raise RoutesError(f"{where}: {exc}") from None


def parse_model_route(key: str, value: str | bytes | Mapping[str, Any]) -> ModelRoute:
    """Parse one ConfigMap data value (JSON text, or an already-decoded object) for data key `key`.

    Raises RoutesError with a message naming the model and the field at fault.
    """
    if isinstance(value, str | bytes):
        try:
            raw: object = json.loads(value)
        except ValueError as exc:
            raise RoutesError(f"model {key!r}: value is not JSON: {exc}") from None
    else:
        raw = dict(value)
    if not isinstance(raw, dict):
        raise RoutesError(f"model {key!r}: value must be a JSON object, got {type(raw).__name__}")
    unknown = set(raw) - _ROUTE_FIELDS
    if unknown:
        raise RoutesError(f"model {key!r}: unknown field(s) {sorted(unknown)}")
    if raw.get("model") != key:
        raise RoutesError(f"model {key!r}: field 'model' is {raw.get('model')!r}, not the data key")
    validate_model_name(key)
    versions = raw.get("versions")
    if not isinstance(versions, list):
        raise RoutesError(f"model {key!r}: 'versions' must be a list")
    parsed = tuple(_parse_version(v, key, i) for i, v in enumerate(versions))
    header = raw.get("cohortHeader")
    try:
        return ModelRoute(model=key, versions=parsed, cohort_header=header)
    except RoutesError as exc:
        raise RoutesError(f"model {key!r}: {exc}") from None


def parse_configmap_data(
    data: Mapping[str, Any] | None,
) -> tuple[dict[str, ModelRoute], dict[str, str]]:
    """Parse every key of a ConfigMap's data: (routes by model, error message by model)."""
    routes: dict[str, ModelRoute] = {}
    errors: dict[str, str] = {}
    for key, value in (data or {}).items():
        try:
            routes[key] = parse_model_route(key, value)
        except RoutesError as exc:
            errors[key] = str(exc)
    return routes, errors


def dump_model_route(route: ModelRoute) -> str:
    """The canonical ConfigMap value: versions ordered by name, compact JSON.

    The same route always serialises to the same text, so a level-triggered writer that
    recomputes it from cluster state makes no spurious ConfigMap updates.
    """
    versions = sorted(route.versions, key=lambda v: v.name)
    doc = ModelRoute(route.model, tuple(versions), route.cohort_header).to_json()
    return json.dumps(doc, separators=(",", ":"))


def configmap_patch(route: ModelRoute) -> dict[str, Any]:
    """A JSON merge patch that sets only this model's key of the routes ConfigMap."""
    return {"data": {route.model: dump_model_route(route)}}


def configmap_delete_patch(model: str) -> dict[str, Any]:
    """A JSON merge patch that removes this model's key (its last version is gone)."""
    return {"data": {validate_model_name(model): None}}

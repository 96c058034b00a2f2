"""The ModelVersion resource: its API coordinates, labels, and a typed view of its spec.

The CRD (crds/modelversion.yaml) validates and defaults every field; parsing here trusts the
shapes but not their presence, so an object stored before a default existed still parses, with
the same defaults the CRD declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelroll_common.routes import RoutesError, validate_cohort_header
from modelroll_common.settings import (
    BATCHING_CHOICES,
    BATCHING_SETTINGS,
    BY_ATTR,
    CHOICES_BY_ATTR,
    SIDECAR_SETTINGS,
    Choice,
    Setting,
)
from modelroll_common.settings import PROTOCOL as PROTOCOL  # workload.py imports it from here

from .pod_security import violations

GROUP = "modelroll.io"
VERSION = "v1alpha1"
PLURAL = "modelversions"
KIND = "ModelVersion"
API_VERSION = f"{GROUP}/{VERSION}"

PREFIX = "modelroll.io"
"""Our finalizer, annotations and labels live under this prefix (never kopf's defaults)."""
FINALIZER = f"{PREFIX}/finalizer"
LABEL_MODEL = f"{PREFIX}/model"
LABEL_VERSION = f"{PREFIX}/version"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "modelroll-operator"
FIELD_MANAGER = "modelroll-operator"
ANNOTATION_SPEC_HASH = f"{PREFIX}/spec-hash"
"""On a managed Deployment or Service: the hash of what the operator last applied."""
ANNOTATION_BEFORE_PROMOTE = f"{PREFIX}/before-promote"
"""On the ModelVersion kubectl-modelroll last promoted: JSON of every version's weight in its
model right before that promote, ``{"model": …, "at": …, "weights": {version: weight}}``;
``kubectl modelroll rollback`` of that version gives them back and removes it."""


class SpecError(ValueError):
    """A ModelVersion spec the operator cannot act on; the message names the field."""


@dataclass(frozen=True)
class Batching:
    """spec.batching: the sidecar's batching flags, with the settings' defaults."""

    max_batch_size: int = BY_ATTR["max_batch_size"].default
    max_wait_ms: int = BY_ATTR["max_wait_ms"].default
    max_queue_size: int = BY_ATTR["max_queue_size"].default
    max_batch_tokens: int = BY_ATTR["max_batch_tokens"].default
    timeout_ms: int = BY_ATTR["timeout_ms"].default
    max_concurrent_batches: int = BY_ATTR["max_concurrent_batches"].default
    batch_by: str = CHOICES_BY_ATTR["batch_by"].default
    wait_policy: str = CHOICES_BY_ATTR["wait_policy"].default
    length_from: str = CHOICES_BY_ATTR["length_from"].default

    def sidecar_flags(self) -> list[str]:
        """The sidecar's command-line flags for these settings, in a fixed order: every integer
        setting, then the enum settings that differ from their defaults."""
        return [f"{s.flag}={getattr(self, s.attr)}" for s in BATCHING_SETTINGS] + [
            c.flag_for(value)
            for c in BATCHING_CHOICES
            if (value := getattr(self, c.attr)) != c.default
        ]

    def changed(self) -> list[str]:
        """The fields set to something other than their default."""
        return [
            f"spec.batching.{s.key}"
            for s in (*BATCHING_SETTINGS, *BATCHING_CHOICES)
            if getattr(self, s.attr) != s.default
        ]


Resources = Mapping[str, Mapping[str, int | str]]
"""A container's resources: {requests: {cpu: 100m, ...}, limits: {...}}."""


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret in the version's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class SidecarSettings:
    """spec.sidecar: the sidecar settings a spec gives (None: not given)."""

    upstream_timeout_ms: int | None = None
    max_body_bytes: int | None = None
    read_timeout_ms: int | None = None
    drain_timeout_s: int | None = None
    max_in_flight: int | None = None
    readiness_timeout_ms: int | None = None
    generation_timeout_ms: int | None = None
    resources: Resources | None = None
    """The sidecar container's resources; None: the operator's --sidecar-resources."""
    engine_api_key_secret: SecretKey | None = None
    """The Secret key holding the model server's API key, which the sidecar sends it."""

    def sidecar_flags(self) -> list[str]:
        """Flags for the given settings, except drainTimeoutS (the pod's grace period needs
        it too: see workload.py)."""
        return [
            f"{s.flag}={value}"
            for s in SIDECAR_SETTINGS
            if s.attr != "drain_timeout_s" and (value := getattr(self, s.attr)) is not None
        ]

    def given(self) -> list[str]:
        given = [
            f"spec.sidecar.{s.key}" for s in SIDECAR_SETTINGS if getattr(self, s.attr) is not None
        ]
        objects = {"resources": self.resources, "engineApiKeySecret": self.engine_api_key_secret}
        return given + [f"spec.sidecar.{key}" for key, value in objects.items() if value]


Json = dict[str, Any]
"""A Kubernetes object as the spec gives it (a volume, a toleration, a probe): passed into the
pod as it is, for the API server to check when the operator applies the Deployment."""


@dataclass(frozen=True)
class Server:
    """spec.server: the model server container of a managed version, and the pod fields that a
    real model needs. A curated set, not a pod template: each field has one place in the pod,
    none can reach the batching sidecar (see docs/design.md, "Managed mode")."""

    image: str
    port: int = 8080
    image_pull_policy: str | None = None
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[Json, ...] = ()
    """Each {name, value} or {name, valueFrom}."""
    env_from: tuple[Json, ...] = ()
    resources: Resources = field(default_factory=dict)
    volume_mounts: tuple[Json, ...] = ()
    startup_probe: Json | None = None
    readiness_probe: Json | None = None
    liveness_probe: Json | None = None
    """Restarts a hung model server (the sidecar's own probes only watch the sidecar)."""
    security_context: Json | None = None
    # The pod's fields:
    volumes: tuple[Json, ...] = ()
    init_containers: tuple[Json, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Json, ...] = ()
    affinity: Json | None = None
    image_pull_secrets: tuple[str, ...] = ()
    service_account_name: str | None = None
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    dns_policy: str | None = None
    topology_spread_constraints: tuple[Json, ...] = ()
    host_ipc: bool = False
    share_process_namespace: bool = False
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    baseline_violations: tuple[str, ...] = ()
    """What in these fields Pod Security "baseline" forbids, each naming the field and the rule
    (pod_security.py); the operator's --pod-security says whether that refuses the version."""

    @property
    def probes(self) -> dict[str, Json]:
        """The model container's probes that are given, by their field name."""
        given = {
            "startupProbe": self.startup_probe,
            "readinessProbe": self.readiness_probe,
            "livenessProbe": self.liveness_probe,
        }
        return {key: probe for key, probe in given.items() if probe is not None}


@dataclass(frozen=True)
class BackendRef:
    """spec.backendRef: what an HTTPRoute sends an external version's share to."""

    name: str
    kind: str = "Service"
    """Service, or InferencePool (the Gateway API Inference Extension's)."""
    port: int | None = None
    """The Service's port; None for an InferencePool."""


@dataclass(frozen=True)
class ModelVersionSpec:
    """A parsed spec. Exactly one of ``server`` (managed) and ``endpoint`` (external) is set."""

    model: str
    weight: int = 0
    endpoint: str | None = None
    server: Server | None = None
    replicas: int = 1
    batching: Batching = field(default_factory=Batching)
    sidecar: SidecarSettings = field(default_factory=SidecarSettings)
    protocol: str = PROTOCOL.default
    cohort_header: str | None = None
    """The header keying the model's sticky cohorts, if this version names one."""
    shadow_percent: int = 0
    """The percentage of the model's requests copied to this version (spec.shadow)."""
    backend_ref: BackendRef | None = None
    """External mode: the backend of the version in its model's HTTPRoute, if it names one."""

    @property
    def managed(self) -> bool:
        return self.server is not None

    def ignored_settings(self) -> list[str]:
        """Sidecar settings an external version gives: it runs no sidecar of ours."""
        if self.managed:
            return []
        return self.batching.changed() + self.sidecar.given()


def _int(raw: Mapping[str, Any], key: str, where: str, default: int, low: int, high: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}.{key} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise SpecError(f"{where}.{key} must be within {low}..{high}, got {value}")
    return value


def _strings(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where}.{key} must be a list of strings")
    return tuple(value)


def _settings(raw: object, where: str, settings: tuple[Setting, ...]) -> dict[str, int]:
    """The given settings of one block, bounds-checked as the CRD checks them."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an object")
    return {
        s.attr: _int(raw, s.key, where, s.default, s.low, s.high)
        for s in settings
        if raw.get(s.key) is not None
    }


def _choice(raw: Mapping[str, Any], choice: Choice, where: str) -> str:
    value = raw.get(choice.key, choice.default)
    if value not in choice.values:  # exact spelling, as the CRD's enum
        raise SpecError(
            f"{where}.{choice.key} must be one of {', '.join(choice.values)}, got {value!r}"
        )
    return str(value)


def parse_batching(raw: object) -> Batching:
    given: dict[str, Any] = _settings(raw, "spec.batching", BATCHING_SETTINGS)
    if isinstance(raw, Mapping):  # else None (all defaults): _settings refuses anything else
        given |= {
            c.attr: _choice(raw, c, "spec.batching")
            for c in BATCHING_CHOICES
            if raw.get(c.key) is not None
        }
    return Batching(**given)


def parse_sidecar(raw: object) -> SidecarSettings:
    settings = _settings(raw, "spec.sidecar", SIDECAR_SETTINGS)
    given = raw.get("resources") if isinstance(raw, Mapping) else None
    resources = parse_resources(given, "spec.sidecar.resources") if given is not None else None
    secret = raw.get("engineApiKeySecret") if isinstance(raw, Mapping) else None
    key = None
    if secret is not None:
        if not isinstance(secret, Mapping) or not all(
            isinstance(secret.get(k), str) and secret.get(k) for k in ("name", "key")
        ):
            raise SpecError("spec.sidecar.engineApiKeySecret needs a name and a key")
        key = SecretKey(str(secret["name"]), str(secret["key"]))
    return SidecarSettings(**settings, resources=resources, engine_api_key_secret=key)


def _objects(raw: Mapping[str, Any], key: str, where: str) -> tuple[Json, ...]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise SpecError(f"{where}.{key} must be a list of objects")
    return tuple(dict(v) for v in value)


def _object(raw: Mapping[str, Any], key: str, where: str) -> Json | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}.{key} must be an object")
    return dict(value)


def _name(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SpecError(f"{where}.{key} must be a string")
    return value


def parse_resources(raw: object, where: str) -> dict[str, dict[str, int | str]]:
    """A container's requests and limits by resource name; the API server checks the
    quantities when the operator applies the Deployment."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not set(raw) <= {"requests", "limits"}:
        raise SpecError(f"{where} must be an object with requests and limits")
    parsed: dict[str, dict[str, int | str]] = {}
    for kind, amounts in raw.items():
        if not isinstance(amounts, Mapping) or not all(
            isinstance(v, int | str) and not isinstance(v, bool) for v in amounts.values()
        ):
            raise SpecError(f"{where}.{kind} must map resource names to quantities")
        parsed[str(kind)] = {str(k): v for k, v in amounts.items()}
    return parsed


def _labels(raw: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise SpecError(f"{where}.{key} must map names to strings")
    return {str(k): v for k, v in value.items()}


def _flag(raw: Mapping[str, Any], key: str, where: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise SpecError(f"{where}.{key} must be true or false")
    return value


def _env(raw: Mapping[str, Any]) -> tuple[Json, ...]:
    env: list[Json] = []
    for index, item in enumerate(_objects(raw, "env", "spec.server")):
        name, source = item.get("name"), item.get("valueFrom")
        if not isinstance(name, str) or not name:
            raise SpecError(f"spec.server.env[{index}] needs a name")
        if source is not None:
            if "value" in item or not isinstance(source, Mapping):
                raise SpecError(f"spec.server.env[{index}] sets value or valueFrom, not both")
            env.append({"name": name, "valueFrom": dict(source)})
        else:
            env.append({"name": name, "value": str(item.get("value", ""))})
    return tuple(env)


def parse_server(raw: object) -> Server:
    if not isinstance(raw, Mapping):
        raise SpecError("spec.server must be an object")
    image = raw.get("image")
    if not isinstance(image, str) or not image:
        raise SpecError("spec.server.image is required")
    pull_secrets = _objects(raw, "imagePullSecrets", "spec.server")
    if not all(isinstance(p.get("name"), str) for p in pull_secrets):
        raise SpecError("spec.server.imagePullSecrets items need a name")
    policy = raw.get("imagePullPolicy")
    where = "spec.server"
    return Server(
        image=image,
        port=_int(raw, "port", where, 8080, 1, 65535),
        image_pull_policy=policy if isinstance(policy, str) else None,
        command=_strings(raw, "command", where),
        args=_strings(raw, "args", where),
        env=_env(raw),
        env_from=_objects(raw, "envFrom", where),
        resources=parse_resources(raw.get("resources"), "spec.server.resources"),
        volume_mounts=_objects(raw, "volumeMounts", where),
        startup_probe=_object(raw, "startupProbe", where),
        readiness_probe=_object(raw, "readinessProbe", where),
        liveness_probe=_object(raw, "livenessProbe", where),
        security_context=_object(raw, "securityContext", where),
        volumes=_objects(raw, "volumes", where),
        init_containers=_objects(raw, "initContainers", where),
        node_selector=_labels(raw, "nodeSelector", where),
        tolerations=_objects(raw, "tolerations", where),
        affinity=_object(raw, "affinity", where),
        image_pull_secrets=tuple(p["name"] for p in pull_secrets),
        service_account_name=_name(raw, "serviceAccountName", where),
        runtime_class_name=_name(raw, "runtimeClassName", where),
        priority_class_name=_name(raw, "priorityClassName", where),
        scheduler_name=_name(raw, "schedulerName", where),
        dns_policy=_name(raw, "dnsPolicy", where),
        topology_spread_constraints=_objects(raw, "topologySpreadConstraints", where),
        host_ipc=_flag(raw, "hostIPC", where),
        share_process_namespace=_flag(raw, "shareProcessNamespace", where),
        pod_labels=_labels(raw, "podLabels", where),
        pod_annotations=_labels(raw, "podAnnotations", where),
        baseline_violations=violations(raw),
    )


def parse_spec(raw: Mapping[str, Any]) -> ModelVersionSpec:
    """A typed spec, or SpecError naming the field at fault."""
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise SpecError("spec.model is required")
    endpoint = raw.get("endpoint") or None
    if endpoint is not None and not isinstance(endpoint, str):
        raise SpecError("spec.endpoint must be a string")
    server = parse_server(raw["server"]) if raw.get("server") is not None else None
    if (server is None) == (endpoint is None):
        raise SpecError("exactly one of spec.server and spec.endpoint must be set")
    cohort_header = raw.get("cohortHeader") or None
    if cohort_header is not None:
        try:
            validate_cohort_header(cohort_header)
        except RoutesError as exc:
            raise SpecError(f"spec.cohortHeader: {exc}") from None
    return ModelVersionSpec(
        model=model,
        weight=_int(raw, "weight", "spec", 0, 0, 1000),
        endpoint=endpoint.rstrip("/") if endpoint else None,
        server=server,
        replicas=_int(raw, "replicas", "spec", 1, 0, 1000),
        batching=parse_batching(raw.get("batching")),
        sidecar=parse_sidecar(raw.get("sidecar")),
        protocol=_choice(raw, PROTOCOL, "spec"),
        cohort_header=cohort_header,
        shadow_percent=_shadow(raw.get("shadow")),
        backend_ref=_backend_ref(raw.get("backendRef"), server is not None),
    )


def _backend_ref(raw: object, managed: bool) -> BackendRef | None:
    """spec.backendRef (None without it); the CRD's rules, for objects stored before them."""
    if raw is None:
        return None
    if managed:
        raise SpecError("spec.backendRef is for external versions, not with spec.server")
    if not isinstance(raw, Mapping):
        raise SpecError("spec.backendRef must be an object")
    name, kind = raw.get("name"), raw.get("kind") or "Service"
    if not isinstance(name, str) or not name:
        raise SpecError("spec.backendRef.name is required")
    if kind not in ("Service", "InferencePool"):
        raise SpecError("spec.backendRef.kind must be Service or InferencePool")
    if kind == "InferencePool":
        if raw.get("port") is not None:
            raise SpecError("spec.backendRef.port is not allowed for an InferencePool")
        return BackendRef(name, kind)
    return BackendRef(name, kind, _int(raw, "port", "spec.backendRef", 0, 1, 65535))


def _shadow(raw: object) -> int:
    """spec.shadow's percentage (0 without it)."""
    if raw is None:
        return 0
    if not isinstance(raw, Mapping):
        raise SpecError("spec.shadow must be an object")
    return _int(raw, "percent", "spec.shadow", 0, 1, 100)

"""The ModelVersion resource: its API coordinates, labels, and its spec, declared once.

Each class below declares its fields (``schema.api``): ``make generate`` writes the CRD's schema
of spec (crds/modelversion.yaml) from them, and :func:`parse_spec` reads a stored spec with the
same defaults and bounds, so an object stored before a default existed reads as the API server
would now default it. Where the CRD checks a rule across fields in CEL, the class checks
it too (``validate``), for objects stored before the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
from modelroll_common.settings import PROTOCOL as PROTOCOL  # manifests.py imports it from here

from .pod_security import violations
from .schema import FieldError, Json, Rule, api, decode

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


SpecError = FieldError
"""A ModelVersion spec the operator cannot act on; the message names the field."""


def setting(s: Setting, *, defaulted: bool) -> Any:
    """A declared integer field of the sidecar settings table; with ``defaulted`` the API server
    fills in its default, else the field is None when left out."""
    default = s.shown_default or str(s.default)
    bounds = f"From {s.low} to {s.high}" + ("" if defaulted else f"; default {default}")
    return api(
        f"{s.description} {bounds}.",
        default=s.default if defaulted else None,
        defaulted=defaulted,
        minimum=s.low,
        maximum=s.high,
    )


def choice(c: Choice) -> Any:
    """A declared field of the sidecar's word settings (the API server fills in its default)."""
    return api(c.description, default=c.default, defaulted=True, enum=c.values)


@dataclass(frozen=True)
class Batching:
    """spec.batching: the sidecar's batching flags, with the settings' defaults."""

    RULES = (
        Rule(
            "!has(self.maxWaitMs) || !has(self.timeoutMs) || self.maxWaitMs <= self.timeoutMs",
            "{path}.maxWaitMs must not exceed {path}.timeoutMs: a request would time out "
            "before its batch could close",
        ),
    )

    max_batch_size: int = setting(BY_ATTR["max_batch_size"], defaulted=True)
    max_wait_ms: int = setting(BY_ATTR["max_wait_ms"], defaulted=True)
    max_queue_size: int = setting(BY_ATTR["max_queue_size"], defaulted=True)
    max_batch_tokens: int = setting(BY_ATTR["max_batch_tokens"], defaulted=True)
    timeout_ms: int = setting(BY_ATTR["timeout_ms"], defaulted=True)
    max_concurrent_batches: int = setting(BY_ATTR["max_concurrent_batches"], defaulted=True)
    batch_by: str = choice(CHOICES_BY_ATTR["batch_by"])
    wait_policy: str = choice(CHOICES_BY_ATTR["wait_policy"])
    length_from: str = choice(CHOICES_BY_ATTR["length_from"])

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

RESOURCE_AMOUNTS: Json = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-int-or-string": True,
}


def resources_schema(whose: str) -> Json:
    """The schema of a container's requests and limits (Kubernetes' quantities)."""
    return {
        "properties": {
            "requests": {
                "type": "object",
                "description": f"Minimum resources {whose} needs, by resource name.",
                "additionalProperties": RESOURCE_AMOUNTS,
            },
            "limits": {
                "type": "object",
                "description": f"Maximum resources {whose} may use, by resource name.",
                "additionalProperties": RESOURCE_AMOUNTS,
            },
        }
    }


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


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret in the version's namespace."""

    name: str = api("The Secret's name.", min_length=1, max_length=253)
    key: str = api("The key in the Secret.", min_length=1, max_length=253)


@dataclass(frozen=True)
class SidecarSettings:
    """spec.sidecar: the sidecar settings a spec gives (None: not given)."""

    upstream_timeout_ms: int | None = setting(BY_ATTR["upstream_timeout_ms"], defaulted=False)
    max_body_bytes: int | None = setting(BY_ATTR["max_body_bytes"], defaulted=False)
    read_timeout_ms: int | None = setting(BY_ATTR["read_timeout_ms"], defaulted=False)
    drain_timeout_s: int | None = setting(BY_ATTR["drain_timeout_s"], defaulted=False)
    max_in_flight: int | None = setting(BY_ATTR["max_in_flight"], defaulted=False)
    readiness_timeout_ms: int | None = setting(BY_ATTR["readiness_timeout_ms"], defaulted=False)
    generation_timeout_ms: int | None = setting(BY_ATTR["generation_timeout_ms"], defaulted=False)
    engine_api_key_secret: SecretKey | None = api(
        "A key of a Secret in the version's namespace holding the model server's API key (an "
        "engine started with --api-key). It is mounted into the sidecar only, which sends it "
        "with every call to the model server as Authorization: Bearer. A client's own "
        "Authorization is never passed on.",
        default=None,
    )
    """The Secret key holding the model server's API key, which the sidecar sends it."""
    resources: Resources | None = api(
        "Compute resources of the batching sidecar container. Default: the operator's "
        "--sidecar-resources (the chart's sidecar.resources), with its requests raised to its "
        "limits when the model server's requests equal its limits for cpu and memory, so that "
        "the pod is Guaranteed.",
        default=None,
        items=resources_schema("the sidecar"),
        read=parse_resources,
    )
    """The sidecar container's resources; None: the operator's --sidecar-resources."""

    def sidecar_flags(self) -> list[str]:
        """Flags for the given settings, except drainTimeoutS (the pod's grace period needs
        it too: see manifests.py)."""
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


# The schemas of the Kubernetes types that spec.server passes into the pod as given, as far as
# the CRD checks them (the API server checks the rest when the operator applies the Deployment).

ENV_ITEMS: Json = {
    "type": "object",
    "description": "One environment variable.",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "description": "The variable's name.", "minLength": 1},
        "value": {"type": "string", "description": "The variable's value (empty when omitted)."},
        "valueFrom": {
            "type": "object",
            "description": "Where the value comes from instead, as in a Pod: for example "
            "{secretKeyRef: {name: hf-token, key: token}} or {configMapKeyRef: {...}}. The "
            "API server checks it when the operator applies the Deployment.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
    },
    "x-kubernetes-validations": [
        {
            "rule": "!(has(self.value) && has(self.valueFrom))",
            "message": "an env entry sets value or valueFrom, not both",
        }
    ],
}

ENV_FROM_ITEMS: Json = {
    "type": "object",
    "description": "One source (secretRef or configMapRef, with an optional prefix).",
    "x-kubernetes-preserve-unknown-fields": True,
}

VOLUME_MOUNTS_ITEMS: Json = {
    "type": "object",
    "description": "One mount.",
    "required": ["name", "mountPath"],
    "properties": {
        "name": {
            "type": "string",
            "description": "The volume's name in spec.server.volumes.",
            "minLength": 1,
            "maxLength": 63,
        },
        "mountPath": {
            "type": "string",
            "description": "Where the volume appears in the model server.",
            "minLength": 1,
            "maxLength": 4096,
        },
        "subPath": {
            "type": "string",
            "description": "A path inside the volume to mount instead of its root.",
            "maxLength": 4096,
        },
        "readOnly": {
            "type": "boolean",
            "description": "Mount it read-only (the default is read-write).",
        },
    },
}

VOLUMES_ITEMS: Json = {
    "type": "object",
    "description": "One volume; the API server checks its source.",
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "description": "The volume's name, a DNS label.",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        }
    },
    "x-kubernetes-preserve-unknown-fields": True,
}

INIT_CONTAINERS_ITEMS: Json = {
    "type": "object",
    "description": "One init container; the API server checks the rest of it.",
    "required": ["name", "image"],
    "properties": {
        "name": {
            "type": "string",
            "description": "The container's name, a DNS label.",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "x-kubernetes-validations": [
                {
                    "rule": "self != 'model' && self != 'sidecar'",
                    "message": "the init container names model and sidecar are the operator's (the "
                    "model server and the batching sidecar)",
                }
            ],
        },
        "image": {
            "type": "string",
            "description": "The container's image.",
            "minLength": 1,
            "maxLength": 1024,
        },
    },
    "x-kubernetes-preserve-unknown-fields": True,
}

TOLERATIONS_ITEMS: Json = {
    "type": "object",
    "description": "One toleration.",
    "x-kubernetes-preserve-unknown-fields": True,
}

IMAGE_PULL_SECRETS_ITEMS: Json = {
    "type": "object",
    "description": "One Secret of type kubernetes.io/dockerconfigjson.",
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "description": "The Secret's name.",
            "minLength": 1,
            "maxLength": 253,
        }
    },
}

TOPOLOGY_SPREAD_CONSTRAINTS_ITEMS: Json = {
    "type": "object",
    "description": "One constraint; the API server checks the rest of it.",
    "required": ["topologyKey"],
    "properties": {
        "topologyKey": {
            "type": "string",
            "description": "The node label whose values are the domains to spread over.",
            "minLength": 1,
            "maxLength": 316,
        },
        "whenUnsatisfiable": {
            "type": "string",
            "description": "What to do when the spread cannot be kept.",
            "enum": ["DoNotSchedule", "ScheduleAnyway"],
            "default": "DoNotSchedule",
        },
    },
    "x-kubernetes-preserve-unknown-fields": True,
}


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _env(raw: object, where: str) -> tuple[Json, ...]:
    """Each {name, value} or {name, valueFrom}, a missing value read as empty."""
    if not isinstance(raw, list) or not all(isinstance(v, Mapping) for v in raw):
        raise SpecError(f"{where} must be a list of objects")
    env: list[Json] = []
    for index, item in enumerate(raw):
        name, source = item.get("name"), item.get("valueFrom")
        if not isinstance(name, str) or not name:
            raise SpecError(f"{where}[{index}] needs a name")
        if source is not None:
            if "value" in item or not isinstance(source, Mapping):
                raise SpecError(f"{where}[{index}] sets value or valueFrom, not both")
            env.append({"name": name, "valueFrom": dict(source)})
        else:
            env.append({"name": name, "value": str(item.get("value", ""))})
    return tuple(env)


def _objects(raw: object, where: str) -> tuple[Json, ...]:
    if not isinstance(raw, list) or not all(isinstance(v, Mapping) for v in raw):
        raise SpecError(f"{where} must be a list of objects")
    return tuple(dict(v) for v in raw)


def _pull_secrets(raw: object, where: str) -> tuple[str, ...]:
    secrets = _objects(raw, where)
    if not all(isinstance(p.get("name"), str) for p in secrets):
        raise SpecError(f"{where} items need a name")
    return tuple(p["name"] for p in secrets)


def _named(raw: object, where: str) -> str | None:
    if not isinstance(raw, str):
        raise SpecError(f"{where} must be a string")
    return raw


def objects(description: str, items: Json, max_items: int, *keys: str) -> Any:
    """A declared list of Kubernetes objects passed into the pod as given; ``keys``: the
    fields that identify an item (a list-type map), if any."""
    extra: Json = {}
    if keys:
        extra = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}
    return api(
        description, default=(), items=items, max_items=max_items, extra=extra, read=_objects
    )


def passed(description: str) -> Any:
    """A declared Kubernetes object passed into the pod as given, None when left out."""
    return api(description, default=None)


def name_field(description: str, **bounds: Any) -> Any:
    """A declared name (a service account's, say): None when left out or empty."""
    return api(description, default=None, max_length=253, empty_is_none=True, read=_named, **bounds)


SERVED_MODEL_NAME = "^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
"""A model server's name for a model: one segment of its URL path, as the sidecar writes it."""


@dataclass(frozen=True)
class Server:
    """spec.server: the model server container of a managed version, and the pod fields that a
    real model needs. A curated set, not a pod template: each field has one place in the pod,
    none can reach the batching sidecar (see docs/design.md, "Managed mode")."""

    image: str = api("The model server's container image.", min_length=1, max_length=1024)
    image_pull_policy: str | None = api(
        "When to pull the image (Always, IfNotPresent or Never).",
        default=None,
        enum=("Always", "IfNotPresent", "Never"),
    )
    port: int = api(
        "The port the model server listens on for POST /v1/batch and GET /readyz (protocols "
        "OpenAI and OpenInference: for their own paths). The sidecar reaches it over localhost "
        "in the pod; other pods are kept off it only by a NetworkPolicy (the chart ships one).",
        default=8080,
        defaulted=True,
        minimum=1,
        maximum=65535,
    )
    served_model_name: str | None = api(
        "protocol OpenInference: the model's name in the model server, the {name} of its "
        "/v2/models/{name}/infer (MLServer: model-settings.json's name). Clients name the "
        "model by spec.model; the sidecar calls the server with this name. Default: spec.model.",
        default=None,
        empty_is_none=True,
        max_length=253,
        pattern=SERVED_MODEL_NAME,
    )
    """The model server's own name for the model (the sidecar's --served-model-name); None:
    spec.model."""
    command: tuple[str, ...] = api(
        "Overrides the image's entrypoint.",
        default=(),
        max_items=64,
        items={"type": "string", "description": "One word of the command."},
    )
    args: tuple[str, ...] = api(
        "Arguments to the model server's entrypoint.",
        default=(),
        max_items=256,
        items={"type": "string", "description": "One argument."},
    )
    env: tuple[Json, ...] = api(
        "Environment variables for the model server.",
        default=(),
        items=ENV_ITEMS,
        max_items=256,
        extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        read=_env,
    )
    """Each {name, value} or {name, valueFrom}."""
    env_from: tuple[Json, ...] = objects(
        "Variables for the model server from whole Secrets or ConfigMaps, as in a Pod: for "
        "example [{secretRef: {name: model-store-credentials}}].",
        ENV_FROM_ITEMS,
        32,
    )
    volume_mounts: tuple[Json, ...] = objects(
        "Volumes (from spec.server.volumes) mounted into the model server, for example its "
        "weights. The batching sidecar mounts none of them.",
        VOLUME_MOUNTS_ITEMS,
        64,
        "mountPath",
    )
    startup_probe: Json | None = passed(
        "The model server's startup probe, as in a Pod (httpGet, tcpSocket, exec or grpc, "
        "with periodSeconds and failureThreshold). A model that loads for minutes gets "
        "failureThreshold x periodSeconds to start before the kubelet restarts it; the "
        "batching sidecar starts only after it passes, so the pod takes no traffic while the "
        "model loads. Default: none."
    )
    readiness_probe: Json | None = passed(
        "The model server's readiness probe, as in a Pod: the pod takes traffic only while it "
        "passes (on top of the sidecar's own probe of the model's readiness path). Its port "
        "must be the model server's (port, or the name model). Default: none."
    )
    liveness_probe: Json | None = passed(
        "The model server's liveness probe, as in a Pod: the kubelet restarts a model server "
        "that fails it (one that hangs, say), while the pod's other replicas serve. Its port "
        "must be the model server's. Default: none, so a hung model is only taken out of "
        "traffic, never restarted."
    )
    """Restarts a hung model server (the sidecar's own probes only watch the sidecar)."""
    security_context: Json | None = passed(
        "The model server container's security context, as in a Pod: for a namespace "
        'enforcing Pod Security "restricted", {runAsNonRoot: true, allowPrivilegeEscalation: '
        "false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}. The "
        "sidecar's is the operator's (already restricted)."
    )
    # The pod's fields:
    volumes: tuple[Json, ...] = objects(
        "Pod volumes, as in a Pod: a PersistentVolumeClaim or an image volume with model "
        "weights, an emptyDir that an init container fills, a Secret. Mounted into the model "
        "server by spec.server.volumeMounts and into init containers by their own "
        "volumeMounts.",
        VOLUMES_ITEMS,
        64,
        "name",
    )
    init_containers: tuple[Json, ...] = objects(
        "Containers that run to completion before the model server starts, as in a Pod, for "
        "example one that downloads weights into an emptyDir. The names model and sidecar are "
        "the operator's.",
        INIT_CONTAINERS_ITEMS,
        16,
        "name",
    )
    node_selector: Mapping[str, str] = api(
        "Node labels the pods need, for example a GPU node pool: "
        "{cloud.google.com/gke-accelerator: nvidia-l4}.",
        default_factory=dict,
        max_properties=64,
    )
    tolerations: tuple[Json, ...] = objects(
        "Taints the pods tolerate, as in a Pod, for example [{key: nvidia.com/gpu, operator: "
        "Exists, effect: NoSchedule}].",
        TOLERATIONS_ITEMS,
        64,
    )
    affinity: Json | None = passed(
        "Node and pod (anti-)affinity, as in a Pod, for example to spread replicas over zones. "
        "The API server checks it."
    )
    image_pull_secrets: tuple[str, ...] = api(
        "Secrets for pulling the model server's and init containers' images.",
        default=(),
        items=IMAGE_PULL_SECRETS_ITEMS,
        max_items=16,
        extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        read=_pull_secrets,
        write=lambda names: [{"name": name} for name in names],
    )
    """The Secrets' names."""
    service_account_name: str | None = name_field(
        "The pods' service account, for example one bound to an object-store role (workload "
        "identity). Default: the namespace's default account.",
        pattern=DNS_SUBDOMAIN,
    )
    runtime_class_name: str | None = name_field(
        "The pods' RuntimeClass, for example nvidia. Default: the node's runtime.",
        pattern=DNS_SUBDOMAIN,
    )
    priority_class_name: str | None = name_field(
        "The pods' PriorityClass. Default: the cluster's default priority.",
        pattern=DNS_SUBDOMAIN,
    )
    scheduler_name: str | None = name_field(
        "The scheduler for the pods, for example a gang scheduler such as volcano. Default: the "
        "cluster's default scheduler."
    )
    dns_policy: str | None = api(
        "The pods' DNS policy, as in a Pod. Default ClusterFirst.",
        default=None,
        empty_is_none=True,
        enum=("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"),
    )
    host_ipc: bool = api(
        "The pods share the host's IPC namespace (some multi-process GPU runtimes need it; Pod "
        'Security "baseline" refuses it). Default false.',
        default=False,
        name="hostIPC",
    )
    share_process_namespace: bool = api(
        "The pod's containers share one process namespace, so that the model server and its "
        "init containers see each other's processes (the batching sidecar's too). Default "
        "false.",
        default=False,
    )
    topology_spread_constraints: tuple[Json, ...] = objects(
        "How the pods spread over zones or nodes, as in a Pod; select the version's pods with "
        "the label modelroll.io/version.",
        TOPOLOGY_SPREAD_CONSTRAINTS_ITEMS,
        16,
        "topologyKey",
        "whenUnsatisfiable",
    )
    pod_labels: Mapping[str, str] = api(
        "Labels on the pods, for example Kueue's kueue.x-k8s.io/queue-name. The operator's own "
        "(modelroll.io/*, app.kubernetes.io/*) cannot be set here.",
        default_factory=dict,
        max_properties=64,
    )
    pod_annotations: Mapping[str, str] = api(
        "Annotations on the pods, for example a CSI driver's or a service mesh's. "
        "modelroll.io/* and kubectl.kubernetes.io/default-container are the operator's.",
        default_factory=dict,
        max_properties=64,
    )
    resources: Resources = api(
        "Compute resources of the model server container (unset by default), e.g. requests "
        '{cpu: "1", memory: 2Gi} and limits {nvidia.com/gpu: 1}.',
        default_factory=dict,
        items=resources_schema("the container"),
        read=parse_resources,
    )
    baseline_violations: tuple[str, ...] = ()
    """What in these fields Pod Security "baseline" forbids, each naming the field and the rule
    (pod_security.py); the operator's --pod-security says whether that refuses the version."""

    @classmethod
    def derive(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        """What reading a stored server adds to its fields."""
        return {"baseline_violations": violations(raw)}

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

    RULES = (
        Rule(
            "(has(self.kind) && self.kind == 'InferencePool') != has(self.port)",
            "{path}.port is required for a Service and not allowed for an InferencePool",
        ),
    )

    name: str = api(
        "The Service's or InferencePool's name, in the version's namespace.",
        min_length=1,
        max_length=253,
    )
    kind: str = api(
        "Service (the default) or InferencePool.",
        default="Service",
        defaulted=True,
        enum=("Service", "InferencePool"),
    )
    """Service, or InferencePool (the Gateway API Inference Extension's)."""
    port: int | None = api(
        "The Service's port (a Service needs one; an InferencePool has none).",
        default=None,
        format="",
        minimum=1,
        maximum=65535,
    )
    """The Service's port; None for an InferencePool."""

    def validate(self) -> None:
        """The CRD's rules across fields, for an object stored before them."""
        if (self.kind == "InferencePool") == (self.port is not None):
            raise SpecError(
                "spec.backendRef.port is required for a Service and not allowed for an "
                "InferencePool"
            )


@dataclass(frozen=True)
class Shadow:
    """spec.shadow: the share of the model's requests copied to this version."""

    percent: int = api(
        "The share of the model's requests copied, 1 to 100 (10: exactly one in ten).",
        minimum=1,
        maximum=100,
    )


TARGETS = ("inFlight", "queueWaitP95Ms", "timeToFirstTokenP95Ms", "tokensPerSecond")
"""The targets of spec.scaling, by their field names; a version names exactly one."""


@dataclass(frozen=True)
class Scaling:
    """spec.scaling: autoscale the version on a serving signal of its sidecar, between
    minReplicas and maxReplicas, through a HorizontalPodAutoscaler on the ModelVersion's scale
    subresource (autoscaling.py writes it, as a KEDA ScaledObject)."""

    RULES = (
        Rule(
            "self.minReplicas <= self.maxReplicas",
            "{path}.minReplicas must not exceed {path}.maxReplicas",
        ),
        Rule(
            "[" + ", ".join(f"has(self.{t})" for t in TARGETS) + "].filter(x, x).size() == 1",
            "{path} needs exactly one target: " + ", ".join(TARGETS[:-1]) + " or " + TARGETS[-1],
        ),
    )

    max_replicas: int = api(
        "The most replicas the autoscaler gives the version.", minimum=1, maximum=1000
    )
    min_replicas: int = api(
        "The fewest replicas the autoscaler leaves the version. 0 lets a version that takes no "
        "traffic scale to zero once its metric is 0: a request pinned to it is answered 503 "
        "with Retry-After until a replica is Ready. While the version's share of its model's "
        "traffic moves, the operator raises this minimum to the replicas the share needs.",
        default=1,
        defaulted=True,
        minimum=0,
        maximum=1000,
    )
    in_flight: int | None = api(
        "Target: requests in flight per replica, accepted by the sidecar and not yet answered "
        "(modelroll_requests_in_flight; chat versions: modelroll_llm_requests_in_flight).",
        default=None,
        minimum=1,
        maximum=100000,
    )
    queue_wait_p95_ms: int | None = api(
        "Target: the 95th percentile of the time requests wait in the sidecar's queue over the "
        "last minute, in milliseconds (modelroll_queue_wait_seconds). Protocols Batch and "
        "OpenInference.",
        default=None,
        minimum=1,
        maximum=3600000,
    )
    time_to_first_token_p95_ms: int | None = api(
        "Target: the 95th percentile of the time to the first generated token over the last "
        "minute, in milliseconds (modelroll_llm_time_to_first_token_seconds). OpenAI protocol "
        "only.",
        default=None,
        minimum=1,
        maximum=3600000,
    )
    tokens_per_second: int | None = api(
        "Target: generated tokens per second per replica over the last minute "
        "(modelroll_llm_output_tokens_total). OpenAI protocol only.",
        default=None,
        minimum=1,
        maximum=1000000,
    )
    scale_down_stabilization_seconds: int = api(
        "How long the autoscaler looks back before it scales down: it takes the highest "
        "recommendation of that window (the HorizontalPodAutoscaler's "
        "behavior.scaleDown.stabilizationWindowSeconds).",
        default=300,
        defaulted=True,
        minimum=0,
        maximum=3600,
    )

    def validate(self) -> None:
        if self.min_replicas > self.max_replicas:
            raise SpecError("spec.scaling.minReplicas must not exceed spec.scaling.maxReplicas")
        if len(self.targets()) != 1:
            raise SpecError(f"spec.scaling needs exactly one target: {', '.join(TARGETS)}")

    def targets(self) -> dict[str, int]:
        """The targets given, by field name."""
        given = {
            "inFlight": self.in_flight,
            "queueWaitP95Ms": self.queue_wait_p95_ms,
            "timeToFirstTokenP95Ms": self.time_to_first_token_p95_ms,
            "tokensPerSecond": self.tokens_per_second,
        }
        return {name: value for name, value in given.items() if value is not None}


def _endpoint(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise SpecError(f"{where} must be a string")
    return raw.rstrip("/")  # normalised like the gateway does


def _cohort_header(raw: object, where: str) -> str:
    try:
        return validate_cohort_header(raw)
    except RoutesError as exc:
        raise SpecError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class ModelVersionSpec:
    """A parsed spec. Exactly one of ``server`` (managed) and ``endpoint`` (external) is set.
    spec.analysis is read on its own (analysis/spec.py), by the analysis of a canary."""

    RULES = (
        Rule(
            "!has(self.analysis) || !has(self.analysis.shadow) || has(self.shadow)",
            "spec.analysis.shadow needs spec.shadow: the gate judges the version's shadow copies",
        ),
        Rule(
            "has(self.server) != (has(self.endpoint) && self.endpoint != '')",
            "exactly one of spec.server (managed mode: the operator runs the model) and "
            "spec.endpoint (external mode: route to an existing URL) must be set",
        ),
        Rule(
            "!has(self.server) || !has(self.backendRef)",
            "spec.backendRef is for external versions: a managed version's backend is its own "
            "Service",
        ),
        Rule(
            "!has(self.scaling) || has(self.server)",
            "spec.scaling is for managed versions (spec.server): the operator cannot scale an "
            "external version's pods",
        ),
        Rule(
            "!has(self.scaling) || !(has(self.protocol) && self.protocol == 'OpenAI') || "
            "!has(self.scaling.queueWaitP95Ms)",
            "spec.scaling.queueWaitP95Ms needs spec.protocol Batch or OpenInference: an OpenAI "
            "version's sidecar queues nothing; use timeToFirstTokenP95Ms, tokensPerSecond or "
            "inFlight",
        ),
        Rule(
            "!has(self.scaling) || (has(self.protocol) && self.protocol == 'OpenAI') || "
            "!(has(self.scaling.timeToFirstTokenP95Ms) || has(self.scaling.tokensPerSecond))",
            "spec.scaling.timeToFirstTokenP95Ms and tokensPerSecond need spec.protocol OpenAI "
            "(a chat version); use inFlight or queueWaitP95Ms",
        ),
        Rule(
            "!(has(self.protocol) && self.protocol == 'OpenAI' && has(self.batching) && "
            "has(self.batching.lengthFrom) && self.batching.lengthFrom == 'Tokenizer')",
            "spec.batching.lengthFrom Tokenizer needs spec.protocol Batch: the model protocol "
            "serves a tokenizer, an OpenAI engine does not",
        ),
        Rule(
            "!(has(self.protocol) && self.protocol == 'OpenInference' && has(self.batching) && "
            "has(self.batching.lengthFrom) && self.batching.lengthFrom == 'Tokenizer')",
            "spec.batching.lengthFrom Tokenizer needs spec.protocol Batch: an OpenInference "
            "server serves no tokenizer of the model protocol's",
        ),
        Rule(
            "!has(self.server) || !has(self.server.servedModelName) || "
            "(has(self.protocol) && self.protocol == 'OpenInference')",
            "spec.server.servedModelName needs spec.protocol OpenInference: only an Open "
            "Inference Protocol server is called by the model's name in its path",
        ),
    )

    model: str = api(
        'The model (routing group) this version belongs to: a DNS label such as "sentiment". '
        "It is also the key of the model's entry in the modelroll-routes ConfigMap. Immutable.",
        min_length=1,
        max_length=63,
        rules=(
            Rule(
                "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                "spec.model must be a DNS label: lowercase letters, digits and '-', starting "
                "and ending with a letter or digit",
            ),
            Rule(
                "self == oldSelf",
                "spec.model is immutable: create a new ModelVersion for the other model",
            ),
        ),
    )
    weight: int = api(
        "Relative routing weight, 0 to 1000. The version's share of its model's traffic is "
        "weight divided by the sum of the weights of the model's Ready versions. 0 (the "
        "default) deploys the version dark: routable only when a request pins it with the "
        "X-Modelroll-Version header.",
        default=0,
        defaulted=True,
        minimum=0,
        maximum=1000,
    )
    shadow: Shadow | None = api(
        "Shadow traffic: the gateway copies this percentage of the model's requests that other "
        "versions answered with a 200 to this version, once it has the client's answer, and "
        "records how far the two answers agree (modelroll_gateway_shadow_agreement). The "
        "client never waits for a copy, and nothing the shadow does reaches it. Copies go to "
        "POST /v1/infer (the model protocol), or, of an Open Inference Protocol request, to "
        "POST /v2/models/{model}/infer, compared output tensor by output tensor. Usually with "
        "weight 0.",
        default=None,
    )
    cohort_header: str | None = api(
        "Sticky cohorts for the model: a request carrying this header (a user id or an API-key "
        "hash, say) goes to the version its value hashes to, weighted by the same weights, on "
        "every gateway replica alike. As a canary's weight grows only keys move to it, none "
        "back; requests without the header are routed by weight in turn. Per model: the header "
        "of the highest-weight Ready version that names one is in force. Unset (the default): "
        "every request is routed by weight in turn.",
        default=None,
        empty_is_none=True,
        max_length=64,
        pattern="^[!#$%&'*+.^_`|~0-9A-Za-z-]+$",
        rules=(
            Rule(
                "self.lowerAscii() != 'x-modelroll-version'",
                "spec.cohortHeader cannot be X-Modelroll-Version, the header that pins a "
                "request to a version",
            ),
        ),
        read=_cohort_header,
    )
    """The header keying the model's sticky cohorts, if this version names one."""
    endpoint: str | None = api(
        "External mode: the base URL of a running sidecar (or any server speaking the "
        "sidecar's POST /v1/infer protocol), e.g. http://sentiment-v1.models:8000. The "
        "operator routes to it and creates no workload. Mutually exclusive with server.",
        default=None,
        empty_is_none=True,
        max_length=2048,
        rules=(
            Rule(
                "self == '' || self.matches('^https?://[^/?#@\\\\s]+(/[^?#\\\\s]*)?$')",
                "spec.endpoint must be an http:// or https:// URL with a host and no query, "
                "fragment or credentials, e.g. http://sentiment-v1.models:8000",
            ),
        ),
        read=_endpoint,
    )
    backend_ref: BackendRef | None = api(
        "External mode, for a model routed by a Gateway API HTTPRoute (an HTTPRoute labelled "
        "modelroll.io/model with the model's name): the backend that route sends this "
        "version's share to. A Service and its port, or an InferencePool of the Gateway API "
        "Inference Extension (inference.networking.k8s.io). A managed version's backend is its "
        "own Service, and the modelroll gateway ignores this field.",
        default=None,
    )
    """External mode: the backend of the version in its model's HTTPRoute, if it names one."""
    server: Server | None = api(
        "Managed mode: the model server container and the pod fields a real model needs "
        "(volumes, init containers, scheduling, service account). The operator runs it with "
        "the batching sidecar in a Deployment, and a Service on the sidecar's port; the "
        "sidecar container, its port, probes and security context are the operator's and no "
        "field here changes them. Mutually exclusive with endpoint.",
        default=None,
    )
    protocol: str = choice(PROTOCOL)
    replicas: int = api(
        "Managed mode: pods of the version's Deployment. Also set by kubectl scale and by the "
        "autoscaler of spec.scaling (the scale subresource). The Deployment runs more while "
        "the version's share of its model's traffic needs more (status.capacity). Ignored in "
        "external mode.",
        default=1,
        defaulted=True,
        minimum=0,
        maximum=1000,
    )
    scaling: Scaling | None = api(
        "Managed mode: autoscale the version on a serving signal (a target per replica) "
        "between minReplicas and maxReplicas. The operator owns a HorizontalPodAutoscaler on "
        "the version's scale subresource, which sets spec.replicas. Needs the operator's "
        "--autoscaler (the chart's autoscaling values); without it the Autoscaling condition "
        "says so and spec.replicas stays as written.",
        default=None,
    )
    scale_down_delay_seconds: int = api(
        "Managed mode: how long a version keeps its replicas after its share of the model's "
        "traffic falls (a canary rolled back, the stable after a promotion), so that moving the "
        "traffic back within this time is as instant as moving it away. Then it returns to "
        "spec.replicas (with spec.scaling, to the autoscaler's minimum).",
        default=600,
        defaulted=True,
        minimum=0,
        maximum=86400,
    )
    batching: Batching = api(
        "Managed mode: how the sidecar groups requests into batches. A batch closes when it "
        "holds maxBatchSize requests, when its oldest request has waited maxWaitMs, when the "
        "next request would exceed maxBatchTokens, or, with waitPolicy Adaptive, earlier when "
        "a model slot is free and waiting is not worth it. batchBy decides which queued "
        "requests it takes. Changing any of these rolls the Deployment.",
        default_factory=Batching,
        schema_default={},
    )
    sidecar: SidecarSettings = api(
        "Managed mode: the batching sidecar's other per-version settings. A field left out "
        "keeps the sidecar's default (drainTimeoutS: the operator's --drain-timeout-s). "
        "Changing any of these rolls the Deployment. An external version runs no sidecar of "
        "modelroll's: there these fields are ignored, and a Warning event and the Ready "
        "condition's message say so.",
        default_factory=SidecarSettings,
    )

    def validate(self) -> None:
        """The CRD's rules across fields, for an object stored before them."""
        if (self.server is None) == (self.endpoint is None):
            raise SpecError("exactly one of spec.server and spec.endpoint must be set")
        if self.server is not None and self.backend_ref is not None:
            raise SpecError("spec.backendRef is for external versions, not with spec.server")
        if self.scaling is not None and self.server is None:
            raise SpecError("spec.scaling is for managed versions (spec.server)")
        served = self.server.served_model_name if self.server else None
        if served is not None and self.protocol != "OpenInference":
            raise SpecError("spec.server.servedModelName needs spec.protocol OpenInference")

    @property
    def managed(self) -> bool:
        return self.server is not None

    @property
    def shadow_percent(self) -> int:
        """The percentage of the model's requests copied to this version (0: none)."""
        return self.shadow.percent if self.shadow is not None else 0

    def ignored_settings(self) -> list[str]:
        """Sidecar settings an external version gives: it runs no sidecar of ours."""
        if self.managed:
            return []
        return self.batching.changed() + self.sidecar.given()


def parse_batching(raw: object) -> Batching:
    """spec.batching (all defaults when None)."""
    return Batching() if raw is None else decode(Batching, raw, "spec.batching")


def parse_server(raw: object) -> Server:
    """spec.server."""
    return decode(Server, raw, "spec.server")


def parse_spec(raw: Mapping[str, Any]) -> ModelVersionSpec:
    """A typed spec, or SpecError naming the field at fault."""
    return decode(ModelVersionSpec, raw, "spec")

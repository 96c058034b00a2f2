"""The manifests of managed mode: the Deployment (model + batching sidecar) and Service of one
ModelVersion.

Only the parts of a spec that shape the pod go into its template, so a weight change leaves the
Deployment untouched, while a change to spec.batching or spec.server rolls it. Each manifest
carries a hash of itself; the operator applies a manifest only when that hash differs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf

from .config import GRACE_MARGIN_S, OperatorConfig
from .snapshots import VersionInfo
from .spec import (
    ANNOTATION_SPEC_HASH,
    LABEL_MANAGED_BY,
    LABEL_MODEL,
    LABEL_VERSION,
    MANAGED_BY,
    PREFIX,
    PROTOCOL,
    ModelVersionSpec,
    Resources,
    Server,
)

SIDECAR_CONTAINER = "sidecar"
MODEL_CONTAINER = "model"
PORT_NAME = "http"
MODEL_PORT_NAME = "model"
CONTROL_PORT = 8001
"""The sidecar's --control-port in managed pods: GET /prestop on 127.0.0.1 only, which the
preStop hook calls from inside the sidecar container. Not a container port: nothing outside the
pod can reach it. spec.server.port may not take it (the model server would hold it first)."""
SERVED_MODEL_NAME_FLAG = "--served-model-name"
"""The sidecar's flag for spec.server.servedModelName (protocol OpenInference); left out, the
sidecar calls the model server by spec.model."""
PRESTOP_COMMAND = ("python3", "-m", "modelroll_sidecar.prestop", f"--control-port={CONTROL_PORT}")
"""The preStop exec hook (modelroll_sidecar.prestop in the sidecar image)."""


def selector_labels(model: str, version: str) -> dict[str, str]:
    """The Deployment's (immutable) pod selector and the Service's selector."""
    return {LABEL_MODEL: model, LABEL_VERSION: version}


def workload_labels(model: str, version: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": model,
        "app.kubernetes.io/instance": version,
        "app.kubernetes.io/component": "model-server",
        "app.kubernetes.io/part-of": "modelroll",
        LABEL_MANAGED_BY: MANAGED_BY,
        **selector_labels(model, version),
    }


def selector_string(model: str, version: str) -> str:
    """The pod selector as status.selector shows it (for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(model, version).items()))


def service_endpoint(name: str, namespace: str, port: int) -> str:
    """The URL the gateway uses for a managed version: its Service, on the sidecar port."""
    return f"http://{name}.{namespace}.svc:{port}"


def drain_timeout_s(spec: ModelVersionSpec, config: OperatorConfig) -> int:
    """The version's spec.sidecar.drainTimeoutS, else the operator's --drain-timeout-s."""
    given = spec.sidecar.drain_timeout_s
    return given if given is not None else config.drain_timeout_s


def sidecar_args(name: str, spec: ModelVersionSpec, config: OperatorConfig) -> list[str]:
    """The sidecar's flags: identity, upstream on localhost, ports, batching, the spec.sidecar
    settings given, drain."""
    assert spec.server is not None
    return [
        f"--model={spec.model}",
        f"--version={name}",
        f"--upstream=http://127.0.0.1:{spec.server.port}",
        f"--port={config.sidecar_port}",
        f"--control-port={CONTROL_PORT}",
        *spec.batching.sidecar_flags(),
        *spec.sidecar.sidecar_flags(),
        *([PROTOCOL.flag_for(spec.protocol)] if spec.protocol != PROTOCOL.default else []),
        *(
            [f"{SERVED_MODEL_NAME_FLAG}={served}"]
            if (served := spec.server.served_model_name)
            else []
        ),
        *(
            [f"--engine-api-key-file={ENGINE_KEY_FILE}"]
            if spec.sidecar.engine_api_key_secret
            else []
        ),
        f"--drain-timeout-s={drain_timeout_s(spec, config)}",
    ]


ENGINE_KEY_VOLUME = "modelroll-engine-api-key"
"""The pod volume holding spec.sidecar.engineApiKeySecret's key, mounted into the sidecar only."""
ENGINE_KEY_DIR = "/var/run/modelroll/engine-api-key"
ENGINE_KEY_FILE = f"{ENGINE_KEY_DIR}/key"


def engine_key_volume(spec: ModelVersionSpec) -> list[dict[str, Any]]:
    """The Secret volume of the engine's API key, when the version names one."""
    secret = spec.sidecar.engine_api_key_secret
    if secret is None:
        return []
    items = [{"key": secret.key, "path": "key"}]
    return [{"name": ENGINE_KEY_VOLUME, "secret": {"secretName": secret.name, "items": items}}]


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def sidecar_container(name: str, spec: ModelVersionSpec, config: OperatorConfig) -> dict[str, Any]:
    return {
        "name": SIDECAR_CONTAINER,
        "image": config.sidecar_image,
        "args": sidecar_args(name, spec, config),
        "ports": [{"name": PORT_NAME, "containerPort": config.sidecar_port, "protocol": "TCP"}],
        "resources": sidecar_resources(spec, config),
        **(
            {
                "volumeMounts": [
                    {"name": ENGINE_KEY_VOLUME, "mountPath": ENGINE_KEY_DIR, "readOnly": True}
                ]
            }
            if spec.sidecar.engine_api_key_secret
            else {}
        ),
        "livenessProbe": _probe("/livez", 10, 3),
        "readinessProbe": _probe("/readyz", 2, 1),
        # Before SIGTERM: keep serving while the pod leaves its Service's endpoints, closing
        # every connection after its answer so that the gateway reconnects to other pods. The
        # hook runs in this container: the control port listens on 127.0.0.1, so only the pod
        # itself reaches it.
        "lifecycle": {"preStop": {"exec": {"command": list(PRESTOP_COMMAND)}}},
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


QOS_RESOURCES = ("cpu", "memory")


def guaranteed(resources: Resources) -> bool:
    """Whether a container's resources put it in the Guaranteed QoS class: a limit on cpu and
    memory, each request (when given) equal to its limit."""
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    return all(
        name in limits and str(requests.get(name, limits[name])) == str(limits[name])
        for name in QOS_RESOURCES
    )


def sidecar_resources(spec: ModelVersionSpec, config: OperatorConfig) -> dict[str, Any]:
    """spec.sidecar.resources, else the operator's, with requests raised to the limits when the
    model container is Guaranteed: a pod is Guaranteed only when every container is."""
    if spec.sidecar.resources is not None:
        return {k: dict(v) for k, v in spec.sidecar.resources.items()}
    resources = {k: dict(v) for k, v in config.sidecar_resources.items()}
    if spec.server is not None and guaranteed(spec.server.resources):
        resources["requests"] = dict(resources.get("limits") or {})
    return resources


def model_container(server: Server) -> dict[str, Any]:
    """The user's model server, as given. The sidecar reaches its port over localhost; other
    pods reach it unless a NetworkPolicy keeps them off (the chart's does).

    It runs as a native sidecar (an init container that keeps running): the kubelet starts it
    before the batching sidecar and stops it only after the batching sidecar has exited, so the
    batches it is still draining on SIGTERM reach a model that is still there.
    """
    container: dict[str, Any] = {
        "name": MODEL_CONTAINER,
        "image": server.image,
        "restartPolicy": "Always",
        "ports": [{"name": MODEL_PORT_NAME, "containerPort": server.port, "protocol": "TCP"}],
    }
    if server.image_pull_policy:
        container["imagePullPolicy"] = server.image_pull_policy
    if server.command:
        container["command"] = list(server.command)
    if server.args:
        container["args"] = list(server.args)
    if server.env:
        container["env"] = [dict(e) for e in server.env]
    if server.env_from:
        container["envFrom"] = [dict(e) for e in server.env_from]
    if server.resources:
        container["resources"] = {k: dict(v) for k, v in server.resources.items()}
    if server.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in server.volume_mounts]
    container.update({key: dict(probe) for key, probe in server.probes.items()})
    if server.security_context is not None:
        container["securityContext"] = dict(server.security_context)
    return container


def pod_fields(server: Server) -> dict[str, Any]:
    """The pod-level fields of spec.server that are given (none are by default, so a spec
    without them renders the pod it always did and rolls nothing)."""
    fields: dict[str, Any] = {}
    lists = {
        "volumes": server.volumes,
        "tolerations": server.tolerations,
        "topologySpreadConstraints": server.topology_spread_constraints,
    }
    for key, items in lists.items():
        if items:
            fields[key] = [dict(i) for i in items]
    if server.node_selector:
        fields["nodeSelector"] = dict(server.node_selector)
    if server.affinity is not None:
        fields["affinity"] = dict(server.affinity)
    if server.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": n} for n in server.image_pull_secrets]
    names = {
        "serviceAccountName": server.service_account_name,
        "runtimeClassName": server.runtime_class_name,
        "priorityClassName": server.priority_class_name,
        "schedulerName": server.scheduler_name,
        "dnsPolicy": server.dns_policy,
    }
    fields.update({key: value for key, value in names.items() if value})
    switches = {"hostIPC": server.host_ipc, "shareProcessNamespace": server.share_process_namespace}
    fields.update({key: True for key, on in switches.items() if on})
    return fields


DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
"""The pod annotation kubectl logs and exec follow when no -c is given: the model server."""


def pod_metadata(server: Server, labels: Mapping[str, str]) -> dict[str, Any]:
    """The pod template's labels (the user's, then the operator's) and annotations (the user's,
    and kubectl's default container)."""
    return {
        "labels": {**server.pod_labels, **labels},
        "annotations": {**server.pod_annotations, DEFAULT_CONTAINER: MODEL_CONTAINER},
    }


OPERATOR_CONTAINERS = (MODEL_CONTAINER, SIDECAR_CONTAINER)


def conflict(server: Server, sidecar_port: int) -> str | None:
    """What in spec.server would collide with what the operator injects (the sidecar's ports
    and the operator's container names), or mount a volume the pod lacks; None when nothing
    does. The message names the field. The CRD refuses some of these already; an object
    stored before it did, or a sidecar port the operator was started with, is caught here."""
    if server.port == sidecar_port:
        return (
            f"spec.server.port {server.port} is the batching sidecar's port in the pod; "
            "the model server needs another"
        )
    if server.port == CONTROL_PORT:
        return (
            f"spec.server.port {server.port} is the batching sidecar's control port in the pod "
            "(its preStop hook's); the model server needs another"
        )
    volumes = {v.get("name") for v in server.volumes}
    if ENGINE_KEY_VOLUME in volumes:
        return f"spec.server.volumes: the name {ENGINE_KEY_VOLUME} is the operator's"
    for index, container in enumerate(server.init_containers):
        where = f"spec.server.initContainers[{index}]"
        if container.get("name") in OPERATOR_CONTAINERS:
            return (
                f"{where}.name {container.get('name')!r} is the operator's "
                f"(the names {' and '.join(OPERATOR_CONTAINERS)} are taken)"
            )
        for number, port in enumerate(container.get("ports") or []):
            taken = (sidecar_port, CONTROL_PORT, server.port)
            if isinstance(port, dict) and port.get("containerPort") in taken:
                return (
                    f"{where}.ports[{number}].containerPort {port['containerPort']} is the "
                    "batching sidecar's or the model server's port"
                )
        for number, mount in enumerate(container.get("volumeMounts") or []):
            if isinstance(mount, dict) and mount.get("name") not in volumes:
                return f"{where}.volumeMounts[{number}].name is not in spec.server.volumes"
    for index, mount in enumerate(server.volume_mounts):
        if mount.get("name") not in volumes:
            return (
                f"spec.server.volumeMounts[{index}].name {mount.get('name')!r} is not in "
                "spec.server.volumes"
            )
    return _metadata_conflict(server) or _probe_conflict(server)


RESERVED_LABELS = frozenset(workload_labels("model", "version"))
"""The pod labels the operator sets (the selector among them); spec.server.podLabels may not."""


def _metadata_conflict(server: Server) -> str | None:
    for field_name, given, reserved in (
        ("podLabels", server.pod_labels, RESERVED_LABELS),
        ("podAnnotations", server.pod_annotations, frozenset({DEFAULT_CONTAINER})),
    ):
        for key in sorted(given):
            if key in reserved or key.split("/")[0] == PREFIX:
                return (
                    f"spec.server.{field_name} key {key!r} is the operator's "
                    f"(it sets {', '.join(sorted(reserved))} and every {PREFIX}/ key)"
                )
    return None


PROBE_HANDLERS = ("httpGet", "tcpSocket", "grpc")


def _probe_conflict(server: Server) -> str | None:
    """A probe of the model container on a port it does not have could never pass."""
    for key, probe in server.probes.items():
        for handler in PROBE_HANDLERS:
            action = probe.get(handler)
            if not isinstance(action, Mapping) or "port" not in action:
                continue
            port = action["port"]
            if port not in (server.port, MODEL_PORT_NAME):
                return (
                    f"spec.server.{key}.{handler}.port {port!r} is not the model server's "
                    f"port ({server.port}, named {MODEL_PORT_NAME}): the probe could never pass"
                )
    return None


def spec_hash(manifest: dict[str, Any]) -> str:
    """A short, stable hash of a manifest (without its own hash annotation)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _finish(manifest: dict[str, Any], version: VersionInfo) -> dict[str, Any]:
    """Owner reference, namespace and the owner's labels (kopf.adopt), then the hash."""
    kopf.adopt(manifest, owner=version.owner_body())  # type: ignore[arg-type]
    manifest["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(manifest)
    return manifest


def deployment_manifest(
    version: VersionInfo, config: OperatorConfig, floor: int = 0
) -> dict[str, Any]:
    """The version's Deployment: the model container and the batching sidecar; its replicas
    spec.replicas, or ``floor`` when that is more (what its share of the traffic needs:
    capacity.py)."""
    spec = version.spec
    assert spec is not None
    assert spec.server is not None
    labels = workload_labels(spec.model, version.name)
    manifest: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": version.name, "labels": dict(labels)},
        "spec": {
            "replicas": max(spec.replicas, floor),
            "selector": {"matchLabels": selector_labels(spec.model, version.name)},
            "template": {
                "metadata": pod_metadata(spec.server, labels),
                "spec": {
                    # Longer than the sidecar's drain: the kubelet never kills a draining one.
                    "terminationGracePeriodSeconds": drain_timeout_s(spec, config) + GRACE_MARGIN_S,
                    # The user's init containers run to completion first (fetching weights,
                    # say); then the model server starts, and the sidecar once it has started.
                    "initContainers": [
                        *(dict(c) for c in spec.server.init_containers),
                        model_container(spec.server),
                    ],
                    "containers": [sidecar_container(version.name, spec, config)],
                    **pod_fields(spec.server),
                },
            },
        },
    }
    if key_volume := engine_key_volume(spec):
        pod = manifest["spec"]["template"]["spec"]
        pod["volumes"] = [*pod.get("volumes", []), *key_volume]
    return _finish(manifest, version)


def service_manifest(version: VersionInfo, config: OperatorConfig) -> dict[str, Any]:
    """The version's Service: the sidecar's port, never the model's."""
    spec = version.spec
    assert spec is not None
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": version.name,
            "labels": workload_labels(spec.model, version.name),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(spec.model, version.name),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": config.sidecar_port,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }
    return _finish(manifest, version)

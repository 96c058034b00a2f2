"""Managed mode: the Deployment (model + batching sidecar) and Service of one ModelVersion.

Only the parts of a spec that shape the pod go into its template, so a weight change leaves the
Deployment untouched, while a change to spec.batching or spec.server rolls it. Each manifest
carries a hash of itself; the operator applies a manifest only when that hash differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import kopf

from .settings import GRACE_MARGIN_S, OperatorConfig
from .spec import (
    ANNOTATION_SPEC_HASH,
    LABEL_MANAGED_BY,
    LABEL_MODEL,
    LABEL_VERSION,
    MANAGED_BY,
    ModelVersionSpec,
    Server,
)
from .state import VersionInfo

SIDECAR_CONTAINER = "sidecar"
MODEL_CONTAINER = "model"
PORT_NAME = "http"


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
    """The sidecar's flags: identity, upstream on localhost, port, batching, the spec.sidecar
    settings given, drain."""
    assert spec.server is not None
    return [
        f"--model={spec.model}",
        f"--version={name}",
        f"--upstream=http://127.0.0.1:{spec.server.port}",
        f"--port={config.sidecar_port}",
        *spec.batching.sidecar_flags(),
        *spec.sidecar.sidecar_flags(),
        f"--drain-timeout-s={drain_timeout_s(spec, config)}",
    ]


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
        "livenessProbe": _probe("/livez", 10, 3),
        "readinessProbe": _probe("/readyz", 2, 1),
        # Before SIGTERM: keep serving while the pod leaves its Service's endpoints, closing
        # every connection after its answer so that the gateway reconnects to other pods.
        "lifecycle": {"preStop": {"httpGet": {"path": "/prestop", "port": PORT_NAME}}},
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def model_container(server: Server) -> dict[str, Any]:
    """The user's model server, as given; its port is only reached over localhost.

    It runs as a native sidecar (an init container that keeps running): the kubelet starts it
    before the batching sidecar and stops it only after the batching sidecar has exited, so the
    batches it is still draining on SIGTERM reach a model that is still there.
    """
    container: dict[str, Any] = {
        "name": MODEL_CONTAINER,
        "image": server.image,
        "restartPolicy": "Always",
        "ports": [{"name": "model", "containerPort": server.port, "protocol": "TCP"}],
    }
    if server.image_pull_policy:
        container["imagePullPolicy"] = server.image_pull_policy
    if server.command:
        container["command"] = list(server.command)
    if server.args:
        container["args"] = list(server.args)
    if server.env:
        container["env"] = [{"name": n, "value": v} for n, v in server.env]
    if server.resources:
        container["resources"] = {k: dict(v) for k, v in server.resources.items()}
    return container


def spec_hash(manifest: dict[str, Any]) -> str:
    """A short, stable hash of a manifest (without its own hash annotation)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _finish(manifest: dict[str, Any], version: VersionInfo) -> dict[str, Any]:
    """Owner reference, namespace and the owner's labels (kopf.adopt), then the hash."""
    kopf.adopt(manifest, owner=version.owner_body())  # type: ignore[arg-type]
    manifest["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(manifest)
    return manifest


def deployment_manifest(version: VersionInfo, config: OperatorConfig) -> dict[str, Any]:
    """The version's Deployment: the model container and the batching sidecar."""
    spec = version.spec
    assert spec is not None
    assert spec.server is not None
    labels = workload_labels(spec.model, version.name)
    manifest: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": version.name, "labels": dict(labels)},
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(spec.model, version.name)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    # Longer than the sidecar's drain: the kubelet never kills a draining one.
                    "terminationGracePeriodSeconds": drain_timeout_s(spec, config) + GRACE_MARGIN_S,
                    "initContainers": [model_container(spec.server)],
                    "containers": [sidecar_container(version.name, spec, config)],
                },
            },
        },
    }
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

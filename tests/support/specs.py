"""ModelVersion documents the tests share: `spec.server` documents (a plain server, and a GPU
server with every pod field the operator passes through), and builders for ModelVersion bodies
and the operator's snapshots of them."""

from __future__ import annotations

from typing import Any

from modelroll_operator.snapshots import VersionInfo
from modelroll_operator.spec import API_VERSION, KIND

SERVER = {"image": "ghcr.io/acme/sentiment:1.4", "port": 9000}


GPU_SERVER: dict[str, Any] = {
    "image": "ghcr.io/acme/llm:2.0",
    "port": 9000,
    "env": [
        {"name": "MODEL_DIR", "value": "/models"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ],
    "envFrom": [{"secretRef": {"name": "object-store"}}],
    "resources": {"limits": {"nvidia.com/gpu": 1}},
    "volumeMounts": [{"name": "weights", "mountPath": "/models", "readOnly": True}],
    "startupProbe": {
        "httpGet": {"path": "/readyz", "port": 9000},
        "periodSeconds": 10,
        "failureThreshold": 60,
    },
    "volumes": [{"name": "weights", "emptyDir": {}}],
    "initContainers": [
        {
            "name": "fetch-weights",
            "image": "ghcr.io/acme/fetch:1",
            "args": ["s3://models/llm/2.0", "/models"],
            "volumeMounts": [{"name": "weights", "mountPath": "/models"}],
        }
    ],
    "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "topology.kubernetes.io/zone",
                        "labelSelector": {"matchLabels": {"modelroll.io/model": "sentiment"}},
                    },
                }
            ]
        }
    },
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "llm-reader",
    "runtimeClassName": "nvidia",
    "priorityClassName": "serving-high",
}


def mv_body(
    name: str = "canary-v2",
    *,
    model: str = "sentiment",
    namespace: str = "prod",
    uid: str = "uid-1",
    generation: int = 1,
    labels: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A ModelVersion body; ``spec`` keys are the CRD's (weight, server, endpoint, batching)."""
    if "server" not in spec and "endpoint" not in spec:
        spec["server"] = {"image": "ghcr.io/acme/sentiment:1.4", "port": 8080}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": generation,
            "labels": labels or {},
        },
        "spec": {"model": model, **spec},
        "status": status or {},
    }


def version(name: str = "canary-v2", **kwargs: Any) -> VersionInfo:
    info = VersionInfo.from_body(mv_body(name, **kwargs))
    assert info is not None
    return info

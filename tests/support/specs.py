r"""ModelVersion \`spec.server\` documents the tests share: a plain server, and a GPU server with
every pod field the operator passes through."""

from __future__ import annotations

from typing import Any

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

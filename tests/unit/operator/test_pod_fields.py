"""The pod fields of spec.server (issue 19): where each lands in the managed pod, that none of
them reaches the injected sidecar, what collides with it, and that a spec without them renders
the pod it always did (upgrading the operator rolls no Deployment)."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.settings import OperatorConfig
from modelroll_operator.spec import ANNOTATION_SPEC_HASH, SpecError, parse_server
from modelroll_operator.workload import conflict, deployment_manifest

from .conftest import version

CONFIG = OperatorConfig(sidecar_image="registry.local/modelroll-sidecar:test", drain_timeout_s=20)

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


def pod(server: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment_manifest(version(server=server), CONFIG)["spec"]
    return dict(spec["template"]["spec"])


def test_each_field_lands_in_its_place_in_the_pod() -> None:
    rendered = pod(GPU_SERVER)
    init = {c["name"]: c for c in rendered["initContainers"]}
    assert [c["name"] for c in rendered["initContainers"]] == ["fetch-weights", "model"]
    assert init["fetch-weights"]["args"] == ["s3://models/llm/2.0", "/models"]
    model = init["model"]
    assert model["env"] == GPU_SERVER["env"]
    assert model["envFrom"] == GPU_SERVER["envFrom"]
    assert model["volumeMounts"] == GPU_SERVER["volumeMounts"]
    assert model["startupProbe"] == GPU_SERVER["startupProbe"]
    assert model["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    for key in ("volumes", "nodeSelector", "tolerations", "affinity", "serviceAccountName"):
        assert rendered[key] == GPU_SERVER[key], key
    assert rendered["imagePullSecrets"] == [{"name": "registry"}]
    assert (rendered["runtimeClassName"], rendered["priorityClassName"]) == (
        "nvidia",
        "serving-high",
    )


def test_no_field_reaches_the_injected_sidecar() -> None:
    plain = pod({"image": "ghcr.io/acme/llm:2.0", "port": 9000})
    full = pod(GPU_SERVER)
    assert full["containers"] == plain["containers"]
    (sidecar,) = full["containers"]
    assert "volumeMounts" not in sidecar
    assert "env" not in sidecar


def test_a_spec_without_pod_fields_renders_the_pod_it_always_did() -> None:
    """The hash of this spec's Deployment as the operator before issue 19 rendered it: the
    same hash means upgrading the operator applies nothing and rolls no pod."""
    before = "a64e435fe8cb4431"
    server = {
        "image": "ghcr.io/acme/sentiment:1.4",
        "port": 9000,
        "args": ["--fast"],
        "env": [{"name": "A", "value": "1"}, {"name": "B"}],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    manifest = deployment_manifest(version("canary-v2", server=server), CONFIG)
    assert manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH] == before


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"port": 8000}, "spec.server.port 8000 is the batching sidecar's port"),
        (
            {"initContainers": [{"name": "sidecar", "image": "x"}]},
            "spec.server.initContainers[0].name 'sidecar' is the operator's",
        ),
        (
            {"initContainers": [{"name": "a", "image": "x", "ports": [{"containerPort": 9000}]}]},
            "spec.server.initContainers[0].ports[0].containerPort 9000",
        ),
        (
            {
                "volumeMounts": [{"name": "weights", "mountPath": "/m"}],
                "volumes": [],
                "initContainers": [],
            },
            "spec.server.volumeMounts[0].name 'weights' is not in spec.server.volumes",
        ),
        (
            {"initContainers": [{"name": "a", "image": "x", "volumeMounts": [{"name": "gone"}]}]},
            "spec.server.initContainers[0].volumeMounts[0].name is not in spec.server.volumes",
        ),
    ],
    ids=["sidecar port", "container name", "init container port", "mount", "init mount"],
)
def test_what_would_collide_with_the_injected_parts_is_named(
    change: dict[str, Any], field: str
) -> None:
    server = parse_server({**GPU_SERVER, **change})
    problem = conflict(server, CONFIG.sidecar_port)
    assert problem is not None
    assert field in problem


def test_a_spec_that_collides_with_nothing_passes() -> None:
    assert conflict(parse_server(GPU_SERVER), CONFIG.sidecar_port) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"env": [{"name": "A", "value": "1", "valueFrom": {}}]}, "value or valueFrom, not both"),
        ({"env": [{"value": "1"}]}, "spec.server.env[0] needs a name"),
        ({"volumes": {"name": "weights"}}, "spec.server.volumes must be a list of objects"),
        ({"nodeSelector": {"gpu": 1}}, "spec.server.nodeSelector must map label names"),
        ({"affinity": []}, "spec.server.affinity must be an object"),
    ],
)
def test_a_malformed_field_is_a_spec_error_naming_it(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_server({**GPU_SERVER, **change})

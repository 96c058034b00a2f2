"""The pod fields of spec.server: where each lands in the managed pod, that none of them reaches
the injected sidecar, what collides with it, the sidecar's resources, and the pinned pod of a
spec without them (a change there rolls every managed Deployment when the operator is
upgraded)."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.config import OperatorConfig
from modelroll_operator.manifests import conflict, deployment_manifest
from modelroll_operator.spec import ANNOTATION_SPEC_HASH, SpecError, parse_server
from tests.support.specs import GPU_SERVER, version

CONFIG = OperatorConfig(sidecar_image="registry.local/modelroll-sidecar:test", drain_timeout_s=20)


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


def test_the_pod_of_a_spec_without_pod_fields_is_pinned() -> None:
    """The hash of a plain spec's Deployment. The operator applies a Deployment whose hash
    differs, so a release that changes it rolls every managed pod once on upgrade: change it
    only on purpose, and say so in the release notes. This one has the sidecar's default
    resources, kubectl's default-container annotation, and the preStop exec hook that calls the
    sidecar's --control-port."""
    pinned = "488c541c3b86e316"
    server = {
        "image": "ghcr.io/acme/sentiment:1.4",
        "port": 9000,
        "args": ["--fast"],
        "env": [{"name": "A", "value": "1"}, {"name": "B"}],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    manifest = deployment_manifest(version("canary-v2", server=server), CONFIG)
    assert manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH] == pinned


def test_the_container_and_pod_fields_serving_teams_use_land_in_their_place() -> None:
    restricted = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    probe = {"httpGet": {"path": "/readyz", "port": "model"}, "periodSeconds": 5}
    spread = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"modelroll.io/version": "canary-v2"}},
    }
    server = {
        **GPU_SERVER,
        "securityContext": restricted,
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 3},
        "podLabels": {"kueue.x-k8s.io/queue-name": "gpu-queue"},
        "podAnnotations": {"csi.example.com/cache": "weights"},
        "topologySpreadConstraints": [spread],
        "schedulerName": "volcano",
        "dnsPolicy": "ClusterFirstWithHostNet",
        "hostIPC": True,
        "shareProcessNamespace": True,
    }
    template = deployment_manifest(version(server=server), CONFIG)["spec"]["template"]
    rendered = template["spec"]
    model = {c["name"]: c for c in rendered["initContainers"]}["model"]
    assert model["securityContext"] == restricted
    assert model["readinessProbe"] == probe
    assert model["livenessProbe"]["failureThreshold"] == 3
    assert rendered["topologySpreadConstraints"] == [spread]
    assert (rendered["schedulerName"], rendered["dnsPolicy"]) == (
        "volcano",
        "ClusterFirstWithHostNet",
    )
    assert (rendered["hostIPC"], rendered["shareProcessNamespace"]) == (True, True)
    labels, annotations = template["metadata"]["labels"], template["metadata"]["annotations"]
    assert labels["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert labels["modelroll.io/version"] == "canary-v2"  # the selector is still there
    assert annotations == {
        "csi.example.com/cache": "weights",
        "kubectl.kubernetes.io/default-container": "model",  # kubectl logs lands on the model
    }
    (sidecar,) = rendered["containers"]
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True  # still the operator's
    assert "readinessProbe" in sidecar
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"


def sidecar_resources(server: dict[str, Any], config: OperatorConfig = CONFIG, **spec: Any) -> Any:
    rendered = deployment_manifest(version(server=server, **spec), config)["spec"]["template"]
    (sidecar,) = rendered["spec"]["containers"]
    return sidecar["resources"]


def test_the_sidecar_has_requests_and_limits_so_that_a_resource_quota_admits_its_pod() -> None:
    assert sidecar_resources(GPU_SERVER) == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    mine = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "64Mi"}}
    config = OperatorConfig(sidecar_resources=mine)
    assert sidecar_resources(GPU_SERVER, config) == mine


def test_a_guaranteed_model_gets_a_guaranteed_sidecar() -> None:
    """A pod is in the Guaranteed QoS class (what the static CPU manager pins to cores) only when
    every container's requests equal its limits: the sidecar's requests are raised to its
    limits when the model's are."""
    exact = {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1}}
    assert sidecar_resources({**GPU_SERVER, "resources": exact}) == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    burstable = {"requests": {"cpu": "2", "memory": "16Gi"}, "limits": exact["limits"]}
    raised = sidecar_resources({**GPU_SERVER, "resources": burstable})
    assert raised["requests"] == {"cpu": "100m", "memory": "128Mi"}
    given = {"requests": {"cpu": "2", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "512Mi"}}
    per_version = sidecar_resources(
        {**GPU_SERVER, "resources": exact}, sidecar={"resources": given}
    )
    assert per_version == given


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
        (
            {"podLabels": {"modelroll.io/version": "other"}},
            "spec.server.podLabels key 'modelroll.io/version' is the operator's",
        ),
        (
            {"podLabels": {"app.kubernetes.io/managed-by": "helm"}},
            "spec.server.podLabels key 'app.kubernetes.io/managed-by' is the operator's",
        ),
        (
            {"podAnnotations": {"kubectl.kubernetes.io/default-container": "sidecar"}},
            "spec.server.podAnnotations key 'kubectl.kubernetes.io/default-container'",
        ),
        (
            {"startupProbe": {"httpGet": {"path": "/readyz", "port": 8000}}},
            "spec.server.startupProbe.httpGet.port 8000 is not the model server's port (9000",
        ),
        (
            {"livenessProbe": {"tcpSocket": {"port": "http"}}},
            "spec.server.livenessProbe.tcpSocket.port 'http' is not the model server's port",
        ),
    ],
    ids=[
        "sidecar port",
        "container name",
        "init container port",
        "mount",
        "init mount",
        "selector label",
        "managed-by label",
        "default container",
        "startup port",
        "liveness name",
    ],
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
        ({"nodeSelector": {"gpu": 1}}, "spec.server.nodeSelector must map names to strings"),
        ({"affinity": []}, "spec.server.affinity must be an object"),
    ],
)
def test_a_malformed_field_is_a_spec_error_naming_it(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_server({**GPU_SERVER, **change})

"""The Deployment and Service of a managed version, as `kubectl get -o yaml` would show them."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.config import OperatorConfig
from modelroll_operator.manifests import (
    conflict,
    deployment_manifest,
    service_endpoint,
    service_manifest,
)
from modelroll_operator.spec import ANNOTATION_SPEC_HASH, parse_server
from modelroll_sidecar import cli as sidecar_cli
from modelroll_sidecar import prestop
from modelroll_sidecar.config import parse_args as parse_sidecar_args
from tests.support.specs import version

CONFIG = OperatorConfig(sidecar_image="registry.local/modelroll-sidecar:test", drain_timeout_s=20)


def containers(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container of the pod template by name, the model's native-sidecar one included."""
    pod = manifest["spec"]["template"]["spec"]
    return {c["name"]: c for c in (*pod.get("initContainers", []), *pod["containers"])}


def test_the_pod_runs_the_model_and_the_sidecar_configured_from_the_spec() -> None:
    v = version(
        "canary-v2",
        weight=1,
        server={"image": "ghcr.io/acme/sentiment:1.4", "port": 9000, "args": ["--fast"]},
        batching={"maxBatchSize": 16, "maxWaitMs": 5, "maxBatchTokens": 4096},
    )
    pod = containers(deployment_manifest(v, CONFIG))
    assert set(pod) == {"model", "sidecar"}
    assert pod["model"]["image"] == "ghcr.io/acme/sentiment:1.4"
    assert pod["model"]["args"] == ["--fast"]
    sidecar = pod["sidecar"]
    assert sidecar["image"] == "registry.local/modelroll-sidecar:test"
    assert sidecar["args"] == [
        "--model=sentiment",
        "--version=canary-v2",
        "--upstream=http://127.0.0.1:9000",  # the model is reached over localhost only
        "--port=8000",
        "--control-port=8001",  # GET /prestop, on 127.0.0.1 only
        "--max-batch-size=16",
        "--max-wait-ms=5",
        "--max-queue-size=1024",
        "--max-batch-tokens=4096",
        "--timeout-ms=30000",
        "--max-concurrent-batches=1",
        "--drain-timeout-s=20",
    ]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_the_grace_period_outlasts_the_sidecars_drain() -> None:
    manifest = deployment_manifest(version(), CONFIG)
    grace = manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > CONFIG.drain_timeout_s


def test_the_model_outlives_the_sidecar_and_the_sidecar_outlives_its_endpoints() -> None:
    """On pod deletion the kubelet runs the sidecar's preStop hook (serve while the pod leaves
    its Service), then SIGTERMs the sidecar, and the model only after the sidecar has exited:
    the model is a native sidecar (an init container that keeps running)."""
    pod = deployment_manifest(version(), CONFIG)["spec"]["template"]["spec"]
    (model,) = pod["initContainers"]
    assert model["name"] == "model"
    assert model["restartPolicy"] == "Always"
    assert [c["name"] for c in pod["containers"]] == ["sidecar"]
    hook = pod["containers"][0]["lifecycle"]["preStop"]
    assert hook == {
        "exec": {"command": ["python3", "-m", "modelroll_sidecar.prestop", "--control-port=8001"]}
    }


def test_only_the_pod_itself_can_run_the_prestop_hook() -> None:
    """The hook runs inside the sidecar container and calls the control port, which the sidecar
    binds to 127.0.0.1 (modelroll_sidecar.cli.CONTROL_HOST) and which no container port, probe
    or Service names: a pod that reaches the version's Service or the pod's IP cannot drain it."""
    manifest = deployment_manifest(version(server={"image": "m:1", "port": 9000}), CONFIG)
    sidecar = containers(manifest)["sidecar"]
    (command,) = sidecar["lifecycle"]["preStop"]["exec"].values()
    assert command[:3] == ["python3", "-m", "modelroll_sidecar.prestop"]
    hook_port = int(prestop.build_parser().parse_args(command[3:]).control_port)
    config = parse_sidecar_args(sidecar["args"], environ={})
    assert hook_port == config.control_port == 8001
    assert config.port == 8000
    assert sidecar_cli.CONTROL_HOST == "127.0.0.1"
    exposed = [p["containerPort"] for c in containers(manifest).values() for p in c["ports"]]
    assert hook_port not in exposed
    (port,) = service_manifest(version(), CONFIG)["spec"]["ports"]
    assert port["port"] == 8000
    probes = [sidecar["livenessProbe"], sidecar["readinessProbe"]]
    assert all(probe["httpGet"]["port"] == "http" for probe in probes)
    assert "httpGet" not in sidecar["lifecycle"]["preStop"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"port": 8001}, "spec.server.port 8001 is the batching sidecar's control port"),
        (
            {
                "initContainers": [
                    {"name": "helper", "image": "h:1", "ports": [{"containerPort": 8001}]}
                ]
            },
            "spec.server.initContainers[0].ports[0].containerPort 8001",
        ),
    ],
    ids=["model port", "init container port"],
)
def test_a_model_server_on_the_control_port_is_refused(change: dict[str, Any], field: str) -> None:
    """The model server starts first and would hold the port: the sidecar could never bind it."""
    problem = conflict(parse_server({"image": "m:1", "port": 9000, **change}), CONFIG.sidecar_port)
    assert problem is not None
    assert field in problem


def test_the_sidecar_runs_locked_down_and_the_models_resources_stay_unset_unless_given() -> None:
    pod = containers(deployment_manifest(version(), CONFIG))
    security = pod["sidecar"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "resources" not in pod["model"]
    given = version(server={"image": "m:1", "resources": {"limits": {"nvidia.com/gpu": 1}}})
    model = containers(deployment_manifest(given, CONFIG))["model"]
    assert model["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_the_workload_is_owned_by_its_model_version() -> None:
    v = version("canary-v2", uid="abc-123")
    for manifest in (deployment_manifest(v, CONFIG), service_manifest(v, CONFIG)):
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert owner["kind"] == "ModelVersion"
        assert owner["name"] == "canary-v2"
        assert owner["uid"] == "abc-123"
        assert owner["controller"] is True
        assert manifest["metadata"]["namespace"] == "prod"


def test_the_service_exposes_the_sidecar_port_never_the_models() -> None:
    v = version(server={"image": "m:1", "port": 8080})
    service = service_manifest(v, CONFIG)
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8000
    assert port["targetPort"] == "http"
    sidecar_ports = containers(deployment_manifest(v, CONFIG))["sidecar"]["ports"]
    assert sidecar_ports == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    pod_labels = deployment_manifest(v, CONFIG)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service_endpoint("canary-v2", "prod", 8000) == "http://canary-v2.prod.svc:8000"


def _hash(manifest: dict[str, Any]) -> str:
    value: str = manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    return value


def test_a_weight_change_leaves_the_deployment_as_it_was() -> None:
    before = deployment_manifest(version(weight=1, generation=1), CONFIG)
    after = deployment_manifest(version(weight=9, generation=2), CONFIG)
    assert after == before


def test_batching_and_server_changes_change_the_pod_template() -> None:
    base = deployment_manifest(version(), CONFIG)
    batching = deployment_manifest(version(batching={"maxBatchSize": 8}), CONFIG)
    image = deployment_manifest(version(server={"image": "ghcr.io/acme/sentiment:1.5"}), CONFIG)
    for changed in (batching, image):
        assert changed["spec"]["template"] != base["spec"]["template"]
        assert _hash(changed) != _hash(base)


def test_replicas_come_from_the_spec() -> None:
    assert deployment_manifest(version(replicas=3), CONFIG)["spec"]["replicas"] == 3


def test_spec_sidecar_settings_become_sidecar_flags_and_set_the_grace_period() -> None:
    plain = deployment_manifest(version(), CONFIG)
    tuned = deployment_manifest(
        version(
            sidecar={
                "upstreamTimeoutMs": 120000,
                "maxBodyBytes": 8 << 20,
                "readTimeoutMs": 5000,
                "drainTimeoutS": 90,
            }
        ),
        CONFIG,
    )
    args = containers(tuned)["sidecar"]["args"]
    assert "--upstream-timeout-ms=120000" in args
    assert f"--max-body-bytes={8 << 20}" in args
    assert "--read-timeout-ms=5000" in args
    assert args[-1] == "--drain-timeout-s=90"
    assert tuned["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 105
    # Left out, nothing is added: Deployments made before spec.sidecar existed do not roll.
    plain_args = containers(plain)["sidecar"]["args"]
    assert not any(
        a.startswith(("--upstream-timeout", "--max-body", "--read-timeout")) for a in plain_args
    )
    assert plain["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 35


def _policy_flags(manifest: dict[str, Any]) -> list[str]:
    args: list[str] = containers(manifest)["sidecar"]["args"]
    return [a for a in args if a.startswith(("--batch-by", "--wait-policy", "--length-from"))]


def test_batching_policies_reach_the_sidecar_and_defaults_add_no_flag() -> None:
    plain = deployment_manifest(version(), CONFIG)
    assert _policy_flags(plain) == []
    # What the API server stores for a spec that leaves them out: the CRD's defaults, spelt out.
    # The pod template, and so the Deployment, must be the one the sidecar's defaults give.
    defaulted = deployment_manifest(
        version(batching={"batchBy": "Length", "waitPolicy": "Auto", "lengthFrom": "Auto"}),
        CONFIG,
    )
    assert defaulted == plain
    fifo = deployment_manifest(version(batching={"batchBy": "Arrival"}), CONFIG)
    assert _policy_flags(fifo) == ["--batch-by=arrival"]
    assert _hash(fifo) != _hash(plain)  # a change rolls the Deployment
    words = deployment_manifest(version(batching={"lengthFrom": "Words"}), CONFIG)
    assert _policy_flags(words) == ["--length-from=words"]
    both = version(
        batching={"batchBy": "Arrival", "waitPolicy": "Adaptive", "lengthFrom": "Tokenizer"}
    )
    args = containers(deployment_manifest(both, CONFIG))["sidecar"]["args"]
    assert _policy_flags(deployment_manifest(both, CONFIG)) == [
        "--batch-by=arrival",
        "--wait-policy=adaptive",
        "--length-from=tokenizer",
    ]
    assert args[-1] == "--drain-timeout-s=20"
    # The sidecar takes every flag the operator gives it.
    config = parse_sidecar_args(args, environ={})
    assert (config.batch_by, config.wait_policy, config.length_from) == (
        "arrival",
        "adaptive",
        "tokenizer",
    )
    assert (config.model, config.version) == ("sentiment", "canary-v2")
    assert parse_sidecar_args(containers(plain)["sidecar"]["args"], environ={}).batch_by == (
        "length"
    )


def test_the_engines_api_key_is_mounted_into_the_sidecar_only() -> None:
    secret = {"name": "vllm-key", "key": "token"}
    v = version(sidecar={"engineApiKeySecret": secret})
    pod = deployment_manifest(v, CONFIG)["spec"]["template"]["spec"]
    (volume,) = [vol for vol in pod["volumes"] if vol["name"] == "modelroll-engine-api-key"]
    assert volume["secret"] == {
        "secretName": "vllm-key",
        "items": [{"key": "token", "path": "key"}],
    }
    by_name = containers(deployment_manifest(v, CONFIG))
    (mount,) = by_name["sidecar"]["volumeMounts"]
    assert mount["readOnly"] is True
    assert f"--engine-api-key-file={mount['mountPath']}/key" in by_name["sidecar"]["args"]
    assert "volumeMounts" not in by_name["model"]
    plain = containers(deployment_manifest(version(), CONFIG))["sidecar"]
    assert "volumeMounts" not in plain
    assert not [a for a in plain["args"] if a.startswith("--engine-api-key-file")]


def test_an_open_inference_version_tells_the_sidecar_its_protocol_and_the_servers_model_name() -> (
    None
):
    """The sidecar calls the model server by the name it serves the model under; left out, by
    spec.model (no flag, so a version without it renders as before)."""
    named = version(
        protocol="OpenInference", server={"image": "m:1", "servedModelName": "iris-sklearn"}
    )
    args = containers(deployment_manifest(named, CONFIG))["sidecar"]["args"]
    assert "--protocol=openinference" in args
    assert "--served-model-name=iris-sklearn" in args
    config = parse_sidecar_args(args, environ={})  # the sidecar takes them
    assert (config.protocol, config.served_model_name) == ("openinference", "iris-sklearn")
    plain = version(protocol="OpenInference", server={"image": "m:1"})
    plain_args = containers(deployment_manifest(plain, CONFIG))["sidecar"]["args"]
    assert "--protocol=openinference" in plain_args
    assert not [a for a in plain_args if a.startswith("--served-model-name")]
    assert _hash(deployment_manifest(named, CONFIG)) != _hash(deployment_manifest(plain, CONFIG))
    # The sidecar's own readiness, through the sidecar's /readyz, as for every protocol.
    sidecar = containers(deployment_manifest(named, CONFIG))["sidecar"]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}

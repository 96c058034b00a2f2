"""Managed mode (spec.server): the version's Deployment and Service, and when it is Ready.

The test control plane runs the Deployment and ReplicaSet controllers but no kubelet, so pods
are created and never run. Where a test needs a Ready version it reports the pods Ready through
their status subresource (``mark_pods_ready``), and the real controllers carry that into the
Deployment's readyReplicas, which is what the operator watches.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    Routes,
    StartOperator,
    condition,
    containers,
    eventually,
    get,
    mark_pods_ready,
    maybe,
    model_version,
    patch_mv,
    warning_reasons,
)
from tests.support.specs import SERVER

pytestmark = pytest.mark.integration

POD_SELECTOR = "modelroll.io/version=canary-v2"


def mv_with(
    cluster: Cluster, namespace: str, name: str, kind: str, expected: tuple[str, str]
) -> dict[str, Any] | None:
    """The version's body once its ``kind`` condition has (status, reason) ``expected``."""
    body = get(cluster, namespace, "mv", name)
    return body if condition(body, kind) == expected else None


def deployment_after(cluster: Cluster, namespace: str, generation: int) -> dict[str, Any] | None:
    """canary-v2's Deployment once its generation has moved past ``generation``."""
    body = get(cluster, namespace, "deploy", "canary-v2")
    return body if body["metadata"]["generation"] > generation else None


@pytest.mark.usefixtures("garbage_collector")
def test_a_managed_version_runs_as_a_deployment_and_service_and_is_routed_once_ready(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    cluster.apply(
        model_version("stable-v1", "sentiment", weight=3, endpoint="http://stable:8000"), namespace
    )
    cluster.apply(
        model_version(
            "canary-v2",
            "sentiment",
            weight=1,
            server=SERVER,
            batching={"maxBatchSize": 16, "maxWaitMs": 5, "batchBy": "Arrival"},
        ),
        namespace,
    )
    deployment = eventually(lambda: maybe(cluster, namespace, "deploy", "canary-v2"), "Deployment")
    service = eventually(lambda: maybe(cluster, namespace, "service", "canary-v2"), "Service")
    mv = get(cluster, namespace, "mv", "canary-v2")
    for child in (deployment, service):
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "ModelVersion",
            "canary-v2",
            mv["metadata"]["uid"],
        )
        assert owner["controller"] is True

    pod = containers(deployment)
    assert pod["model"]["image"] == "ghcr.io/acme/sentiment:1.4"
    sidecar = pod["sidecar"]
    assert sidecar["image"] == "registry.local/modelroll-sidecar:test"
    for flag in (
        "--model=sentiment",
        "--version=canary-v2",
        "--upstream=http://127.0.0.1:9000",
        "--max-batch-size=16",
        "--max-wait-ms=5",
        "--max-queue-size=1024",
        "--batch-by=arrival",
    ):
        assert flag in sidecar["args"]
    # waitPolicy is at its default (the API server stored Auto): no flag for it.
    assert not any(a.startswith("--wait-policy") for a in sidecar["args"])
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (8000, "http")  # the sidecar, not the model

    # Created, not Ready: the route keeps only the external version.
    eventually(
        lambda: (
            condition(get(cluster, namespace, "mv", "canary-v2"), "Routed") == ("False", "NotReady")
        ),
        "canary-v2 reported not routed",
    )
    assert condition(get(cluster, namespace, "mv", "canary-v2"), "Ready") == (
        "False",
        "ReplicasNotReady",
    )
    assert routes.weights("sentiment") == {"stable-v1": 3}

    eventually(lambda: mark_pods_ready(cluster, namespace, POD_SELECTOR), "a canary-v2 pod")
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 1, "stable-v1": 3}, "routed")
    endpoint = f"http://canary-v2.{namespace}.svc:8000"
    assert routes.endpoints("sentiment")["canary-v2"] == endpoint
    canary = eventually(
        lambda: mv_with(cluster, namespace, "canary-v2", "Routed", ("True", "Routed")),
        "canary-v2 reported routed",
    )
    assert condition(canary, "Ready") == ("True", "ReplicasReady")
    status = canary["status"]
    assert (status["routedWeight"], status["endpoint"]) == (1, endpoint)
    assert (status["replicas"], status["readyReplicas"]) == (1, 1)

    # Deleting the version unroutes it first, then its workload is garbage-collected.
    cluster.kubectl("delete", "mv", "canary-v2", namespace=namespace)
    assert routes.weights("sentiment") == {"stable-v1": 3}
    cluster.wait_gone("deploy", "canary-v2", namespace=namespace, timeout=60)
    cluster.wait_gone("service", "canary-v2", namespace=namespace, timeout=60)


def test_a_weight_change_leaves_the_deployment_alone_and_a_batching_change_rolls_it(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    cluster.apply(model_version("canary-v2", "sentiment", weight=1, server=SERVER), namespace)
    eventually(lambda: mark_pods_ready(cluster, namespace, POD_SELECTOR), "a canary-v2 pod")
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 1}, "routed")
    deployment = get(cluster, namespace, "deploy", "canary-v2")
    before = deployment["metadata"]
    # The stored spec spells out batchBy: Length and waitPolicy: Auto; neither becomes a flag.
    batching = get(cluster, namespace, "mv", "canary-v2")["spec"]["batching"]
    assert (batching["batchBy"], batching["waitPolicy"]) == ("Length", "Auto")
    args = containers(deployment)["sidecar"]["args"]
    assert not any(a.startswith(("--batch-by", "--wait-policy")) for a in args), args

    patch_mv(cluster, namespace, "canary-v2", {"spec": {"weight": 7}})
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 7}, "the new weight routed")
    generation = get(cluster, namespace, "mv", "canary-v2")["metadata"]["generation"]
    eventually(
        lambda: (
            get(cluster, namespace, "mv", "canary-v2")["status"]["observedGeneration"] == generation
        ),
        "the weight change reconciled",
    )
    after = get(cluster, namespace, "deploy", "canary-v2")["metadata"]
    assert (after["generation"], after["resourceVersion"]) == (
        before["generation"],
        before["resourceVersion"],
    )

    patch_mv(
        cluster,
        namespace,
        "canary-v2",
        {"spec": {"batching": {"maxBatchSize": 8, "waitPolicy": "Adaptive"}}},
    )
    rolled = eventually(
        lambda: deployment_after(cluster, namespace, before["generation"]), "a Deployment update"
    )
    assert "--max-batch-size=8" in containers(rolled)["sidecar"]["args"]
    assert "--wait-policy=adaptive" in containers(rolled)["sidecar"]["args"]
    eventually(
        lambda: len(get(cluster, namespace, "rs", "-l", POD_SELECTOR)["items"]) == 2,
        "a second ReplicaSet (a rollout)",
    )

    patch_mv(cluster, namespace, "canary-v2", {"spec": {"server": {"image": "acme/s:2"}}})
    eventually(
        lambda: (
            containers(get(cluster, namespace, "deploy", "canary-v2"))["model"]["image"]
            == "acme/s:2"
        ),
        "the new model image rolled out",
    )

    cluster.kubectl("scale", "mv", "canary-v2", "--replicas=3", namespace=namespace)
    eventually(
        lambda: get(cluster, namespace, "deploy", "canary-v2")["spec"]["replicas"] == 3,
        "kubectl scale mv reaching the Deployment",
    )


def test_external_mode_creates_no_workload_and_switching_to_it_removes_one(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    cluster.apply(
        model_version("stable-v1", "sentiment", weight=1, endpoint="http://stable:8000"), namespace
    )
    cluster.apply(model_version("canary-v2", "sentiment", weight=1, server=SERVER), namespace)
    eventually(lambda: maybe(cluster, namespace, "deploy", "canary-v2"), "canary-v2's Deployment")
    eventually(lambda: routes.weights("sentiment") == {"stable-v1": 1}, "stable-v1 routed")
    owned = get(cluster, namespace, "deploy,service")["items"]
    assert sorted(o["metadata"]["name"] for o in owned) == ["canary-v2", "canary-v2"]

    patch_mv(
        cluster,
        namespace,
        "canary-v2",
        {"spec": {"server": None, "endpoint": "http://canary.elsewhere:8000"}},
    )
    eventually(
        lambda: routes.endpoints("sentiment").get("canary-v2") == "http://canary.elsewhere:8000",
        "canary-v2 routed to its endpoint",
    )
    cluster.wait_gone("deploy", "canary-v2", namespace=namespace, timeout=60)
    cluster.wait_gone("service", "canary-v2", namespace=namespace, timeout=60)
    assert get(cluster, namespace, "deploy,service")["items"] == []


def test_a_workload_the_api_server_rejects_is_reported_in_the_ready_condition(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    bad = {**SERVER, "resources": {"requests": {"cpu": "plenty"}}}
    cluster.apply(model_version("canary-v2", "sentiment", weight=1, server=bad), namespace)

    rejected = eventually(
        lambda: mv_with(cluster, namespace, "canary-v2", "Ready", ("False", "InvalidSpec")),
        "the rejection in the Ready condition",
    )
    message = next(c["message"] for c in rejected["status"]["conditions"] if c["type"] == "Ready")
    assert "The API server rejected Deployment canary-v2" in message
    assert "quantities must match the regular expression" in message
    assert warning_reasons(cluster, namespace, "canary-v2") == ["InvalidSpec"]
    assert operator.errors() == []

    patch_mv(cluster, namespace, "canary-v2", {"spec": {"server": {"resources": None}}})
    eventually(lambda: maybe(cluster, namespace, "deploy", "canary-v2"), "the fixed Deployment")
    eventually(
        lambda: (
            condition(get(cluster, namespace, "mv", "canary-v2"), "Ready")
            == ("False", "ReplicasNotReady")
        ),
        "the rejection cleared",
    )


def test_a_deployment_deleted_by_hand_comes_back(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    cluster.apply(model_version("canary-v2", "sentiment", weight=1, server=SERVER), namespace)
    first = eventually(lambda: maybe(cluster, namespace, "deploy", "canary-v2"), "Deployment")
    cluster.kubectl("delete", "deploy", "canary-v2", "--wait=false", namespace=namespace)
    eventually(
        lambda: (
            (d := maybe(cluster, namespace, "deploy", "canary-v2"))
            and d["metadata"]["uid"] != first["metadata"]["uid"]
        ),
        "a new Deployment",
    )


def test_spec_sidecar_reaches_the_sidecar_and_external_versions_say_it_is_ignored(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    tuned = {"upstreamTimeoutMs": 120000, "maxBodyBytes": 8388608, "drainTimeoutS": 60}
    cluster.apply(
        model_version("canary-v2", "sentiment", weight=1, server=SERVER, sidecar=tuned), namespace
    )
    deployment = eventually(lambda: maybe(cluster, namespace, "deploy", "canary-v2"), "Deployment")
    args = containers(deployment)["sidecar"]["args"]
    assert "--upstream-timeout-ms=120000" in args
    assert "--max-body-bytes=8388608" in args
    assert "--drain-timeout-s=60" in args
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 75

    cluster.apply(
        model_version(
            "stable-v1",
            "sentiment",
            weight=9,
            endpoint="http://stable:8000",
            batching={"maxBatchSize": 8},
            sidecar={"readTimeoutMs": 1000},
        ),
        namespace,
    )
    ready = eventually(
        lambda: (
            (body := get(cluster, namespace, "mv", "stable-v1"))
            and condition(body, "Ready") == ("True", "ExternalEndpoint")
            and next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
        ),
        "stable-v1 Ready",
    )
    assert "spec.batching.maxBatchSize, spec.sidecar.readTimeoutMs are ignored" in ready["message"]
    assert warning_reasons(cluster, namespace, "stable-v1") == ["SettingsIgnored"]

    bad = model_version("bad", "sentiment", server=SERVER, sidecar={"maxBodyBytes": 0})
    refused = cluster.kubectl(
        "apply", "-f", "-", namespace=namespace, input=json.dumps(bad), check=False
    )
    assert refused.returncode != 0
    assert "spec.sidecar.maxBodyBytes" in refused.stderr

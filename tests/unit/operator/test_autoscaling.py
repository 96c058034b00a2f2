"""spec.scaling: the ScaledObject the operator writes for KEDA, and what a version says when
nothing can scale it."""

from __future__ import annotations

from typing import cast

import pytest

from modelroll_operator.api import Api, KubeApiError
from modelroll_operator.autoscaling import Autoscalers, scaled_object, scaled_object_path
from modelroll_operator.config import OperatorConfig
from modelroll_operator.spec import SpecError, parse_spec
from tests.support.fake_api import FakeApi
from tests.support.specs import version

PROMETHEUS = "http://prometheus.monitoring.svc:9090"
KEDA = OperatorConfig(autoscaler="keda", prometheus_url=PROMETHEUS)
SCALING = {"minReplicas": 2, "maxReplicas": 10, "inFlight": 8}


def test_the_scaled_object_scales_the_modelversion_on_its_sidecars_in_flight_requests() -> None:
    v = version("canary", scaling=SCALING)
    manifest = scaled_object(v, PROMETHEUS, floor=0)
    spec = manifest["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "modelroll.io/v1alpha1",
        "kind": "ModelVersion",
        "name": "canary",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 10)
    (trigger,) = spec["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    assert trigger["metadata"]["serverAddress"] == PROMETHEUS
    assert trigger["metadata"]["threshold"] == "8"
    assert trigger["metadata"]["query"] == (
        'sum(modelroll_requests_in_flight{namespace="prod",model="sentiment",'
        'version="canary"}) or vector(0)'
    )
    hpa = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    (owner,) = manifest["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("ModelVersion", "canary")


def test_a_share_that_moves_raises_the_autoscalers_minimum_to_the_floor() -> None:
    spec = scaled_object(version("canary", scaling=SCALING), PROMETHEUS, floor=6)["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (6, 10)


@pytest.mark.parametrize(
    ("target", "protocol", "series", "metric_type"),
    [
        ({"queueWaitP95Ms": 50}, "Batch", "modelroll_queue_wait_seconds_bucket", "Value"),
        (
            {"timeToFirstTokenP95Ms": 400},
            "OpenAI",
            "modelroll_llm_time_to_first_token_seconds_bucket",
            "Value",
        ),
        ({"tokensPerSecond": 200}, "OpenAI", "modelroll_llm_output_tokens_total", "AverageValue"),
        ({"inFlight": 4}, "OpenAI", "modelroll_llm_requests_in_flight", "AverageValue"),
    ],
)
def test_each_target_reads_its_own_series(
    target: dict[str, int], protocol: str, series: str, metric_type: str
) -> None:
    v = version("chat", protocol=protocol, scaling={"maxReplicas": 4, **target})
    (trigger,) = scaled_object(v, PROMETHEUS, floor=0)["spec"]["triggers"]
    assert series in trigger["metadata"]["query"]
    assert trigger["metricType"] == metric_type
    assert trigger["metadata"]["threshold"] == str(next(iter(target.values())))


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"minReplicas": 5, "maxReplicas": 2, "inFlight": 1}, "minReplicas must not exceed"),
        ({"maxReplicas": 2}, "exactly one target"),
        ({"maxReplicas": 2, "inFlight": 1, "queueWaitP95Ms": 5}, "exactly one target"),
        ({"maxReplicas": 2, "inFlight": 0}, "spec.scaling.inFlight"),
    ],
)
def test_a_scaling_the_crd_refuses_is_refused_by_name_when_read(
    scaling: dict[str, int], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({"model": "m", "server": {"image": "i", "port": 9000}, "scaling": scaling})


def test_scaling_an_external_version_is_refused() -> None:
    with pytest.raises(SpecError, match=r"spec\.scaling is for managed versions"):
        parse_spec({"model": "m", "endpoint": "http://x:8000", "scaling": SCALING})


async def test_without_an_autoscaler_the_version_says_so_and_nothing_is_written() -> None:
    api = FakeApi()
    autoscalers = Autoscalers(cast(Api, api), OperatorConfig())
    said = await autoscalers.reconcile(version("canary", scaling=SCALING), floor=0)
    assert said is not None
    assert (said.ready, said.reason) == (False, "AutoscalerMissing")
    assert "--autoscaler keda" in said.message
    assert api.writes == []


async def test_the_scaled_object_is_applied_once_and_removed_with_spec_scaling() -> None:
    api = FakeApi()
    autoscalers = Autoscalers(cast(Api, api), KEDA)
    path = scaled_object_path("prod", "canary")
    said = await autoscalers.reconcile(version("canary", scaling=SCALING), floor=0)
    assert said is not None
    assert said.ready
    assert said.message == "ScaledObject canary scales it between 2 and 10 replicas on inFlight 8"
    await autoscalers.reconcile(version("canary", scaling=SCALING), floor=0)
    assert api.writes == [("apply", path)]  # unchanged: not sent again
    status = {"conditions": [{"type": "Autoscaling", "status": "True"}]}
    assert await autoscalers.reconcile(version("canary", status=status), floor=0) is None
    assert api.writes[-1] == ("delete", path)


async def test_a_cluster_without_keda_is_reported_by_name() -> None:
    api = FakeApi()
    path = scaled_object_path("prod", "canary")
    api.refuse[path] = KubeApiError(404, "NotFound", "the server could not find the resource")
    said = await Autoscalers(cast(Api, api), KEDA).reconcile(
        version("canary", scaling=SCALING), floor=0
    )
    assert said is not None
    assert (said.ready, said.reason) == (False, "ScaledObjectRefused")
    assert "KEDA's CRDs are not installed" in said.message

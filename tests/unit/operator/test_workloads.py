"""A version's workload plan: decided from its spec alone, before any API call."""

from __future__ import annotations

import dataclasses

from modelroll_operator.config import OperatorConfig
from modelroll_operator.snapshots import WorkloadInfo
from modelroll_operator.workloads import External, Managed, Refused, Unparsed, plan, serving
from tests.support.specs import version

CONFIG = OperatorConfig()


def test_each_kind_of_spec_has_its_plan() -> None:
    broken = dataclasses.replace(version("v1"), spec=None, spec_error="spec.weight: too big")
    assert plan(broken, CONFIG) == Unparsed("spec.weight: too big")

    tuned = version("ext", endpoint="http://ext:8000", batching={"maxBatchSize": 8})
    match plan(tuned, CONFIG):
        case External(readiness, ignored):
            assert (readiness.ready, readiness.reason) == (True, "ExternalEndpoint")
            assert ignored == (
                "spec.batching.maxBatchSize is ignored: an external version runs no modelroll "
                "sidecar"
            )
            assert readiness.message.endswith(ignored)
        case other:
            raise AssertionError(other)

    clash = version("v1", server={"image": "i", "port": CONFIG.sidecar_port})
    match plan(clash, CONFIG):
        case Refused(message, endpoint, _):
            assert f"spec.server.port {CONFIG.sidecar_port}" in message
            assert endpoint == f"http://v1.prod.svc:{CONFIG.sidecar_port}"
        case other:
            raise AssertionError(other)

    match plan(version("v1"), CONFIG):
        case Managed(_, deployment, service, _, selector):
            assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
            assert selector == "modelroll.io/model=sentiment,modelroll.io/version=v1"
        case other:
            raise AssertionError(other)


def test_a_managed_version_serves_once_a_replica_is_ready() -> None:
    wanted = plan(version("v1", replicas=2), CONFIG)
    assert isinstance(wanted, Managed)
    assert serving("v1", wanted, None)[0].reason == "ReplicasNotReady"
    live = WorkloadInfo.from_body(
        "Deployment",
        {
            "metadata": {"name": "v1", "labels": {"modelroll.io/version": "v1"}},
            "status": {"replicas": 2, "readyReplicas": 1},
        },
    )
    readiness, warning = serving("v1", wanted, live)
    assert (readiness.ready, readiness.reason, warning) == (True, "ReplicasReady", None)
    assert readiness.message == "1 of 2 replicas of Deployment v1 are ready"
    refused = dataclasses.replace(live, ready_replicas=0, failure="quota") if live else None
    readiness, warning = serving("v1", wanted, refused)
    assert (readiness.ready, readiness.reason) == (False, "PodsRefused")
    assert warning == readiness.message

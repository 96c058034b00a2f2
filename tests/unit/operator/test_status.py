"""Status conditions as `kubectl get mv` and `kubectl describe mv` show them."""

from __future__ import annotations

from typing import Any

from modelroll_operator.routing import Candidate, compute_route
from modelroll_operator.status import Readiness, desired_status, status_patch

READY = Readiness(True, "ReplicasReady", "1 of 1 replicas ready", endpoint="http://a:8000")
NOT_READY = Readiness(False, "ReplicasNotReady", "0 of 1 replicas ready", endpoint="http://a:8000")


def status(
    readiness: Readiness, weight: int, current: dict[str, Any] | None = None, now: str = "T1"
) -> dict[str, Any]:
    route = compute_route(
        "sentiment",
        [
            Candidate("a", weight, readiness.endpoint, readiness.ready),
            Candidate("b", 3, "http://b:8000", ready=True),
        ],
    )
    return desired_status(
        name="a",
        model="sentiment",
        generation=4,
        readiness=readiness,
        route=route,
        current=current or {},
        now=now,
    )


def conditions(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in doc["conditions"]}


def test_a_routed_version_says_so_with_its_weight() -> None:
    doc = status(READY, weight=1)
    assert doc["routedWeight"] == 1
    assert doc["observedGeneration"] == 4
    assert doc["endpoint"] == "http://a:8000"
    ready, routed = conditions(doc)["Ready"], conditions(doc)["Routed"]
    assert (ready["status"], ready["reason"]) == ("True", "ReplicasReady")
    assert (routed["status"], routed["reason"]) == ("True", "Routed")
    assert routed["message"] == "In the routes of model sentiment with weight 1"
    for cond in (ready, routed):
        assert cond["observedGeneration"] == 4
        assert cond["lastTransitionTime"] == "T1"


def test_a_version_that_is_not_ready_is_not_routed() -> None:
    doc = status(NOT_READY, weight=1)
    routed = conditions(doc)["Routed"]
    assert (routed["status"], routed["reason"]) == ("False", "NotReady")
    assert "routedWeight" not in doc


def test_a_ready_version_with_weight_zero_is_dark() -> None:
    routed = conditions(status(READY, weight=0))["Routed"]
    assert (routed["status"], routed["reason"]) == ("False", "WeightZero")
    assert "X-Modelroll-Version" in routed["message"]


def test_transition_times_move_only_when_a_condition_flips() -> None:
    first = status(READY, weight=1, now="T1")
    reweighted = status(READY, weight=2, current=first, now="T2")
    assert conditions(reweighted)["Routed"]["lastTransitionTime"] == "T1"
    assert conditions(reweighted)["Routed"]["message"].endswith("with weight 2")
    flipped = status(NOT_READY, weight=2, current=reweighted, now="T3")
    assert conditions(flipped)["Ready"]["lastTransitionTime"] == "T3"
    assert conditions(flipped)["Routed"]["lastTransitionTime"] == "T3"


def test_replaying_the_same_state_patches_nothing() -> None:
    first = status(READY, weight=1, now="T1")
    assert status_patch(first, status(READY, weight=1, current=first, now="T9")) is None


def test_a_patch_nulls_fields_that_no_longer_apply() -> None:
    managed = {"routedWeight": 0, "replicas": 1, "readyReplicas": 0, "selector": "x=y"}
    external = {"routedWeight": 0}
    assert status_patch(managed, external) == {
        "replicas": None,
        "readyReplicas": None,
        "selector": None,
    }


def test_a_canary_has_its_analysis_conditions_and_keeps_its_analysis() -> None:
    analysis = {"phase": "RolledBack", "reason": "CanaryWorse", "message": "errors: canary 6/30"}
    current = {"analysis": analysis}
    doc = status(READY, weight=0, current=current)
    found = conditions(doc)
    assert found["RolledBack"]["status"] == "True"
    assert found["RolledBack"]["message"] == "errors: canary 6/30"
    assert found["Promoted"]["status"] == "False"
    assert found["AnalysisHealthy"]["status"] == "False"
    assert found["AnalysisHealthy"]["reason"] == "CanaryWorse"
    assert found["Progressing"]["status"] == "False"
    # The reconciler's patch never touches status.analysis (the analysis task's own field).
    patch = status_patch(current, doc)
    assert patch is not None
    assert "analysis" not in patch


def test_an_analysis_waiting_for_data_is_neither_healthy_nor_unhealthy() -> None:
    waiting = {"phase": "Progressing", "reason": "InsufficientData"}
    doc = status(READY, weight=1, current={"analysis": waiting})
    found = conditions(doc)
    assert found["Progressing"]["status"] == "True"
    assert found["AnalysisHealthy"]["status"] == "Unknown"


def test_a_version_without_analysis_has_only_ready_and_routed() -> None:
    assert set(conditions(status(READY, weight=1))) == {"Ready", "Routed"}


def test_a_promotion_whose_weights_are_not_written_yet_is_not_promoted_yet() -> None:
    saving = {"phase": "Promoted", "reason": "Promoted", "message": "m", "applied": False}
    found = conditions(status(READY, weight=1, current={"analysis": saving}))
    assert found["Promoted"]["status"] == "False"
    assert found["Progressing"]["status"] == "True"
    done = {**saving, "applied": True}
    assert (
        conditions(status(READY, weight=1, current={"analysis": done}))["Promoted"]["status"]
        == "True"
    )

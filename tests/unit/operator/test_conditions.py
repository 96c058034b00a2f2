"""Every condition the operator can write is one the CRD takes.

The CRD validates status.conditions as apimachinery's metav1.Condition, and the API server
refuses a whole status patch for one bad condition: a new reason that breaks the pattern would
leave every version's status stale. The types and reasons come from where status.py declares
them (mypy holds workloads.py to ``ReadyReason``); the conditions from ``desired_status`` itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from functools import cache
from itertools import cycle, product
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from modelroll_operator import status
from modelroll_operator.analysis.phases import Phase, Reason
from modelroll_operator.capacity import CapacityReason, Floor, Verdict
from modelroll_operator.condition import MESSAGE_MAX
from modelroll_operator.routing import Candidate, compute_route
from modelroll_operator.status import (
    ANALYSIS_REASONS,
    CONDITION_TYPES,
    Autoscaling,
    AutoscalingReason,
    Readiness,
    ReadyReason,
    RoutedReason,
    desired_status,
    now_rfc3339,
)

CRD = Path(__file__).resolve().parents[3] / "crds" / "modelversion.yaml"

# The validation markers of `type Condition struct` in k8s.io/apimachinery
# pkg/apis/meta/v1/types.go (v0.37.1).
METAV1_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
METAV1_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

BOOLS = (True, False)
ALL_REASONS = tuple(
    dict.fromkeys((*get_args(ReadyReason), *get_args(RoutedReason), *ANALYSIS_REASONS))
)


@cache
def conditions_schema() -> dict[str, Any]:
    doc = yaml.safe_load(CRD.read_text())
    (version,) = doc["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return dict(schema["properties"]["conditions"])


def field_problems(key: str, value: Any, field: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in one field, by the keywords the CRD uses there."""
    where = f"{key}={value!r}"
    if field["type"] == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{where} is not an integer"]
        return [f"{where} is below {field['minimum']}"] if value < field.get("minimum", 0) else []
    if not isinstance(value, str):
        return [f"{where} is not a string"]
    found = []
    if "enum" in field and value not in field["enum"]:
        found.append(f"{where} is not one of {field['enum']}")
    # The API server matches with Go's regexp, where `$` is the end of the text only.
    pattern = field.get("pattern")
    if pattern is not None and not re.search(pattern.removesuffix("$") + r"\Z", value):
        found.append(f"{where} does not match {pattern}")
    if not field.get("minLength", 0) <= len(value) <= field.get("maxLength", len(value)):
        found.append(f"{key} has {len(value)} characters")
    if field.get("format") == "date-time":
        try:
            if datetime.fromisoformat(value).tzinfo is None:
                found.append(f"{where} has no time zone")
        except ValueError:
            found.append(f"{where} is not a date-time")
    return found


def problems(conditions: list[dict[str, Any]]) -> list[str]:
    """What the API server would refuse in a status.conditions list."""
    schema = conditions_schema()
    item = schema["items"]
    found = []
    for condition in conditions:
        found += [f"{k} is missing" for k in item["required"] if k not in condition]
        for key, value in condition.items():
            if key not in item["properties"]:
                found.append(f"{key} is not in the schema")
            else:
                found += field_problems(key, value, item["properties"][key])
    (key,) = schema["x-kubernetes-list-map-keys"]
    keys = [c.get(key) for c in conditions]
    if len(set(keys)) != len(keys):
        found.append(f"two conditions with the same {key}: {keys}")
    return found


def statuses() -> Iterator[dict[str, Any]]:
    """The status of a version in each state the operator tells apart: each Ready reason, Ready
    or not, at weight 0 or not, with its route written or not, and as a canary in each phase
    and reason of its analysis, its weights written or not."""
    now = now_rfc3339()

    def of(
        readiness: Readiness, weight: int, problem: str | None, current: dict[str, Any]
    ) -> dict[str, Any]:
        route = compute_route(
            "sentiment",
            [
                Candidate(
                    "a",
                    weight,
                    "http://a:8000",
                    readiness.ready,
                    standby=readiness.reason == "ScaledToZero",
                ),
                Candidate("b", 3, "http://b:8000", ready=True),
            ],
        )
        return desired_status(
            name="a",
            model="sentiment",
            generation=4,
            readiness=readiness,
            route=route,
            current=current,
            now=now,
            route_problem=problem,
        )

    written = (None, "the ConfigMap is too large")  # the route, or why it could not be
    for reason, ready, weight, problem in product(get_args(ReadyReason), BOOLS, (0, 2), written):
        yield of(Readiness(ready, reason, f"{reason}."), weight, problem, {})
    serving = Readiness(True, "ReplicasReady", "1 of 1 replicas of a are ready")
    for phase, reason, applied in product(Phase, (*Reason, ""), BOOLS):
        analysis = {"phase": phase, "reason": reason, "message": "m", "applied": applied}
        yield of(serving, 2, None, {"analysis": analysis})
    for capacity, autoscaling in zip(
        get_args(CapacityReason), cycle(get_args(AutoscalingReason)), strict=False
    ):
        held = capacity in ("ReplicasForShare", "KeptWarm")
        verdict = Verdict(Floor(3, 0.5, 1e9), held, capacity, f"{capacity}.")
        scaled = Autoscaling(autoscaling == "ScaledObjectApplied", autoscaling, f"{autoscaling}.")
        yield desired_status(
            name="a",
            model="sentiment",
            generation=4,
            readiness=serving,
            route=None,
            current={},
            now=now,
            capacity=verdict,
            autoscaling=scaled,
        )


def test_the_crd_validates_conditions_as_metav1_condition_does() -> None:
    schema = conditions_schema()
    assert schema["x-kubernetes-list-type"] == "map"
    assert schema["x-kubernetes-list-map-keys"] == ["type"]
    item = schema["items"]
    assert set(item["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}
    fields = item["properties"]
    assert (fields["type"]["pattern"], fields["type"]["maxLength"]) == (METAV1_TYPE_PATTERN, 316)
    assert fields["status"]["enum"] == ["True", "False", "Unknown"]
    reason = fields["reason"]
    assert (reason["pattern"], reason["minLength"], reason["maxLength"]) == (
        METAV1_REASON_PATTERN,
        1,
        1024,
    )
    assert fields["message"]["maxLength"] == MESSAGE_MAX == 32768
    assert fields["lastTransitionTime"]["format"] == "date-time"
    assert (fields["observedGeneration"]["format"], fields["observedGeneration"]["minimum"]) == (
        "int64",
        0,
    )


@pytest.mark.parametrize("condition_type", CONDITION_TYPES)
def test_every_condition_type_matches_the_crd(condition_type: str) -> None:
    field = conditions_schema()["items"]["properties"]["type"]
    assert field_problems("type", condition_type, field) == []


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_every_reason_the_operator_can_write_matches_the_crd(reason: str) -> None:
    field = conditions_schema()["items"]["properties"]["reason"]
    assert field_problems("reason", reason, field) == []
    assert status.valid_reason(reason)


def test_every_condition_the_operator_builds_is_one_the_api_server_takes() -> None:
    """Each type and reason is also a declared one, so the tests above cover it."""
    declared = {
        status.READY: get_args(ReadyReason),
        status.ROUTED: get_args(RoutedReason),
        status.CAPACITY: get_args(CapacityReason),
        status.AUTOSCALING: get_args(AutoscalingReason),
    }
    seen: set[tuple[str, str]] = set()
    for doc in statuses():
        conditions = doc["conditions"]
        assert problems(conditions) == [], conditions
        for c in conditions:
            assert c["type"] in CONDITION_TYPES
            assert c["reason"] in declared.get(c["type"], ANALYSIS_REASONS), c
            seen.add((c["type"], c["reason"]))
    for condition_type, reasons in declared.items():  # every state above was built
        assert {r for t, r in seen if t == condition_type} == set(reasons)


@pytest.mark.parametrize(
    ("phase", "reason", "written"),
    [
        ("Holding", "not a reason!", "Holding"),
        ("in progress", "", "Unknown"),
        ("in progress", "WarmingUp", "WarmingUp"),
        ("Progressing", "x" * 1025, "Progressing"),
    ],
)
def test_an_analysis_edited_by_hand_still_gives_conditions_the_api_server_takes(
    phase: str, reason: str, written: str
) -> None:
    """A reason read back from status.analysis that metav1.Condition would refuse becomes the
    phase (or Unknown): the rest of the status is still written."""
    analysis = {"phase": phase, "reason": reason, "message": "m"}
    doc = desired_status(
        name="a",
        model="sentiment",
        generation=1,
        readiness=Readiness(True, "ExternalEndpoint", "External mode"),
        route=None,
        current={"analysis": analysis},
        now=now_rfc3339(),
    )
    assert problems(doc["conditions"]) == []
    healthy = next(c for c in doc["conditions"] if c["type"] == status.ANALYSIS_HEALTHY)
    assert healthy["reason"] == written


def test_a_message_longer_than_the_crd_allows_is_cut() -> None:
    """An API server's refusal quoted in full could exceed metav1.Condition's 32768 characters."""
    doc = desired_status(
        name="a",
        model="sentiment",
        generation=1,
        readiness=Readiness(False, "WorkloadRefused", "refused: " + "x" * MESSAGE_MAX),
        route=None,
        current={},
        now=now_rfc3339(),
    )
    ready = next(c for c in doc["conditions"] if c["type"] == status.READY)
    assert len(ready["message"]) == MESSAGE_MAX
    assert ready["message"].startswith("refused: x")
    assert problems(doc["conditions"]) == []

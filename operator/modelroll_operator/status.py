"""A ModelVersion's status: Ready and Routed conditions (metav1.Condition shape), the weight it
is routed by, endpoint.

The desired status is computed from what the operator observed; ``status_patch`` turns it into
a merge patch, or None when nothing changed, so a replay or a restart writes nothing. A
condition keeps its lastTransitionTime while its status stays the same. A status holds only
what is the version's own: its share of the model's traffic, which moves with every sibling's
weight, is computed where it is shown (``kubectl modelroll status``), so that a weight change
writes the status of the version that changed and no other.

Every condition type and reason the operator writes is listed here (``CONDITION_TYPES``,
``ReadyReason``, ``RoutedReason``, ``ANALYSIS_REASONS``): the CRD validates conditions as
metav1.Condition does, and the API server refuses a whole status with one bad reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from modelroll_common.routes import ModelRoute

from .analysis.phases import FINISHED, Phase, Reason
from .capacity import Verdict
from .condition import MESSAGE_MAX, REASON_MAX, REASON_PATTERN, Condition
from .resource import VersionStatus
from .routing import Acceptance, placement
from .schema import encode

READY = "Ready"
ROUTED = "Routed"
PROGRESSING = "Progressing"
ANALYSIS_HEALTHY = "AnalysisHealthy"
PROMOTED = "Promoted"
ROLLED_BACK = "RolledBack"
HTTPROUTE_ACCEPTED = "HTTPRouteAccepted"
CAPACITY = "Capacity"
AUTOSCALING = "Autoscaling"
CONDITION_TYPES = (
    READY,
    ROUTED,
    HTTPROUTE_ACCEPTED,
    CAPACITY,
    AUTOSCALING,
    PROGRESSING,
    ANALYSIS_HEALTHY,
    PROMOTED,
    ROLLED_BACK,
)
"""Every condition type the operator writes, at most one condition of each."""

ReadyReason = Literal[
    "ExternalEndpoint",
    "ReplicasReady",
    "UpdateRefused",
    "ReplicasNotReady",
    "PodsRefused",
    "ScaledToZero",
    "InvalidSpec",
    "WorkloadConflict",
    "WorkloadRefused",
    "NoBackendRef",
]
"""Every reason of the Ready condition (docs/design.md says when each is given)."""
RoutedReason = Literal["Routed", "WeightZero", "ScaledToZero", "NotReady", "RoutesNotWritten"]
"""Every reason of the Routed condition."""
AutoscalingReason = Literal["ScaledObjectApplied", "AutoscalerMissing", "ScaledObjectRefused"]
"""Every reason of the Autoscaling condition (the Capacity condition's: capacity.py)."""
UNKNOWN_REASON = "Unknown"
"""A canary condition's reason when status.analysis holds no valid one (edited by hand)."""
ANALYSIS_REASONS = (*Phase, *Reason, UNKNOWN_REASON)
"""Every reason of a canary's conditions: its analysis's phase or reason (analysis/phases.py)."""
_UNHEALTHY = (Reason.CANARY_WORSE, Reason.GUARDRAIL, Reason.SHADOW_DISAGREES)
_UNKNOWN_HEALTH = (
    Reason.WARMING_UP,
    Reason.SHADOWING,
    Reason.INSUFFICIENT_DATA,
    Reason.METRICS_UNAVAILABLE,
    Reason.WEIGHTS_NOT_APPLIED,
    Reason.NO_BASELINE,
    Reason.OTHER_CANARY,
)


@dataclass(frozen=True)
class Readiness:
    """Whether a version can serve, why, and the workload figures behind it."""

    ready: bool
    reason: ReadyReason
    message: str
    endpoint: str | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    selector: str | None = None


@dataclass(frozen=True)
class Autoscaling:
    """Whether a version's autoscaler (spec.scaling) is in place, and why."""

    ready: bool
    """Whether the version's autoscaler is in place."""
    reason: AutoscalingReason
    message: str


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def valid_reason(reason: str) -> bool:
    """Whether metav1.Condition (and so the CRD) takes ``reason`` as a condition's reason."""
    return len(reason) <= REASON_MAX and REASON_PATTERN.fullmatch(reason) is not None


def ready_condition(readiness: Readiness) -> dict[str, str]:
    return {
        "type": READY,
        "status": "True" if readiness.ready else "False",
        "reason": readiness.reason,
        "message": readiness.message,
    }


def _held(kind: str, held: bool, reason: str, message: str) -> dict[str, str]:
    """A condition that holds (True) or not (False)."""
    return {
        "type": kind,
        "status": "True" if held else "False",
        "reason": reason,
        "message": message,
    }


def _routed(status: str, reason: RoutedReason, message: str) -> dict[str, str]:
    return {"type": ROUTED, "status": status, "reason": reason, "message": message}


def routed_condition(
    name: str,
    model: str,
    readiness: Readiness,
    route: ModelRoute | None,
    problem: str | None = None,
) -> dict[str, str]:
    """Where the version is in `route`, the route the gateway has. `problem` says why the route
    the operator wanted could not be written: then the condition says so, and what is in force."""
    where = placement(route, name)
    if problem is not None:
        in_force = (
            f"the gateway still routes it with weight {where.weight}"
            if where is not None
            else "the gateway does not route it"
        )
        return _routed(
            "True" if where is not None and where.weight > 0 else "False",
            "RoutesNotWritten",
            f"The routes of model {model} could not be updated: {problem}; {in_force}",
        )
    if where is None:
        return _routed(
            "False",
            "NotReady",
            f"Not in the routes of model {model}: the version is not Ready ({readiness.reason})",
        )
    if route is not None and (entry := route.version(name)) is not None and entry.standby:
        return _routed(
            "False",
            "ScaledToZero",
            f"In the routes of model {model} on standby: no replica runs, and a request that "
            "pins it with the X-Modelroll-Version header is answered 503 with Retry-After",
        )
    if where.weight == 0:
        return _routed(
            "False",
            "WeightZero",
            f"In the routes of model {model} with weight 0: it gets no traffic unless a request "
            "pins it with the X-Modelroll-Version header",
        )
    return _routed("True", "Routed", f"In the routes of model {model} with weight {where.weight}")


def analysis_conditions(analysis: Mapping[str, Any]) -> list[dict[str, str]]:
    """A canary's conditions from its ``status.analysis`` (analysis/daemon.py writes that; the
    conditions are written here only, so that the two writers never overwrite each other's list).

    Their reasons are the analysis's phase and reason (``ANALYSIS_REASONS``); one that is no
    valid reason (a status edited by hand) becomes the phase, else ``Unknown``, so that the
    API server still takes the rest of the status."""
    phase = str(analysis.get("phase") or "")
    if not phase:
        return []
    reason = str(analysis.get("reason") or phase)
    message = str(analysis.get("message") or "")
    if phase in FINISHED and analysis.get("applied") is False:
        # Decided, and saved, but the weights are not written yet: not Promoted (or RolledBack)
        # until they are, so that `kubectl wait --for=condition=Promoted` means it.
        phase, reason = Phase.PROGRESSING, phase
    elif phase == Phase.PROMOTED and analysis.get("routed") is False:
        # Written, but a gateway does not route by them yet: not Promoted until every one does.
        phase, reason = Phase.PROGRESSING, Reason.WEIGHTS_NOT_APPLIED
    phase = phase if valid_reason(phase) else UNKNOWN_REASON
    reason = reason if valid_reason(reason) else phase
    finished = phase in FINISHED
    progressing = phase == Phase.PROGRESSING
    if reason in _UNHEALTHY:
        health = "False"
    elif reason in _UNKNOWN_HEALTH or (reason == Reason.INCONCLUSIVE and not finished):
        health = "Unknown"
    else:
        health = "True"
    return [
        {
            "type": PROGRESSING,
            "status": "True" if progressing else "False",
            "reason": phase if not progressing else reason,
            "message": message,
        },
        {"type": ANALYSIS_HEALTHY, "status": health, "reason": reason, "message": message},
        {
            "type": PROMOTED,
            "status": "True" if phase == Phase.PROMOTED else "False",
            "reason": phase,
            "message": message if phase == Phase.PROMOTED else "",
        },
        {
            "type": ROLLED_BACK,
            "status": "True" if phase == Phase.ROLLED_BACK else "False",
            "reason": phase,
            "message": message if phase == Phase.ROLLED_BACK else "",
        },
    ]


def desired_status(
    *,
    name: str,
    model: str,
    generation: int,
    readiness: Readiness,
    route: ModelRoute | None,
    current: Mapping[str, Any],
    now: str,
    route_problem: str | None = None,
    httproute: str | None = None,
    acceptance: Acceptance | None = None,
    capacity: Verdict | None = None,
    autoscaling: Autoscaling | None = None,
) -> dict[str, Any]:
    """The complete status for a version, keeping transition times of unchanged conditions.
    `route` is the route in force (the data plane's), never one the operator failed to write;
    `httproute` the HTTPRoute that holds it, whose parents' verdict is `acceptance`;
    `capacity` the version's replicas for its share (managed mode, scale before shift on) and
    `autoscaling` its autoscaler's state (spec.scaling)."""
    previous = {c.get("type"): c for c in current.get("conditions") or [] if isinstance(c, dict)}
    conditions = []
    routed = routed_condition(name, model, readiness, route, route_problem)
    analysis = current.get("analysis")
    canary = analysis_conditions(analysis) if isinstance(analysis, Mapping) else []
    accepted = (
        [
            {
                "type": HTTPROUTE_ACCEPTED,
                "status": acceptance.status,
                "reason": acceptance.reason if valid_reason(acceptance.reason) else "Unknown",
                "message": acceptance.message,
            }
        ]
        if acceptance is not None
        else []
    )
    scaled = [
        _held(kind, facts.ready, facts.reason, facts.message)
        for kind, facts in ((CAPACITY, capacity), (AUTOSCALING, autoscaling))
        if facts is not None
    ]
    for cond in (ready_condition(readiness), routed, *accepted, *scaled, *canary):
        old = previous.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"]
        transition = old.get("lastTransitionTime") if same and old else None
        conditions.append(
            Condition(
                type=cond["type"],
                status=cond["status"],
                reason=cond["reason"],
                message=cond["message"][:MESSAGE_MAX],
                observed_generation=generation,
                last_transition_time=transition or now,
            )
        )
    where = placement(route, name)
    managed = readiness.replicas is not None
    status = encode(
        VersionStatus(
            observed_generation=generation,
            conditions=tuple(conditions),
            routed_weight=where.weight if where is not None else None,
            endpoint=readiness.endpoint or None,
            http_route=httproute or None,
            replicas=readiness.replicas,
            ready_replicas=(readiness.ready_replicas or 0) if managed else None,
            selector=readiness.selector or None,
            capacity=capacity.floor.to_status() if capacity and capacity.floor else None,
        )
    )
    if analysis is not None:
        status["analysis"] = analysis  # analysis/daemon.py's: kept as it is
    return status


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """A JSON merge patch turning ``current`` into ``desired``; None when they already match.

    Conditions are written as a whole list (merge patches replace lists), fields that are no
    longer wanted are nulled.
    """
    patch: dict[str, Any] = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in current if k not in desired})
    return patch or None

"""A status condition, declared as Kubernetes' metav1.Condition is validated: the CRD's schema
of status.conditions, and the bounds the operator keeps reasons and messages within."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .schema import api

REASON_PATTERN = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
"""metav1.Condition's pattern for a reason."""
REASON_MAX = 1024
"""metav1.Condition's maximum length of a reason, in characters."""
MESSAGE_MAX = 32768
"""metav1.Condition's maximum length of a message, in characters; longer ones are cut."""
CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


@dataclass(frozen=True)
class Condition:
    """One aspect of the version's state, validated as metav1.Condition is."""

    type: str = api(
        "The condition's type: Ready, Routed, for a model routed by an HTTPRoute "
        "HTTPRouteAccepted, for a managed version Capacity, with spec.scaling Autoscaling, and "
        "for a canary Progressing, AnalysisHealthy, Promoted, RolledBack.",
        pattern=CONDITION_TYPE,
        max_length=316,
    )
    status: str = api("True, False or Unknown.", enum=("True", "False", "Unknown"))
    last_transition_time: str = api(
        "When the condition last changed its status.", format="date-time"
    )
    reason: str = api(
        "A CamelCase word for the condition's last transition.",
        pattern=REASON_PATTERN.pattern,
        min_length=1,
        max_length=REASON_MAX,
    )
    message: str = api("A human-readable explanation of the transition.", max_length=MESSAGE_MAX)
    observed_generation: int | None = api(
        "The metadata.generation the condition was set from.",
        default=None,
        format="int64",
        minimum=0,
    )

"""The phases of a canary analysis and the reasons for them: the strings ``status.analysis``
holds, and the canary's conditions take theirs from (status.py), so each must be a valid
metav1.Condition reason. StrEnums: a member is its string, in the status and wherever it is
compared with one read back."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Every ``status.analysis.phase``."""

    PENDING = "Pending"
    """No analysis can start (no baseline yet, or another canary of the model is analysed):
    daemon.py writes it, not the machine."""
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    HOLDING = "Holding"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"


FINISHED = (Phase.PROMOTED, Phase.ROLLED_BACK)
"""The phases of an analysis that is over (a promotion once every gateway routes by it)."""


class Reason(StrEnum):
    """Every ``status.analysis.reason``: the AnalysisHealthy condition's, and the phase's."""

    WARMING_UP = "WarmingUp"
    INSUFFICIENT_DATA = "InsufficientData"
    INCONCLUSIVE = "Inconclusive"
    HEALTHY = "CanaryHealthy"
    CANARY_WORSE = "CanaryWorse"
    GUARDRAIL = "GuardrailBreached"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    WEIGHTS_NOT_APPLIED = "WeightsNotApplied"
    SHADOWING = "Shadowing"
    """Before step 1: the canary is judged on shadow copies alone (spec.analysis.shadow)."""
    SHADOW_DISAGREES = "ShadowDisagrees"
    STEP_PAUSE = "PausedAtStep"
    MANUAL_WEIGHT = "ManualWeightChange"
    ABORTED = "Aborted"
    NO_BASELINE = "NoBaseline"
    OTHER_CANARY = "OtherCanaryAnalysing"
    """Pending: another canary of the model is being analysed (daemon.py writes it, not the
    machine)."""
    PROMOTED = "Promoted"

"""The phases of a canary analysis and the reasons for them: the strings ``status.analysis``
holds, and the canary's conditions take theirs from (status.py)."""

from __future__ import annotations

PENDING = "Pending"
"""The phase while no analysis can start (no baseline yet): daemon.py writes it, not this."""
PROGRESSING = "Progressing"
PAUSED = "Paused"
HOLDING = "Holding"
PROMOTED = "Promoted"
ROLLED_BACK = "RolledBack"
FINISHED = (PROMOTED, ROLLED_BACK)
PHASES = (PENDING, PROGRESSING, PAUSED, HOLDING, PROMOTED, ROLLED_BACK)
"""Every ``status.analysis.phase``."""

# Reasons (the AnalysisHealthy condition's, and the phase's)
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
"""Pending: another canary of the model is being analysed (daemon.py writes it, not this)."""
REASONS = (
    WARMING_UP,
    INSUFFICIENT_DATA,
    INCONCLUSIVE,
    HEALTHY,
    CANARY_WORSE,
    GUARDRAIL,
    METRICS_UNAVAILABLE,
    WEIGHTS_NOT_APPLIED,
    SHADOWING,
    SHADOW_DISAGREES,
    STEP_PAUSE,
    MANUAL_WEIGHT,
    ABORTED,
    NO_BASELINE,
    OTHER_CANARY,
    PROMOTED,
)
"""Every ``status.analysis.reason``; the canary's conditions take theirs from these and
:data:`PHASES` (status.py), so each must be a valid metav1.Condition reason."""

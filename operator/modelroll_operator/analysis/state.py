"""The state of a canary analysis, as the operator keeps it in the canary's ``status.analysis``
(:class:`AnalysisState`): an operator restarted mid-step reads it back and goes on from there.

Its fields are declared (``..schema.api``): ``make generate`` writes the CRD's schema of
status.analysis from them, and :meth:`AnalysisState.to_dict` and :meth:`AnalysisState.from_dict`
are the declaration's writing and reading.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..condition import MESSAGE_MAX
from ..schema import Api, Computed, FieldError, Json, api, decode, encode, schema_of
from . import shapes, statistics
from .counts import Tally
from .phases import FINISHED, Phase, Reason

DESCRIPTION = (
    "A canary's analysis (spec.analysis), written by the operator; an operator restarted "
    "mid-analysis resumes from it. See docs/analysis.md."
)
"""What ``kubectl explain`` says of status.analysis."""

_T = TypeVar("_T")


def _named(cls: type, description: str, name: str, name_max: int) -> Json:
    """The schema of a map of ``cls`` stored as a list of objects, each with its ``name``."""
    item = schema_of(cls, description, "")
    item["properties"] = {
        "name": {"type": "string", "description": name, "maxLength": name_max},
        **item["properties"],
    }
    return {"type": "array", "items": item}


def _write_named(items: Mapping[str, Any]) -> list[Json]:
    return [{"name": name, **encode(value)} for name, value in sorted(items.items())]


def _read_named(cls: type[_T]) -> Callable[[Any, str], dict[str, _T]]:
    def read(raw: Any, where: str) -> dict[str, _T]:
        if not isinstance(raw, list):
            raise FieldError(f"{where} must be a list")
        return {
            str(item.get("name")): decode(cls, item, f"{where}[{i}]")
            for i, item in enumerate(raw)
            if isinstance(item, Mapping)
        }

    return read


def _ratio(check: CheckState) -> float | None:
    ratio = check.ratio()
    return float(f"{ratio:.4g}") if ratio is not None else None


@dataclass(frozen=True)
class CheckState:
    """One check's evidence in this step."""

    COMPUTED = (
        Computed(
            "statistic",
            Api(
                "The mixture likelihood ratio: the canary fails when it reaches 1/alpha.",
                stored={"type": "number"},
            ),
            lambda check: float(f"{statistics.statistic(check.evidence):.4g}"),
        ),
        Computed(
            "ratio",
            Api("The canary's bad-request rate over the baseline's.", stored={"type": "number"}),
            _ratio,
        ),
    )

    evidence: statistics.Evidence = api("", inline=True)
    verdict: str = api(
        "Pass, Fail or Inconclusive (the minimums of the step aside).",
        default=statistics.INCONCLUSIVE,
        max_length=32,
    )
    bound: float | None = api(
        "The latency check's bound: the baseline's quantile, in seconds.",
        default=None,
        name="boundSeconds",
    )
    """The latency check's bound in seconds (the baseline's quantile), once known."""

    def ratio(self) -> float | None:
        """The canary's bad-request rate over the baseline's, when both are known."""
        c, b = self.evidence.canary, self.evidence.baseline
        if not (c.requests and b.requests and b.bad):
            return None
        return (c.bad / c.requests) / (b.bad / b.requests)


def _judged_tally(description: str) -> Any:
    """A declared sum of a step's deltas, null when there is none; written without the model
    calls (only a source's own readings need them, for their deltas)."""
    return api(
        description,
        default=None,
        nullable=True,
        read=lambda raw, where: decode(Tally, raw, where) if raw else None,
        write=lambda tally: encode(tally.without_calls()),
    )


@dataclass(frozen=True)
class AnalysisState:
    """Where an analysis is (``status.analysis``)."""

    WRITTEN_WHOLE = True

    phase: Phase = api(
        "Pending (no baseline yet), Progressing, Paused, Holding, Promoted or RolledBack.",
        max_length=32,
        stored={"type": "string"},  # read as a Phase, stored as any string
    )
    step: int = api(
        "The current step, 1-based.",
        read=lambda raw, where: int(raw) - 1,
        write=lambda step: step + 1,  # as users count steps (and kubectl get shows it)
    )
    """The current step's index (0-based)."""
    step_started: float = api(
        "When the current step's weights were decided (unix seconds).",
        name="stepStartedAt",
        write=shapes.seconds,
    )
    """When the operator decided on this step's weights (unix seconds)."""
    evaluated_at: float = api(
        "When the step's time was last counted (unix seconds).", write=shapes.seconds
    )
    """When this step's time was last counted (unix seconds)."""
    baseline: str = api("The version the canary is compared with.", max_length=253)
    baseline_weight: int = api("The baseline's weight before the analysis (restored on rollback).")
    """The baseline's weight before the analysis: restored on rollback."""
    canary_weight: int = api("The canary's weight the analysis set last.")
    """The weights this analysis last decided on; any others in the spec were set by hand."""
    baseline_step_weight: int = api("The baseline's weight the analysis set last.")
    reason: Reason = api(
        "Why the analysis is where it is: WarmingUp, InsufficientData, Inconclusive, "
        "CanaryHealthy, CanaryWorse, GuardrailBreached, MetricsUnavailable, PausedAtStep, "
        "ManualWeightChange, Aborted, NoBaseline, OtherCanaryAnalysing, Promoted.",
        default=Reason.WARMING_UP,
        max_length=64,
        stored={"type": "string"},
    )
    message: str = api(
        "The same in words, with the evidence (a longer one is cut to this field's bound). Of "
        "a metrics source's answer it says what was wrong and where, never what the answer "
        "held.",
        default="",
        max_length=MESSAGE_MAX,
        write=lambda message: clip(message, MESSAGE_MAX),
    )
    sources: Mapping[str, Tally] = api(
        "Each source's counters (a gateway replica's) at its last reading in this step, where "
        "its next deltas start; a source not read for 5 minutes is dropped (docs/analysis.md, "
        "Counters per gateway replica).",
        default_factory=dict,
        max_items=64,
        stored=_named(
            Tally,
            "One source's last reading.",
            "The source, a gateway pod (pod/<name>), a Prometheus scrape target "
            "(instance/<host:port>) or a fixed /metrics URL.",
            512,
        ),
        read=_read_named(Tally),
        write=_write_named,
    )
    """Each source's counters at its last reading in this step (the next deltas start there)."""
    step_counts: Tally | None = _judged_tally(
        "What the gateway's replicas counted in this step (warm-up included) since its first "
        "reading, the sum of each replica's deltas."
    )
    """What the sources counted in this step (warm-up included), since its first reading."""
    window: Tally | None = _judged_tally(
        "What the gateway's replicas counted in the judged intervals of this step (null while "
        "warming up)."
    )
    """What the sources counted in the judged intervals, since judging started (None: warming
    up)."""
    checks: Mapping[str, CheckState] = api(
        "Per comparison check: counts per arm, the ratio, the test statistic, the verdict.",
        default_factory=dict,
        max_items=8,
        stored=_named(
            CheckState,
            "One check's evidence in this step.",
            "The check's key in spec.analysis.checks: errors, latency, timeToFirstToken or "
            "timePerOutputToken.",
            32,
        ),
        read=_read_named(CheckState),
        write=_write_named,
    )
    guardrail: statistics.Counts = api(
        "The canary's judged requests and errors in this step.",
        default_factory=lambda: statistics.Counts(0, 0),
        stored=statistics.REQUESTS_SCHEMA,
        read=lambda raw, where: statistics.Counts(
            int(raw.get("requests", 0)), int(raw.get("bad", 0))
        ),
        write=lambda counts: {"requests": counts.requests, "bad": counts.bad},
    )
    """The canary's judged requests and errors in this step (for the guardrail)."""
    spec_hash: str = api(
        "Which spec.analysis this state belongs to; another one starts a new analysis.",
        default="",
        max_length=64,
    )
    """The hash of the spec.analysis this state belongs to: another one starts anew."""
    applied: bool = api(
        "Whether those weights are written (false only between saving a step and writing its "
        "weights).",
        default=True,
    )
    """Whether the weights above are written (a state is saved before its weights are, so an
    operator stopped in between writes them on its return instead of taking them for a change
    made by hand)."""
    last_command: str = api(
        "The last modelroll.io/analysis-command handled.", default="", max_length=128
    )
    """The last command annotation handled (commands carry a nonce: each is done once)."""
    step_seconds: float = api(
        "Seconds the current step has run, as the analysis counts them (each evaluation adds "
        "the time since the last, at most two intervals); warmupSeconds, minSeconds and "
        "maxSeconds are measured in these.",
        default=0.0,
        write=shapes.seconds,
    )
    """Seconds this step has run, as the analysis counts them (:data:`CREDIT_INTERVALS`): the
    warm-up, ``minSeconds`` and ``maxSeconds`` are measured in these, not on the wall clock."""
    judging_from: float = api(
        "The stepSeconds at which judging started.",
        default=0.0,
        name="judgingFromSeconds",
        write=shapes.seconds,
    )
    """The ``step_seconds`` at which judging started."""
    shadowing: bool = api(
        "Whether the canary is still judged on shadow copies alone, before step 1 "
        "(spec.analysis.shadow).",
        default=False,
    )
    """Before step 1, judged on shadow copies alone (spec.analysis.shadow): ``step`` is 0 and
    the canary's weight 0 until the gate passes."""
    routed: bool = api(
        "Whether every gateway read routes by these weights: false from a promotion until they "
        "do (the Promoted condition turns True only then).",
        default=True,
    )
    """Whether every gateway read routes by these weights; False from a promotion until they
    do (a promotion is complete only then)."""
    promotion: str = api(
        "A promotion's decision in words, the weights and why (\"canary weight 100, baseline "
        'stable 0. Step 2 passed (...)."): the message gives it after "Promoting:" until every '
        'gateway routes by the promoted weights, then after "Promoted:". Empty in every other '
        "phase.",
        default="",
        max_length=MESSAGE_MAX,
        write=lambda promotion: clip(promotion, MESSAGE_MAX),
    )
    """A promotion's decision in words, the weights and why ("canary weight 100, baseline
    stable 0. Step 2 passed (...)."): the message gives it after "Promoting:" until the
    promotion is complete, then after "Promoted:". Empty in every other phase."""

    @property
    def finished(self) -> bool:
        """Over: rolled back, or promoted with every gateway routing by the promoted weights."""
        return self.phase in FINISHED and self.routed

    @classmethod
    def derive(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        """What reading a status written by an earlier operator changes.

        A state without a ``window`` is warming up: its checks, if any, are dropped, and one
        without ``sources`` takes its next reading as a first one. A status that holds neither
        (only summed counters, ``last`` and ``windowStart``) so starts its step's window again.
        One without ``stepSeconds`` counted time on the wall clock and pinned requests with the
        others: its step's time starts again from 0, and its sources are dropped.
        """
        derived: dict[str, Any] = {}
        if not raw.get("window"):
            derived |= {"checks": {}, "guardrail": statistics.Counts(0, 0)}
        if raw.get("stepSeconds") is None:
            derived["sources"] = {}
        if raw.get("evaluatedAt") is None:
            derived["evaluated_at"] = raw.get("stepStartedAt")
        return derived

    def to_dict(self) -> Json:
        """The state as status.analysis holds it."""
        return encode(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AnalysisState | None:
        """The state a status holds; None if it holds none (or not one this code can read)."""
        try:
            return decode(cls, raw, "status.analysis")
        except (FieldError, TypeError, ValueError, AttributeError):
            return None


def clip(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters ending in "…" if it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_schema() -> Json:
    """The schema of status.analysis."""
    return schema_of(AnalysisState, DESCRIPTION, "status.analysis")

"""A canary analysis as a pure state machine: what the operator does at each evaluation.

Everything the analysis knows lives in :class:`AnalysisState`, which the operator keeps in the
canary's ``status.analysis``: an operator restarted mid-step reads it back and goes on from there.
Every decision is a function of (spec, state, the counters read now, the time), so the operator,
the tests and the simulation in ``modelroll-bench analysis`` run the same code.

A step: the operator writes its weights (canary ``w``, baseline ``100 - w``, scaled to the
baseline's weight when that was above 100). The first ``warmupSeconds`` (and ``warmupRequests``
canary requests) are not judged. Then every interval the deltas of both versions' counters feed
each check (judge.py). A check that fails rolls back at once; the step passes when every check
passes after ``minSeconds`` and ``minRequests``; at ``maxSeconds`` without a verdict the
``onInconclusive`` policy applies (Hold: the weights stay, the analysis goes on and says why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import judge
from .analysis_spec import PROMOTE, ROLLBACK, AnalysisSpec, ErrorCheck, LatencyCheck

PENDING = "Pending"
"""The phase while no analysis can start (no baseline yet): canary.py writes it, not this."""
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
STEP_PAUSE = "PausedAtStep"
MANUAL_WEIGHT = "ManualWeightChange"
ABORTED = "Aborted"
NO_BASELINE = "NoBaseline"
REASONS = (
    WARMING_UP,
    INSUFFICIENT_DATA,
    INCONCLUSIVE,
    HEALTHY,
    CANARY_WORSE,
    GUARDRAIL,
    METRICS_UNAVAILABLE,
    STEP_PAUSE,
    MANUAL_WEIGHT,
    ABORTED,
    NO_BASELINE,
    PROMOTED,
)
"""Every ``status.analysis.reason``; the canary's conditions take theirs from these and
:data:`PHASES` (status.py), so each must be a valid metav1.Condition reason."""

_DEFAULT_ERRORS = ErrorCheck(max_ratio=1.5)
"""What counts as an error for the guardrail when the spec has no error check."""


@dataclass(frozen=True)
class VersionCounts:
    """One version's cumulative counters, summed over the gateway's replicas."""

    codes: Mapping[str, float] = field(default_factory=dict)
    """Requests by status code."""
    buckets: tuple[tuple[float, float], ...] = ()
    """The latency histogram: cumulative (le, count), ascending, the last le is +Inf."""

    @property
    def requests(self) -> float:
        return sum(self.codes.values())

    def errors(self, check: ErrorCheck) -> float:
        return sum(n for code, n in self.codes.items() if check.is_error(code))

    def minus(self, earlier: VersionCounts) -> VersionCounts:
        """The counts since ``earlier`` (the same series, read later)."""
        before = dict(earlier.buckets)
        return VersionCounts(
            codes={c: n - earlier.codes.get(c, 0.0) for c, n in self.codes.items()},
            buckets=tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
        )

    def to_dict(self) -> dict[str, Any]:
        # Lists, not maps keyed by code: the state is written with JSON merge patches, which
        # would keep keys a new map lacks.
        return {
            "codes": [{"code": c, "count": _num(n)} for c, n in sorted(self.codes.items())],
            "buckets": [{"le": _le(le), "count": _num(n)} for le, n in self.buckets],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> VersionCounts:
        codes = {str(c["code"]): float(c["count"]) for c in raw.get("codes") or []}
        buckets = tuple((float(b["le"]), float(b["count"])) for b in raw.get("buckets") or [])
        return cls(codes=codes, buckets=buckets)


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes it (``float()`` reads it back, "+Inf" included)."""
    return "+Inf" if math.isinf(bound) else repr(bound)


EMPTY = VersionCounts()


@dataclass(frozen=True)
class Snapshot:
    """Both versions' counters at one moment (unix seconds)."""

    at: float
    canary: VersionCounts
    baseline: VersionCounts

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "canary": self.canary.to_dict(),
            "baseline": self.baseline.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> Snapshot | None:
        if not raw:
            return None
        return cls(
            at=float(raw.get("at") or 0.0),
            canary=VersionCounts.from_dict(raw.get("canary") or {}),
            baseline=VersionCounts.from_dict(raw.get("baseline") or {}),
        )

    def reset_since(self, earlier: Snapshot) -> bool:
        """Whether a counter went down (a gateway restarted): deltas across it mean nothing."""
        return (
            self.canary.requests < earlier.canary.requests
            or self.baseline.requests < earlier.baseline.requests
        )


@dataclass(frozen=True)
class CheckState:
    evidence: judge.Evidence
    verdict: str = judge.INCONCLUSIVE
    bound: float | None = None
    """The latency check's bound in seconds (the baseline's quantile), once known."""

    def ratio(self) -> float | None:
        """The canary's bad-request rate over the baseline's, when both are known."""
        c, b = self.evidence.canary, self.evidence.baseline
        if not (c.requests and b.requests and b.bad):
            return None
        return (c.bad / c.requests) / (b.bad / b.requests)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "verdict": self.verdict,
            **self.evidence.to_dict(),
            "statistic": float(f"{judge.statistic(self.evidence):.4g}"),
        }
        if (ratio := self.ratio()) is not None:
            out["ratio"] = float(f"{ratio:.4g}")
        if self.bound is not None:
            out["boundSeconds"] = self.bound
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CheckState:
        bound = raw.get("boundSeconds")
        return cls(
            evidence=judge.Evidence.from_dict(raw),
            verdict=str(raw.get("verdict") or judge.INCONCLUSIVE),
            bound=float(bound) if bound is not None else None,
        )


@dataclass(frozen=True)
class AnalysisState:
    """Where an analysis is (``status.analysis``)."""

    phase: str
    step: int
    """The current step's index (0-based)."""
    step_started: float
    """When the operator decided on this step's weights (unix seconds)."""
    baseline: str
    baseline_weight: int
    """The baseline's weight before the analysis: restored on rollback."""
    canary_weight: int
    """The weights this analysis last decided on; any others in the spec were set by hand."""
    baseline_step_weight: int
    reason: str = WARMING_UP
    message: str = ""
    step_first: Snapshot | None = None
    """The counters at the first reading of this step (the warm-up's start)."""
    window_start: Snapshot | None = None
    """The counters when judging started (the end of the warm-up)."""
    last: Snapshot | None = None
    """The counters at the last evaluation."""
    checks: Mapping[str, CheckState] = field(default_factory=dict)
    guardrail: judge.Counts = field(default_factory=lambda: judge.Counts(0, 0))
    """The canary's judged requests and errors in this step (for the guardrail)."""
    spec_hash: str = ""
    """The hash of the spec.analysis this state belongs to: another one starts anew."""
    applied: bool = True
    """Whether the weights above are written (a state is saved before its weights are, so an
    operator stopped in between writes them on its return instead of taking them for a change
    made by hand)."""
    last_command: str = ""
    """The last command annotation handled (commands carry a nonce: each is done once)."""

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "step": self.step + 1,  # as users count steps (and kubectl get shows it)
            "stepStartedAt": round(self.step_started, 3),
            "baseline": self.baseline,
            "baselineWeight": self.baseline_weight,
            "canaryWeight": self.canary_weight,
            "baselineStepWeight": self.baseline_step_weight,
            "reason": self.reason,
            "message": self.message,
            "checks": [{"name": n, **c.to_dict()} for n, c in sorted(self.checks.items())],
            "guardrail": {"requests": self.guardrail.requests, "bad": self.guardrail.bad},
            "specHash": self.spec_hash,
            "applied": self.applied,
            "lastCommand": self.last_command,
        }
        # Every key, null when unset: a merge patch removes what a null names.
        out["stepFirst"] = self.step_first.to_dict() if self.step_first else None
        out["windowStart"] = self.window_start.to_dict() if self.window_start else None
        out["last"] = self.last.to_dict() if self.last else None
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AnalysisState | None:
        """The state a status holds; None if it holds none (or not one this code can read)."""
        try:
            guard = raw.get("guardrail") or {}
            return cls(
                phase=str(raw["phase"]),
                step=int(raw["step"]) - 1,
                step_started=float(raw["stepStartedAt"]),
                baseline=str(raw["baseline"]),
                baseline_weight=int(raw["baselineWeight"]),
                canary_weight=int(raw["canaryWeight"]),
                baseline_step_weight=int(raw["baselineStepWeight"]),
                reason=str(raw.get("reason") or ""),
                message=str(raw.get("message") or ""),
                step_first=Snapshot.from_dict(raw.get("stepFirst")),
                window_start=Snapshot.from_dict(raw.get("windowStart")),
                last=Snapshot.from_dict(raw.get("last")),
                checks={str(c["name"]): CheckState.from_dict(c) for c in raw.get("checks") or []},
                guardrail=judge.Counts(int(guard.get("requests", 0)), int(guard.get("bad", 0))),
                spec_hash=str(raw.get("specHash") or ""),
                applied=bool(raw.get("applied", True)),
                last_command=str(raw.get("lastCommand") or ""),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Weights:
    """Weights the operator must write: the canary's first, then the baseline's."""

    canary: int
    baseline: int


@dataclass(frozen=True)
class Decision:
    state: AnalysisState
    weights: Weights | None = None
    """Weights to write now (None: leave them)."""
    event: str | None = None
    """Something a user should hear about (an Event): a step, a pause, a verdict."""
    warning: bool = False


def step_weights(spec: AnalysisSpec, step: int, baseline_weight: int) -> Weights:
    """The canary's weight at a step and the baseline's: ``w`` and ``100 - w`` of the pair's
    total, which is the baseline's weight before the analysis, and at least 100."""
    total = max(100, baseline_weight)
    canary = round(total * spec.steps[step].weight / 100)
    return Weights(canary, total - canary)


def promoted_weights(state: AnalysisState) -> Weights:
    """The canary takes the baseline's place (its weight before the analysis, at least 1); the
    baseline stays up, warm, at 0."""
    return Weights(max(state.baseline_weight, 1), 0)


def start(
    spec: AnalysisSpec, baseline: str, baseline_weight: int, now: float, spec_hash: str
) -> Decision:
    """A new analysis: the first step's weights."""
    weights = step_weights(spec, 0, baseline_weight)
    state = AnalysisState(
        phase=PROGRESSING,
        step=0,
        step_started=now,
        baseline=baseline,
        baseline_weight=baseline_weight,
        canary_weight=weights.canary,
        baseline_step_weight=weights.baseline,
        reason=WARMING_UP,
        message=f"Step 1 of {len(spec.steps)}: canary weight {weights.canary}, baseline "
        f"{baseline} {weights.baseline}",
        spec_hash=spec_hash,
    )
    started = f"Analysis started against baseline {baseline}. {state.message}"
    return Decision(state, weights, event=started)


def _to_step(spec: AnalysisSpec, state: AnalysisState, step: int, now: float, why: str) -> Decision:
    """Move to ``step`` (promote past the last)."""
    if step >= len(spec.steps):
        weights = promoted_weights(state)
        done = replace(
            _fresh_step(state, now),
            phase=PROMOTED,
            step=len(spec.steps) - 1,
            canary_weight=weights.canary,
            baseline_step_weight=weights.baseline,
            reason=PROMOTED,
            message=f"Promoted: canary weight {weights.canary}, baseline {state.baseline} 0. "
            + why,
        )
        return Decision(done, weights, event=done.message)
    weights = step_weights(spec, step, state.baseline_weight)
    message = (
        f"Step {step + 1} of {len(spec.steps)}: canary weight {weights.canary}, baseline "
        f"{state.baseline} {weights.baseline}"
    )
    moved = replace(
        _fresh_step(state, now),
        phase=PROGRESSING,
        step=step,
        canary_weight=weights.canary,
        baseline_step_weight=weights.baseline,
        reason=WARMING_UP,
        message=message,
    )
    return Decision(moved, weights, event=f"{why} {message}".strip())


def _fresh_step(state: AnalysisState, now: float) -> AnalysisState:
    return replace(
        state,
        step_started=now,
        step_first=None,
        window_start=None,
        last=None,
        checks={},
        guardrail=judge.Counts(0, 0),
    )


def rollback(state: AnalysisState, reason: str, why: str) -> Decision:
    weights = Weights(0, state.baseline_weight)
    done = replace(
        state,
        phase=ROLLED_BACK,
        canary_weight=0,
        baseline_step_weight=state.baseline_weight,
        reason=reason,
        message=f"Rolled back: canary weight 0, baseline {state.baseline} "
        f"{state.baseline_weight}. {why}",
    )
    return Decision(done, weights, event=done.message, warning=True)


def pause(state: AnalysisState, reason: str, message: str) -> Decision:
    paused = replace(state, phase=PAUSED, reason=reason, message=message)
    return Decision(paused, event=message, warning=reason == MANUAL_WEIGHT)


def resume(spec: AnalysisSpec, state: AnalysisState, now: float) -> Decision:
    """``kubectl modelroll analysis resume``: past a passed pause step, the next step; after a
    manual weight change (or any other pause), this step again, from its start."""
    if state.phase != PAUSED:
        return Decision(state)
    if state.reason == STEP_PAUSE:
        return _to_step(spec, state, state.step + 1, now, "Resumed.")
    return _to_step(spec, state, state.step, now, "Resumed: the step starts again.")


def skip(spec: AnalysisSpec, state: AnalysisState, now: float) -> Decision:
    """``kubectl modelroll analysis skip``: the next step without judging this one."""
    if state.finished:
        return Decision(state)
    return _to_step(spec, state, state.step + 1, now, f"Step {state.step + 1} skipped by hand.")


def abort(state: AnalysisState) -> Decision:
    if state.finished:
        return Decision(state)
    return rollback(state, ABORTED, "Aborted by hand.")


def describe(name: str, check: CheckState) -> str:
    """A check's evidence in words: "errors: canary 6/180 vs baseline 9/3400 (ratio 11.3)"."""
    ev = check.evidence
    c, b = ev.canary, ev.baseline
    text = f"{name}: canary {c.bad}/{c.requests} vs baseline {b.bad}/{b.requests}"
    if (ratio := check.ratio()) is not None:
        text += f" (ratio {ratio:.2g})"
    if check.bound is not None:
        text += f", slower than {check.bound * 1000:g} ms"
    return text


def evaluate(
    spec: AnalysisSpec,
    state: AnalysisState,
    snapshot: Snapshot | None,
    now: float,
    source_error: str | None = None,
) -> Decision:
    """One evaluation: ``snapshot`` is what the metrics source gave now (None, with
    ``source_error``, when it could not be read)."""
    if state.finished or state.phase == PAUSED:
        return Decision(state)
    if snapshot is None:
        held = replace(
            state,
            phase=HOLDING,
            reason=METRICS_UNAVAILABLE,
            message=f"Holding: the metrics cannot be read ({source_error or 'no data'})",
        )
        first = state.reason != METRICS_UNAVAILABLE
        return Decision(held, event=held.message if first else None, warning=True)
    if state.reason == METRICS_UNAVAILABLE:
        state = replace(state, phase=PROGRESSING, reason=INCONCLUSIVE)
    if state.last is not None and snapshot.reset_since(state.last):
        # A gateway restarted: start the window again from here (the evidence stays).
        restarted = replace(
            state,
            last=snapshot,
            step_first=snapshot,
            window_start=snapshot if state.window_start is not None else None,
            message="The gateway's counters were reset; judging goes on from now",
        )
        return Decision(restarted)
    if state.window_start is None:
        return _warm_up(spec, state, snapshot, now)
    return _judge(spec, state, snapshot, now)


def _warm_up(spec: AnalysisSpec, state: AnalysisState, snapshot: Snapshot, now: float) -> Decision:
    first = state.step_first or snapshot
    seen = snapshot.canary.requests - first.canary.requests
    if now - state.step_started >= spec.warmup_seconds and seen >= spec.warmup_requests:
        judging = replace(
            state,
            step_first=first,
            window_start=snapshot,
            last=snapshot,
            checks={name: CheckState(judge.new_evidence()) for name in spec.checks()},
            reason=INSUFFICIENT_DATA,
            message=f"Step {state.step + 1}: judging from now on",
        )
        return Decision(judging)
    return Decision(replace(state, step_first=first, reason=WARMING_UP, last=snapshot))


def _judge(spec: AnalysisSpec, state: AnalysisState, snapshot: Snapshot, now: float) -> Decision:
    assert state.window_start is not None
    assert state.last is not None
    canary = snapshot.canary.minus(state.last.canary)
    baseline = snapshot.baseline.minus(state.last.baseline)
    # The latency bound comes from the baseline's requests before this interval (the step's,
    # warm-up included): one taken from the same requests it judges would favour the baseline.
    earlier_baseline = state.last.baseline.minus((state.step_first or state.window_start).baseline)
    active = [c for c in spec.checks().values() if not c.dry_run]
    alpha = judge.check_alpha(spec.false_rollback_budget, max(1, len(active)), len(spec.steps))
    checks: dict[str, CheckState] = {}
    for name, check in spec.checks().items():
        previous = state.checks.get(name) or CheckState(judge.new_evidence())
        bound = previous.bound
        if isinstance(check, ErrorCheck):
            c = judge.Counts(round(canary.requests), round(canary.errors(check)))
            b = judge.Counts(round(baseline.requests), round(baseline.errors(check)))
        else:
            assert isinstance(check, LatencyCheck)
            bound = judge.slow_bound(earlier_baseline.buckets, check.quantile)
            if bound is None or math.isinf(bound):
                c = judge.Counts(round(canary.requests), 0)
                b = judge.Counts(round(baseline.requests), 0)
            else:
                c = judge.Counts(round(canary.requests), round(judge.over(canary.buckets, bound)))
                b = judge.Counts(
                    round(baseline.requests), round(judge.over(baseline.buckets, bound))
                )
        updated = judge.update(previous.evidence, check.max_ratio, c, b)
        verdict = judge.verdict(updated, alpha, spec.false_promotion_budget)
        checks[name] = CheckState(updated, verdict, bound)
    guard_check = spec.errors or _DEFAULT_ERRORS
    guardrail = judge.Counts(
        state.guardrail.requests + round(canary.requests),
        state.guardrail.bad + round(canary.errors(guard_check)),
    )
    judged = replace(state, last=snapshot, checks=checks, guardrail=guardrail)
    evidence = "; ".join(describe(n, c) for n, c in sorted(checks.items()))

    g = spec.guardrail
    if (
        g is not None
        and not g.dry_run
        and guardrail.requests >= g.min_requests
        and guardrail.bad > g.max_error_ratio * guardrail.requests
    ):
        return rollback(
            judged,
            GUARDRAIL,
            f"The canary failed {guardrail.bad} of {guardrail.requests} requests, above the "
            f"guardrail of {g.max_error_ratio:.0%}.",
        )
    failed = [n for n, c in checks.items() if c.verdict == judge.FAIL and not _dry(spec, n)]
    if failed:
        return rollback(judged, CANARY_WORSE, f"The canary is worse: {evidence}.")

    judged_for = now - (state.window_start.at if state.window_start else now)
    canary_requests = snapshot.canary.requests - state.window_start.canary.requests
    # No evidence, no verdict: a baseline that answered nothing in the window is no comparison.
    compared = snapshot.baseline.requests - state.window_start.baseline.requests > 0
    enough = compared and judged_for >= spec.min_seconds and canary_requests >= spec.min_requests
    passed = all(c.verdict == judge.PASS or _dry(spec, n) for n, c in checks.items())
    if enough and passed:
        step = spec.steps[state.step]
        why = f"Step {state.step + 1} passed ({evidence})."
        if step.pause:
            return pause(
                judged,
                STEP_PAUSE,
                f"{why} Paused: `kubectl modelroll analysis resume` goes on to the next step",
            )
        return _to_step(spec, judged, state.step + 1, now, why)
    reason = INCONCLUSIVE if enough else INSUFFICIENT_DATA
    if not enough:
        detail = (
            f"{canary_requests:.0f}/{spec.min_requests} canary requests, "
            f"{judged_for:.0f}/{spec.min_seconds} s judged"
        )
        if not compared:
            detail = f"{detail}, no baseline requests"
    else:
        detail = "the evidence is not yet clear either way"
    if now - state.step_started >= spec.max_seconds:
        late = f"Step {state.step + 1} had no verdict after {spec.max_seconds} s ({detail})."
        # Without baseline requests there is nothing to be inconclusive about: always hold.
        if compared and spec.on_inconclusive == ROLLBACK:
            return rollback(judged, reason, f"{late} {evidence}")
        if compared and spec.on_inconclusive == PROMOTE:
            return _to_step(spec, judged, len(spec.steps), now, late)
        message = (
            f"Holding at step {state.step + 1}: no verdict after {spec.max_seconds} s "
            f"({detail}; {evidence})"
        )
        first = state.phase != HOLDING
        held = replace(judged, phase=HOLDING, reason=reason, message=message)
        return Decision(held, event=message if first else None, warning=first)
    message = f"Step {state.step + 1}: {detail} ({evidence})"
    return Decision(replace(judged, phase=PROGRESSING, reason=reason, message=message))


def _dry(spec: AnalysisSpec, name: str) -> bool:
    check = spec.checks().get(name)
    return check is not None and check.dry_run

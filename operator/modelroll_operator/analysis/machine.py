"""A canary analysis as a pure state machine: the transitions the operator makes at each
evaluation, and by command (resume, skip, abort).

Everything the analysis knows lives in :class:`~.state.AnalysisState`, which the operator keeps
in the canary's ``status.analysis``: an operator restarted mid-step reads it back and goes on
from there. Every decision is a function of (spec, state, the counters read now, the time), so
the operator, the tests and the simulation in ``modelroll-bench analysis`` run the same code.

A step: the operator writes its weights (canary ``w``, baseline ``100 - w``, scaled to the
baseline's weight when that was above 100). The first ``warmupSeconds`` (and ``warmupRequests``
canary requests) are not judged. Then every interval the deltas of both versions' counters feed
each check (statistics.py), as counts.py sums them per source. A check that fails rolls back at
once; the step passes when every check passes after ``minSeconds`` and ``minRequests``; at
``maxSeconds`` without a verdict the ``onInconclusive`` policy applies (Hold: the weights stay,
the analysis goes on and says why). Those seconds are counted by the evaluations
(:data:`CREDIT_INTERVALS`), not read off the wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from . import statistics
from .counts import Interval, Snapshot, Tally, VersionCounts, count
from .phases import Phase, Reason
from .shapes import Histogram
from .spec import (
    LATENCY,
    PROMOTE,
    ROLLBACK,
    TPOT,
    TTFT,
    AnalysisSpec,
    ErrorCheck,
    LatencyCheck,
)
from .state import AnalysisState, CheckState

PROMOTING = "Promoting:"
"""How a promotion's message starts until every gateway routes by it."""
WAITING = " Waiting for every gateway to route by it: "

_DEFAULT_ERRORS = ErrorCheck(max_ratio=1.5)
"""What counts as an error for the guardrail when the spec has no error check."""


CREDIT_INTERVALS = 2
"""An evaluation adds to a step's time what passed since the last one, at most this many
intervals (default 2): room for a late tick, while a wall clock that jumps ahead (or an
operator that was down) cannot skip a step's warm-up, ``minSeconds`` or ``maxSeconds``."""
NO_SOURCE = "no source had a series of the two versions"
"""Why a reading that found no source at all holds."""


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
    """A new analysis: the first step's weights, or with a shadow gate, the canary at 0 while
    its shadow copies are judged."""
    shadowing = spec.shadow is not None
    if spec.shadow is not None:
        weights = Weights(0, baseline_weight)
        message = (
            f"Shadowing: the canary's answers to copies of {baseline}'s requests are compared "
            f"before step 1 (at least {spec.shadow.min_copies} copies)"
        )
    else:
        weights = step_weights(spec, 0, baseline_weight)
        message = (
            f"Step 1 of {len(spec.steps)}: canary weight {weights.canary}, baseline "
            f"{baseline} {weights.baseline}"
        )
    state = AnalysisState(
        phase=Phase.PROGRESSING,
        step=0,
        step_started=now,
        evaluated_at=now,
        baseline=baseline,
        baseline_weight=baseline_weight,
        canary_weight=weights.canary,
        baseline_step_weight=weights.baseline,
        reason=Reason.SHADOWING if shadowing else Reason.WARMING_UP,
        message=message,
        spec_hash=spec_hash,
        shadowing=shadowing,
    )
    started = f"Analysis started against baseline {baseline}. {state.message}"
    return Decision(state, weights, event=started)


def _to_step(spec: AnalysisSpec, state: AnalysisState, step: int, now: float, why: str) -> Decision:
    """Move to ``step`` (promote past the last)."""
    if step >= len(spec.steps):
        weights = promoted_weights(state)
        promotion = f"canary weight {weights.canary}, baseline {state.baseline} 0. {why}"
        done = replace(
            _fresh_step(state, now),
            phase=Phase.PROMOTED,
            step=len(spec.steps) - 1,
            canary_weight=weights.canary,
            baseline_step_weight=weights.baseline,
            reason=Reason.PROMOTED,
            message=f"{PROMOTING} {promotion}",
            promotion=promotion,
            routed=False,
        )
        return Decision(done, weights, event=done.message)
    weights = step_weights(spec, step, state.baseline_weight)
    message = (
        f"Step {step + 1} of {len(spec.steps)}: canary weight {weights.canary}, baseline "
        f"{state.baseline} {weights.baseline}"
    )
    moved = replace(
        _fresh_step(state, now),
        phase=Phase.PROGRESSING,
        step=step,
        canary_weight=weights.canary,
        baseline_step_weight=weights.baseline,
        reason=Reason.WARMING_UP,
        message=message,
    )
    return Decision(moved, weights, event=f"{why} {message}".strip())


def _fresh_step(state: AnalysisState, now: float) -> AnalysisState:
    return replace(
        state,
        step_started=now,
        evaluated_at=now,
        step_seconds=0.0,
        judging_from=0.0,
        sources={},
        step_counts=None,
        window=None,
        checks={},
        guardrail=statistics.Counts(0, 0),
    )


def rollback(state: AnalysisState, reason: Reason, why: str) -> Decision:
    weights = Weights(0, state.baseline_weight)
    done = replace(
        state,
        phase=Phase.ROLLED_BACK,
        canary_weight=0,
        baseline_step_weight=state.baseline_weight,
        reason=reason,
        message=f"Rolled back: canary weight 0, baseline {state.baseline} "
        f"{state.baseline_weight}. {why}",
        promotion="",
    )
    return Decision(done, weights, event=done.message, warning=True)


def pause(state: AnalysisState, reason: Reason, message: str) -> Decision:
    paused = replace(state, phase=Phase.PAUSED, reason=reason, message=message, promotion="")
    return Decision(paused, event=message, warning=reason == Reason.MANUAL_WEIGHT)


def resume(spec: AnalysisSpec, state: AnalysisState, now: float) -> Decision:
    """``kubectl modelroll analysis resume``: past a passed pause step, the next step; after a
    manual weight change (or any other pause), this step again, from its start."""
    if state.phase != Phase.PAUSED:
        return Decision(state)
    if state.reason == Reason.STEP_PAUSE:
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
    return rollback(state, Reason.ABORTED, "Aborted by hand.")


def describe(name: str, check: CheckState) -> str:
    """A check's evidence in words: "errors: canary 6/180 vs baseline 9/3400 (ratio 11.3)"."""
    ev = check.evidence
    c, b = ev.canary, ev.baseline
    text = f"{name}: canary {c.bad}/{c.requests} vs baseline {b.bad}/{b.requests}"
    if (ratio := check.ratio()) is not None:
        text += f" (ratio {ratio:.2g})"
    if check.bound is not None:
        text += f", slower than {check.bound * 1000:g} ms"
    if (
        c.calls is not None
        and b.calls is not None
        and (c.calls, b.calls) != (c.requests, b.requests)
    ):
        (n_c, e_c), (n_b, e_b) = c.units(), b.units()
        text += f"; in model calls {e_c:.3g}/{n_c:.3g} vs {e_b:.3g}/{n_b:.3g}"
    return text


def evaluate(
    spec: AnalysisSpec,
    state: AnalysisState,
    snapshot: Snapshot | None,
    now: float,
    source_error: str | None = None,
) -> Decision:
    """One evaluation: ``snapshot`` is what the metrics source gave now (None, with
    ``source_error``, when it could not be read). A snapshot of no source at all is no reading
    either: it holds, as an unreadable one does."""
    if state.finished or state.phase == Phase.PAUSED:
        return Decision(state)
    if snapshot is not None and not snapshot.sources:
        snapshot, source_error = None, NO_SOURCE
    if state.phase == Phase.PROMOTED:
        return _promotion(state, snapshot, source_error)
    if snapshot is None:
        held = replace(
            state,
            phase=Phase.HOLDING,
            reason=Reason.METRICS_UNAVAILABLE,
            message=f"Holding: the metrics cannot be read ({source_error or 'no data'})",
        )
        first = state.reason != Reason.METRICS_UNAVAILABLE
        return Decision(held, event=held.message if first else None, warning=True)
    if unapplied := snapshot.unapplied(state.canary_weight, state.baseline_step_weight):
        return _unapplied(state, snapshot, now, unapplied)
    if state.reason in (Reason.METRICS_UNAVAILABLE, Reason.WEIGHTS_NOT_APPLIED):
        resumed = Reason.SHADOWING if state.shadowing else Reason.INCONCLUSIVE
        state = replace(state, phase=Phase.PROGRESSING, reason=resumed)
    # Time counts while the metrics are read (a hold for them leaves it), and by the interval.
    credit = min(max(0.0, now - state.evaluated_at), CREDIT_INTERVALS * spec.interval_seconds)
    state = replace(state, evaluated_at=now, step_seconds=state.step_seconds + credit)
    interval = count(state.sources, snapshot)
    state = replace(state, sources=interval.sources)
    if state.shadowing:
        decision = _shadow_gate(spec, state, interval, now)
    elif state.window is None:
        decision = _warm_up(spec, state, interval, now)
    else:
        decision = _judge(spec, state, interval, now)
    note = interval.note()
    if note and decision.weights is None and not decision.state.finished:
        noted = replace(decision.state, message=f"{decision.state.message}; {note}")
        decision = replace(decision, state=noted)
    return decision


def _promotion(
    state: AnalysisState, snapshot: Snapshot | None, source_error: str | None
) -> Decision:
    """A promotion is complete once every gateway read routes by the promoted weights."""
    promotion = state.promotion or _promotion_in_message(state.message)
    state = replace(state, promotion=promotion)
    if snapshot is None:
        waiting = f"the metrics cannot be read ({source_error or 'no data'})"
    elif unapplied := snapshot.unapplied(state.canary_weight, state.baseline_step_weight):
        waiting = "; ".join(unapplied)
    else:
        done = f"Promoted: {promotion}"
        return Decision(replace(state, routed=True, message=done), event=done)
    return Decision(replace(state, message=f"{PROMOTING} {promotion}{WAITING}{waiting}"))


def _promotion_in_message(message: str) -> str:
    """The promotion of a state stored before ``status.analysis.promotion`` was: what its
    message, the only place such a state held it, says after "Promoting:" and before the wait
    for the gateways. Read for those states alone; every promotion since has the field."""
    return message.split(WAITING, 1)[0].removeprefix(PROMOTING).removeprefix(" ")


def _shadow_gate(
    spec: AnalysisSpec, state: AnalysisState, interval: Interval, now: float
) -> Decision:
    """Before step 1: go on once enough shadow copies agree, roll back once they do not."""
    gate = spec.shadow
    assert gate is not None, "a shadowing state has a shadow gate"
    counted = (state.step_counts or Tally(now)).plus(interval.canary, interval.baseline)
    state = replace(state, step_counts=counted)
    copies = counted.canary.agreement.get("count", 0.0)
    mean = counted.canary.mean_agreement
    seen = f"{copies:.0f} copies compared" + (f", mean agreement {mean:.4f}" if mean else "")
    if mean is not None and copies >= gate.min_copies:
        verdict = (
            f"The canary's answers to {copies:.0f} shadow copies agree with {state.baseline}'s "
            f"{mean:.4f} on average"
        )
        if mean >= gate.min_agreement:
            passed = replace(state, shadowing=False)
            return _to_step(spec, passed, 0, now, f"{verdict}, at least {gate.min_agreement:g}.")
        return rollback(state, Reason.SHADOW_DISAGREES, f"{verdict}, below {gate.min_agreement:g}.")
    if state.step_seconds >= spec.max_seconds:
        message = (
            f"Holding before step 1: {seen} after {spec.max_seconds} s, {gate.min_copies} needed"
        )
        return _hold(state, Reason.INSUFFICIENT_DATA, message)
    message = f"Shadowing: {seen} of {gate.min_copies} needed before step 1"
    return Decision(
        replace(state, phase=Phase.PROGRESSING, reason=Reason.SHADOWING, message=message)
    )


def _unapplied(
    state: AnalysisState, snapshot: Snapshot, now: float, unapplied: list[str]
) -> Decision:
    """Hold while a gateway does not split by the step's weights: its requests are not the
    split being judged, so they count nowhere and the step's time stands still."""
    wanted = f"{state.canary_weight}/{state.baseline_step_weight}"
    why = "; ".join(unapplied)
    held = replace(
        state,
        phase=Phase.HOLDING,
        reason=Reason.WEIGHTS_NOT_APPLIED,
        evaluated_at=now,
        sources=count(state.sources, snapshot).sources,
        message=f"Holding: the step's weights {wanted} are not in force yet ({why})",
    )
    first = state.reason != Reason.WEIGHTS_NOT_APPLIED
    return Decision(held, event=held.message if first else None, warning=first)


def _warm_up(spec: AnalysisSpec, state: AnalysisState, interval: Interval, now: float) -> Decision:
    step = (state.step_counts or Tally(now)).plus(interval.canary, interval.baseline)
    seen = step.canary.requests
    if state.step_seconds >= spec.warmup_seconds and seen >= spec.warmup_requests:
        judging = replace(
            state,
            judging_from=state.step_seconds,
            step_counts=step,
            window=Tally(now),
            checks={name: CheckState(statistics.new_evidence()) for name in spec.checks()},
            reason=Reason.INSUFFICIENT_DATA,
            message=f"Step {state.step + 1}: judging from now on",
        )
        return Decision(judging)
    return Decision(replace(state, step_counts=step, reason=Reason.WARMING_UP))


def _judge(spec: AnalysisSpec, state: AnalysisState, interval: Interval, now: float) -> Decision:
    assert state.window is not None
    canary, baseline = interval.canary, interval.baseline
    step_counts = state.step_counts or Tally(state.window.at)
    # The latency bound comes from the baseline's requests before this interval (the step's,
    # warm-up included): one taken from the same requests it judges would favour the baseline.
    earlier_baseline = step_counts.baseline
    active = [c for c in spec.checks().values() if not c.dry_run]
    alpha = statistics.check_alpha(spec.false_rollback_budget, max(1, len(active)), len(spec.steps))
    checks: dict[str, CheckState] = {}
    for name, check in spec.checks().items():
        previous = state.checks.get(name) or CheckState(statistics.new_evidence())
        bound = previous.bound
        if isinstance(check, ErrorCheck):
            c, b = _errors(canary, check), _errors(baseline, check)
        elif name == LATENCY:
            assert isinstance(check, LatencyCheck)
            bound = statistics.slow_bound(earlier_baseline.buckets, check.quantile)
            c, b = _slow(canary, bound), _slow(baseline, bound)
        else:
            assert isinstance(check, LatencyCheck)
            histogram = _STREAM_HISTOGRAMS[name]
            bound = statistics.slow_bound(histogram(earlier_baseline), check.quantile)
            c, b = (
                _slow_streams(histogram(canary), bound),
                _slow_streams(histogram(baseline), bound),
            )
        updated = statistics.update(previous.evidence, check.max_ratio, c, b)
        verdict = statistics.verdict(updated, alpha, spec.false_promotion_budget)
        checks[name] = CheckState(updated, verdict, bound)
    guard_check = spec.errors or _DEFAULT_ERRORS
    guardrail = statistics.Counts(
        state.guardrail.requests + round(canary.requests),
        state.guardrail.bad + round(canary.errors(guard_check)),
    )
    window = state.window.plus(canary, baseline)
    judged = replace(
        state,
        step_counts=step_counts.plus(canary, baseline),
        window=window,
        checks=checks,
        guardrail=guardrail,
    )
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
            Reason.GUARDRAIL,
            f"The canary failed {guardrail.bad} of {guardrail.requests} requests, above the "
            f"guardrail of {g.max_error_ratio:.0%}.",
        )
    failed = [n for n, c in checks.items() if c.verdict == statistics.FAIL and not _dry(spec, n)]
    if failed:
        return rollback(judged, Reason.CANARY_WORSE, f"The canary is worse: {evidence}.")

    judged_for = state.step_seconds - state.judging_from
    canary_requests = window.canary.requests
    # No evidence, no verdict: a baseline that answered nothing in the window is no comparison,
    # and neither is a stream check before both versions have streamed.
    compared = window.baseline.requests > 0
    unstreamed = [n for n in _STREAM_HISTOGRAMS if n in checks and not _streamed(checks[n])]
    enough = (
        compared
        and not unstreamed
        and judged_for >= spec.min_seconds
        and canary_requests >= spec.min_requests
    )
    passed = all(c.verdict == statistics.PASS or _dry(spec, n) for n, c in checks.items())
    if enough and passed:
        step = spec.steps[state.step]
        why = f"Step {state.step + 1} passed ({evidence})."
        if step.pause:
            return pause(
                judged,
                Reason.STEP_PAUSE,
                f"{why} Paused: `kubectl modelroll analysis resume` goes on to the next step",
            )
        return _to_step(spec, judged, state.step + 1, now, why)
    reason = Reason.INCONCLUSIVE if enough else Reason.INSUFFICIENT_DATA
    if not enough:
        detail = (
            f"{canary_requests:.0f}/{spec.min_requests} canary requests, "
            f"{judged_for:.0f}/{spec.min_seconds} s judged"
        )
        if not compared:
            detail = f"{detail}, no baseline requests"
        if unstreamed:
            detail = f"{detail}, no streams of both versions yet for {', '.join(unstreamed)}"
    else:
        detail = "the evidence is not yet clear either way"
    if state.step_seconds >= spec.max_seconds:
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
        return _hold(judged, reason, message)
    message = f"Step {state.step + 1}: {detail} ({evidence})"
    return Decision(replace(judged, phase=Phase.PROGRESSING, reason=reason, message=message))


def _hold(state: AnalysisState, reason: Reason, message: str) -> Decision:
    """Hold at ``maxSeconds`` without a verdict: a warning Event the first time only."""
    first = state.phase != Phase.HOLDING
    held = replace(state, phase=Phase.HOLDING, reason=reason, message=message)
    return Decision(held, event=message if first else None, warning=first)


def _errors(counts: VersionCounts, check: ErrorCheck) -> statistics.Counts:
    """An interval's requests and errors, and the model calls behind them."""
    return statistics.Counts(
        round(counts.requests),
        round(counts.errors(check)),
        counts.call_count,
        counts.bad_calls(check),
    )


def _slow(counts: VersionCounts, bound: float | None) -> statistics.Counts:
    """An interval's requests and those slower than ``bound`` (none without a finite bound),
    and the model calls behind them."""
    if bound is None or math.isinf(bound):
        return statistics.Counts(round(counts.requests), 0, counts.call_count, 0.0)
    return statistics.Counts(
        round(counts.requests),
        round(statistics.over(counts.buckets, bound)),
        counts.call_count,
        statistics.over(counts.call_buckets, bound),
    )


_STREAM_HISTOGRAMS: dict[str, Callable[[VersionCounts], Histogram]] = {
    TTFT: lambda counts: counts.ttft_buckets,
    TPOT: lambda counts: counts.tpot_buckets,
}
"""The histogram each stream check judges."""


def _slow_streams(buckets: Histogram, bound: float | None) -> statistics.Counts:
    """An interval's streams (those the histogram counted) and those slower than ``bound``: a
    stream is a model call of its own."""
    total = buckets[-1][1] if buckets else 0.0
    slow = 0.0 if bound is None or math.isinf(bound) else statistics.over(buckets, bound)
    return statistics.Counts(round(total), round(slow), total, slow)


def _streamed(check: CheckState) -> bool:
    """Whether both versions' streams have been judged by a stream check."""
    return check.evidence.canary.requests > 0 and check.evidence.baseline.requests > 0


def _dry(spec: AnalysisSpec, name: str) -> bool:
    check = spec.checks().get(name)
    return check is not None and check.dry_run

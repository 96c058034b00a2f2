"""The state of a canary analysis, as the operator keeps it in the canary's ``status.analysis``
(:class:`AnalysisState`), and its serialization: an operator restarted mid-step reads it back and
goes on from there."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import statistics
from .counts import Histogram, Tally, VersionCounts
from .phases import FINISHED, WARMING_UP

MESSAGE_MAX = 32768
"""The longest ``status.analysis.message``, in characters: the CRD's maxLength (and
metav1.Condition's, whose messages the canary's conditions copy). A longer one is cut, so that
a long reason (many sources not read, say) never gets the status patch refused."""


@dataclass(frozen=True)
class CheckState:
    evidence: statistics.Evidence
    verdict: str = statistics.INCONCLUSIVE
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
            "statistic": float(f"{statistics.statistic(self.evidence):.4g}"),
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
            evidence=statistics.Evidence.from_dict(raw),
            verdict=str(raw.get("verdict") or statistics.INCONCLUSIVE),
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
    evaluated_at: float
    """When this step's time was last counted (unix seconds)."""
    baseline: str
    baseline_weight: int
    """The baseline's weight before the analysis: restored on rollback."""
    canary_weight: int
    """The weights this analysis last decided on; any others in the spec were set by hand."""
    baseline_step_weight: int
    reason: str = WARMING_UP
    message: str = ""
    sources: Mapping[str, Tally] = field(default_factory=dict)
    """Each source's counters at its last reading in this step (the next deltas start there)."""
    step_counts: Tally | None = None
    """What the sources counted in this step (warm-up included), since its first reading."""
    window: Tally | None = None
    """What the sources counted in the judged intervals, since judging started (None: warming
    up)."""
    checks: Mapping[str, CheckState] = field(default_factory=dict)
    guardrail: statistics.Counts = field(default_factory=lambda: statistics.Counts(0, 0))
    """The canary's judged requests and errors in this step (for the guardrail)."""
    spec_hash: str = ""
    """The hash of the spec.analysis this state belongs to: another one starts anew."""
    applied: bool = True
    """Whether the weights above are written (a state is saved before its weights are, so an
    operator stopped in between writes them on its return instead of taking them for a change
    made by hand)."""
    last_command: str = ""
    """The last command annotation handled (commands carry a nonce: each is done once)."""
    step_seconds: float = 0.0
    """Seconds this step has run, as the analysis counts them (:data:`CREDIT_INTERVALS`): the
    warm-up, ``minSeconds`` and ``maxSeconds`` are measured in these, not on the wall clock."""
    judging_from: float = 0.0
    """The ``step_seconds`` at which judging started."""
    shadowing: bool = False
    """Before step 1, judged on shadow copies alone (spec.analysis.shadow): ``step`` is 0 and
    the canary's weight 0 until the gate passes."""
    routed: bool = True
    """Whether every gateway read routes by these weights; False from a promotion until they
    do (a promotion is complete only then)."""

    @property
    def finished(self) -> bool:
        """Over: rolled back, or promoted with every gateway routing by the promoted weights."""
        return self.phase in FINISHED and self.routed

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "step": self.step + 1,  # as users count steps (and kubectl get shows it)
            "stepStartedAt": round(self.step_started, 3),
            "evaluatedAt": round(self.evaluated_at, 3),
            "stepSeconds": round(self.step_seconds, 3),
            "judgingFromSeconds": round(self.judging_from, 3),
            "baseline": self.baseline,
            "baselineWeight": self.baseline_weight,
            "canaryWeight": self.canary_weight,
            "baselineStepWeight": self.baseline_step_weight,
            "reason": self.reason,
            "message": clip(self.message, MESSAGE_MAX),
            "checks": [{"name": n, **c.to_dict()} for n, c in sorted(self.checks.items())],
            "guardrail": {"requests": self.guardrail.requests, "bad": self.guardrail.bad},
            "specHash": self.spec_hash,
            "applied": self.applied,
            "lastCommand": self.last_command,
            "shadowing": self.shadowing,
            "routed": self.routed,
        }
        out["sources"] = [{"name": n, **_tally_to_dict(t)} for n, t in sorted(self.sources.items())]
        # Every key, null when unset: a merge patch removes what a null names.
        # A step's sums without their calls: only a source's own readings need them (deltas).
        out["stepCounts"] = (
            _tally_to_dict(self.step_counts, calls=False) if self.step_counts else None
        )
        out["window"] = _tally_to_dict(self.window, calls=False) if self.window else None
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AnalysisState | None:
        """The state a status holds; None if it holds none (or not one this code can read).

        A state without a ``window`` is warming up: its checks, if any, are dropped, and one
        without ``sources`` takes its next reading as a first one. A status that holds neither
        (only summed counters, ``last`` and ``windowStart``) so starts its step's window again.
        One without ``stepSeconds`` counted time on the wall clock and pinned requests with the
        others: its step's time starts again from 0, and its sources are dropped.
        """
        try:
            guard = raw.get("guardrail") or {}
            window = _tally_from_dict(raw.get("window"))
            counted = raw.get("stepSeconds") is not None
            sources = {
                str(s["name"]): _tally_from_dict(s) or Tally(0.0)
                for s in (raw.get("sources") or [] if counted else [])
            }
            started = float(raw["stepStartedAt"])
            return cls(
                phase=str(raw["phase"]),
                step=int(raw["step"]) - 1,
                step_started=started,
                evaluated_at=float(raw.get("evaluatedAt") or started),
                step_seconds=float(raw.get("stepSeconds") or 0.0),
                judging_from=float(raw.get("judgingFromSeconds") or 0.0),
                baseline=str(raw["baseline"]),
                baseline_weight=int(raw["baselineWeight"]),
                canary_weight=int(raw["canaryWeight"]),
                baseline_step_weight=int(raw["baselineStepWeight"]),
                reason=str(raw.get("reason") or ""),
                message=str(raw.get("message") or ""),
                sources=sources,
                step_counts=_tally_from_dict(raw.get("stepCounts")),
                window=window,
                checks={
                    str(c["name"]): CheckState.from_dict(c)
                    for c in (raw.get("checks") or [] if window else [])
                },
                guardrail=statistics.Counts(
                    int(guard.get("requests", 0)) if window else 0,
                    int(guard.get("bad", 0)) if window else 0,
                ),
                spec_hash=str(raw.get("specHash") or ""),
                applied=bool(raw.get("applied", True)),
                last_command=str(raw.get("lastCommand") or ""),
                shadowing=bool(raw.get("shadowing", False)),
                routed=bool(raw.get("routed", True)),
            )
        except (KeyError, TypeError, ValueError):
            return None


def clip(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters ending in "…" if it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def counts_to_dict(counts: VersionCounts, calls: bool = True) -> dict[str, Any]:
    """A version's counters as the CR status holds them; ``calls=False`` leaves out the model
    calls.

    Lists, not maps keyed by code: the state is written with JSON merge patches, which
    would keep keys a new map lacks."""
    out: dict[str, Any] = {
        "codes": [{"code": c, "count": _num(n)} for c, n in sorted(counts.codes.items())],
        "buckets": _buckets_out(counts.buckets),
    }
    # A source's counters only: summed deltas are judged ones, without either.
    if counts.pinned:
        out["pinned"] = [{"code": c, "count": _num(n)} for c, n in sorted(counts.pinned.items())]
    if counts.outcomes:
        out["outcomes"] = [
            {"outcome": o, "count": _num(n)} for o, n in sorted(counts.outcomes.items())
        ]
    if counts.calls and calls:
        out["calls"] = [{"code": c, "count": _num(n)} for c, n in sorted(counts.calls.items())]
    if counts.call_buckets and calls:
        out["callBuckets"] = _buckets_out(counts.call_buckets)
    if counts.ttft_buckets:
        out["ttftBuckets"] = _buckets_out(counts.ttft_buckets)
    if counts.tpot_buckets:
        out["tpotBuckets"] = _buckets_out(counts.tpot_buckets)
    if counts.agreement:
        out["agreement"] = {k: _num(n) for k, n in sorted(counts.agreement.items())}
    return out


def _counts_from_dict(raw: Mapping[str, Any]) -> VersionCounts:
    codes = {str(c["code"]): float(c["count"]) for c in raw.get("codes") or []}
    pinned = {str(c["code"]): float(c["count"]) for c in raw.get("pinned") or []}
    outcomes = {str(o["outcome"]): float(o["count"]) for o in raw.get("outcomes") or []}
    calls = {str(c["code"]): float(c["count"]) for c in raw.get("calls") or []}
    return VersionCounts(
        codes=codes,
        buckets=_buckets_in(raw.get("buckets")),
        pinned=pinned,
        outcomes=outcomes,
        calls=calls,
        call_buckets=_buckets_in(raw.get("callBuckets")),
        ttft_buckets=_buckets_in(raw.get("ttftBuckets")),
        tpot_buckets=_buckets_in(raw.get("tpotBuckets")),
        agreement={str(k): float(n) for k, n in (raw.get("agreement") or {}).items()},
    )


def _tally_to_dict(tally: Tally, calls: bool = True) -> dict[str, Any]:
    return {
        "at": round(tally.at, 3),
        "canary": counts_to_dict(tally.canary, calls),
        "baseline": counts_to_dict(tally.baseline, calls),
    }


def _tally_from_dict(raw: Mapping[str, Any] | None) -> Tally | None:
    if not raw:
        return None
    return Tally(
        at=float(raw.get("at") or 0.0),
        canary=_counts_from_dict(raw.get("canary") or {}),
        baseline=_counts_from_dict(raw.get("baseline") or {}),
    )


def _buckets_out(buckets: Histogram) -> list[dict[str, Any]]:
    return [{"le": _le(le), "count": _num(n)} for le, n in buckets]


def _buckets_in(raw: Any) -> Histogram:
    return tuple((float(b["le"]), float(b["count"])) for b in raw or [])


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes it (``float()`` reads it back, "+Inf" included)."""
    return "+Inf" if math.isinf(bound) else repr(bound)

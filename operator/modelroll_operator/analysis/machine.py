"""A canary analysis as a pure state machine: what the operator does at each evaluation.

Everything the analysis knows lives in :class:`AnalysisState`, which the operator keeps in the
canary's ``status.analysis``: an operator restarted mid-step reads it back and goes on from there.
Every decision is a function of (spec, state, the counters read now, the time), so the operator,
the tests and the simulation in ``modelroll-bench analysis`` run the same code.

A step: the operator writes its weights (canary ``w``, baseline ``100 - w``, scaled to the
baseline's weight when that was above 100). The first ``warmupSeconds`` (and ``warmupRequests``
canary requests) are not judged. Then every interval the deltas of both versions' counters feed
each check (statistics.py): taken per source (a gateway replica) and summed (:func:`count`), so that
a replica missing from a reading, restarted or new never passes its history off as one
interval's counts. A check that fails rolls back at once; the step passes when every check
passes after ``minSeconds`` and ``minRequests``; at ``maxSeconds`` without a verdict the
``onInconclusive`` policy applies (Hold: the weights stay, the analysis goes on and says why).
Those seconds are counted by the evaluations (:data:`CREDIT_INTERVALS`), not read off the wall
clock. Only requests routed by weight are judged, and a stream that ended badly is an error
whatever its status line said (:meth:`VersionCounts.judged`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from . import statistics
from .spec import (
    LATENCY,
    PROMOTE,
    ROLLBACK,
    STREAM_ERROR,
    TPOT,
    TTFT,
    AnalysisSpec,
    ErrorCheck,
    LatencyCheck,
)

_K = TypeVar("_K")

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

PROMOTING = "Promoting:"
"""How a promotion's message starts until every gateway routes by it."""
WAITING = " Waiting for every gateway to route by it: "

_DEFAULT_ERRORS = ErrorCheck(max_ratio=1.5)
"""What counts as an error for the guardrail when the spec has no error check."""


SOURCE_TTL_S = 300.0
"""Seconds a source that is not read is remembered (default 300): one back within them counts
what it counted since its last reading; one gone longer is forgotten, and if it comes back its
next reading is a first one. Long enough for a gateway pod's restart or a readiness blip, short
enough that replicas scaled away do not stay in ``status.analysis``."""
CREDIT_INTERVALS = 2
"""An evaluation adds to a step's time what passed since the last one, at most this many
intervals (default 2): room for a late tick, while a wall clock that jumps ahead (or an
operator that was down) cannot skip a step's warm-up, ``minSeconds`` or ``maxSeconds``."""
MAX_SOURCES = 64
"""At most this many sources are remembered (the most recently read): a bound on the size of
``status.analysis``, far above a gateway's replica count."""
MESSAGE_MAX = 32768
"""The longest ``status.analysis.message``, in characters: the CRD's maxLength (and
metav1.Condition's, whose messages the canary's conditions copy). A longer one is cut, so that
a long reason (many sources not read, say) never gets the status patch refused."""
NO_SOURCE = "no source had a series of the two versions"
"""Why a reading that found no source at all holds."""


STREAM_OUTCOMES_NOT_FAILED = ("completed", "whole", "client_disconnect", "client_stalled")
"""Stream outcomes (modelroll_gateway_llm_requests_total) that are no failure of the version:
it answered in full, or the client went away or took nothing. Every other outcome (an error
event, a stream that broke off or was cut, a version unreachable or silent) is a failure."""


@dataclass(frozen=True)
class VersionCounts:
    """One version's counters: cumulative, as one source exports them, or the sum of deltas."""

    codes: Mapping[str, float] = field(default_factory=dict)
    """Requests routed by weight, or by a cohort key within its budget, by status code (the
    judged ones)."""
    buckets: tuple[tuple[float, float], ...] = ()
    """Their latency histogram: cumulative (le, count), ascending, the last le is +Inf."""
    pinned: Mapping[str, float] = field(default_factory=dict)
    """Requests pinned to the version by header, or routed by a cohort key past its budget, by
    status code: never judged."""
    outcomes: Mapping[str, float] = field(default_factory=dict)
    """OpenAI requests by how they ended, pinned ones included (the gateway does not tell them
    apart there): only :meth:`judged` reads them."""
    calls: Mapping[str, float] = field(default_factory=dict)
    """The model calls behind the weighted requests, by status code: each request is 1/n of a
    call that answered n requests together (modelroll_gateway_model_calls_total). After
    :meth:`judged`, a source that does not export them has one call per request."""
    call_buckets: tuple[tuple[float, float], ...] = ()
    """The latency histogram counted the same way (the model_call_duration histogram)."""
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    """The weighted generation streams' time to first token, as a cumulative histogram; read
    only for a spec with a stream check (AnalysisSpec.judges_streams)."""
    tpot_buckets: tuple[tuple[float, float], ...] = ()
    """Their time per output token, likewise."""
    agreement: Mapping[str, float] = field(default_factory=dict)
    """The canary's shadow copies compared with the baseline's answers: the agreement
    histogram's ``sum`` and ``count``; read only for a spec with a shadow gate."""

    @property
    def mean_agreement(self) -> float | None:
        count = self.agreement.get("count", 0.0)
        return self.agreement.get("sum", 0.0) / count if count else None

    @property
    def requests(self) -> float:
        return sum(self.codes.values())

    def errors(self, check: ErrorCheck) -> float:
        return sum(n for code, n in self.codes.items() if check.is_error(code))

    @property
    def call_count(self) -> float:
        return sum(self.calls.values())

    def bad_calls(self, check: ErrorCheck) -> float:
        return sum(n for code, n in self.calls.items() if check.is_error(code))

    def _maps(self) -> tuple[Mapping[str, float], ...]:
        return (self.codes, self.pinned, self.outcomes, self.calls, self.agreement)

    def _histograms(self) -> tuple[tuple[tuple[float, float], ...], ...]:
        return (self.buckets, self.call_buckets, self.ttft_buckets, self.tpot_buckets)

    def lacks_series_of(self, earlier: VersionCounts) -> bool:
        """Whether a series (a code, an outcome, a bucket) that ``earlier`` has is missing."""
        return any(
            not old.keys() <= new.keys()
            for new, old in zip(self._maps(), earlier._maps(), strict=True)
        ) or any(
            not {le for le, _ in old} <= {le for le, _ in new}
            for new, old in zip(self._histograms(), earlier._histograms(), strict=True)
        )

    def went_down_since(self, earlier: VersionCounts) -> bool:
        """Whether a series is lower than in ``earlier`` (the same source, read before)."""
        return any(
            n < old.get(k, n)
            for new, old in zip(self._maps(), earlier._maps(), strict=True)
            for k, n in new.items()
        ) or any(
            n < dict(old).get(le, n)
            for new, old in zip(self._histograms(), earlier._histograms(), strict=True)
            for le, n in new
        )

    def increase(self, earlier: VersionCounts) -> VersionCounts:
        """What each series counted since ``earlier`` (the same source, read before), as
        Prometheus's increase() takes it: the difference; for a series that went down (its
        process restarted) or that ``earlier`` lacks (created since), its value now."""
        return VersionCounts(
            codes=_increases(self.codes, earlier.codes),
            buckets=_bucket_increases(self.buckets, earlier.buckets),
            pinned=_increases(self.pinned, earlier.pinned),
            outcomes=_increases(self.outcomes, earlier.outcomes),
            calls=_increases(self.calls, earlier.calls),
            call_buckets=_bucket_increases(self.call_buckets, earlier.call_buckets),
            ttft_buckets=_bucket_increases(self.ttft_buckets, earlier.ttft_buckets),
            tpot_buckets=_bucket_increases(self.tpot_buckets, earlier.tpot_buckets),
            agreement=_increases(self.agreement, earlier.agreement),
        )

    def judged(self) -> VersionCounts:
        """One source's deltas as the checks judge them: the weighted requests, with the
        streams that ended badly under a 200 moved from "200" to STREAM_ERROR.

        The stream outcomes count pinned requests too, and count the streams the gateway
        answered with a 502 or 504 itself, which ``codes`` has as errors already. So the
        streams moved are a lower bound: the failed outcomes less the weighted 5xx and every
        pinned request, at most the 200s. Pinned requests can so hide a stream failure, never
        make one, and no request is counted twice.

        A stream is a model call of its own (the gateway counts it as one), so the streams moved
        are moved in ``calls`` too; a source without ``calls`` gets one call per request."""
        failed = sum(n for o, n in self.outcomes.items() if o not in STREAM_OUTCOMES_NOT_FAILED)
        server_errors = sum(n for c, n in self.codes.items() if c.startswith("5"))
        moved = max(0.0, failed - server_errors - sum(self.pinned.values()))
        return VersionCounts(
            codes=_moved(self.codes, moved),
            buckets=self.buckets,
            calls=_moved(self.calls or self.codes, moved),
            call_buckets=self.call_buckets or self.buckets,
            ttft_buckets=self.ttft_buckets,
            tpot_buckets=self.tpot_buckets,
            agreement=self.agreement,
        )

    def plus(self, other: VersionCounts) -> VersionCounts:
        """Both counts together: two sources' deltas, or two intervals'."""
        return VersionCounts(
            codes=_sum(self.codes, other.codes),
            buckets=_bucket_sum(self.buckets, other.buckets),
            pinned=_sum(self.pinned, other.pinned),
            outcomes=_sum(self.outcomes, other.outcomes),
            calls=_sum(self.calls, other.calls),
            call_buckets=_bucket_sum(self.call_buckets, other.call_buckets),
            ttft_buckets=_bucket_sum(self.ttft_buckets, other.ttft_buckets),
            tpot_buckets=_bucket_sum(self.tpot_buckets, other.tpot_buckets),
            agreement=_sum(self.agreement, other.agreement),
        )

    def to_dict(self, calls: bool = True) -> dict[str, Any]:
        """JSON for the CR status; ``calls=False`` leaves out the model calls.

        Lists, not maps keyed by code: the state is written with JSON merge patches, which
        would keep keys a new map lacks."""
        out: dict[str, Any] = {
            "codes": [{"code": c, "count": _num(n)} for c, n in sorted(self.codes.items())],
            "buckets": _buckets_out(self.buckets),
        }
        # A source's counters only: summed deltas are judged ones, without either.
        if self.pinned:
            out["pinned"] = [{"code": c, "count": _num(n)} for c, n in sorted(self.pinned.items())]
        if self.outcomes:
            out["outcomes"] = [
                {"outcome": o, "count": _num(n)} for o, n in sorted(self.outcomes.items())
            ]
        if self.calls and calls:
            out["calls"] = [{"code": c, "count": _num(n)} for c, n in sorted(self.calls.items())]
        if self.call_buckets and calls:
            out["callBuckets"] = _buckets_out(self.call_buckets)
        if self.ttft_buckets:
            out["ttftBuckets"] = _buckets_out(self.ttft_buckets)
        if self.tpot_buckets:
            out["tpotBuckets"] = _buckets_out(self.tpot_buckets)
        if self.agreement:
            out["agreement"] = {k: _num(n) for k, n in sorted(self.agreement.items())}
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> VersionCounts:
        codes = {str(c["code"]): float(c["count"]) for c in raw.get("codes") or []}
        pinned = {str(c["code"]): float(c["count"]) for c in raw.get("pinned") or []}
        outcomes = {str(o["outcome"]): float(o["count"]) for o in raw.get("outcomes") or []}
        calls = {str(c["code"]): float(c["count"]) for c in raw.get("calls") or []}
        return cls(
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


def _increases(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: _increase(n, before.get(k)) for k, n in now.items()}


def _sum(a: Mapping[_K, float], b: Mapping[_K, float]) -> dict[_K, float]:
    out = dict(a)
    for k, n in b.items():
        out[k] = out.get(k, 0.0) + n
    return out


_Histogram = tuple[tuple[float, float], ...]


def _bucket_increases(now: _Histogram, before: _Histogram) -> _Histogram:
    earlier = dict(before)
    return tuple((le, _increase(n, earlier.get(le))) for le, n in now)


def _bucket_sum(a: _Histogram, b: _Histogram) -> _Histogram:
    return tuple(sorted(_sum(dict(a), dict(b)).items()))


def _moved(codes: Mapping[str, float], streams: float) -> dict[str, float]:
    """``codes`` with up to ``streams`` of its 200s moved to STREAM_ERROR (streams that ended
    badly under a 200)."""
    ok = codes.get("200", 0.0)
    moved = min(ok, streams)
    out = {c: n for c, n in codes.items() if c != STREAM_ERROR}
    if moved:
        out["200"] = ok - moved
        out[STREAM_ERROR] = codes.get(STREAM_ERROR, 0.0) + moved
    return out


def _buckets_out(buckets: _Histogram) -> list[dict[str, Any]]:
    return [{"le": _le(le), "count": _num(n)} for le, n in buckets]


def _buckets_in(raw: Any) -> _Histogram:
    return tuple((float(b["le"]), float(b["count"])) for b in raw or [])


def _increase(now: float, before: float | None) -> float:
    return now if before is None or now < before else now - before


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes it (``float()`` reads it back, "+Inf" included)."""
    return "+Inf" if math.isinf(bound) else repr(bound)


EMPTY = VersionCounts()


@dataclass(frozen=True)
class Tally:
    """Both versions' counters and a time: a source's cumulative counters as read at ``at``,
    or what the per-source deltas summed to since ``at``."""

    at: float
    canary: VersionCounts = EMPTY
    baseline: VersionCounts = EMPTY

    def plus(self, canary: VersionCounts, baseline: VersionCounts) -> Tally:
        return Tally(self.at, self.canary.plus(canary), self.baseline.plus(baseline))

    def to_dict(self, calls: bool = True) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "canary": self.canary.to_dict(calls),
            "baseline": self.baseline.to_dict(calls),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> Tally | None:
        if not raw:
            return None
        return cls(
            at=float(raw.get("at") or 0.0),
            canary=VersionCounts.from_dict(raw.get("canary") or {}),
            baseline=VersionCounts.from_dict(raw.get("baseline") or {}),
        )


@dataclass(frozen=True)
class Split:
    """The weights a source routes the canary and its baseline by (None: it routes none)."""

    canary: float | None
    baseline: float | None

    def __str__(self) -> str:
        return "/".join("none" if w is None else f"{w:g}" for w in (self.canary, self.baseline))


@dataclass(frozen=True)
class Snapshot:
    """One reading of the metrics: each source's cumulative counters, by the source's name (a
    gateway pod, ``pod/<name>``, or what Prometheus keeps for one), and the weights each routes
    by (none known: nothing to verify)."""

    at: float
    sources: Mapping[str, Tally]
    splits: Mapping[str, Split] = field(default_factory=dict)

    def unapplied(self, canary: int, baseline: int) -> list[str]:
        """The sources that do not route by the weights ``canary`` and ``baseline``."""
        wanted = Split(canary, baseline)
        return [
            f"{name} routes by {split}" for name, split in self.splits.items() if split != wanted
        ]


@dataclass(frozen=True)
class Interval:
    """What the sources counted between two readings, and the sources to compare with next."""

    canary: VersionCounts
    baseline: VersionCounts
    sources: Mapping[str, Tally]
    unread: tuple[str, ...] = ()
    """Sources of the last reading that this one lacks."""
    incomplete: tuple[str, ...] = ()
    """Sources read without a series they had, and with none lower: left for a later reading."""

    def note(self) -> str:
        """The interval's gaps in words ("" if none)."""
        notes = [f"gateway {n} not read this interval" for n in self.unread]
        notes += [f"gateway {n} read without some of its series" for n in self.incomplete]
        return "; ".join(notes)


def count(last: Mapping[str, Tally], snapshot: Snapshot) -> Interval:
    """The interval from the sources' last readings to ``snapshot``: the sum of each source's
    own deltas. A source new since then (or in the step) adds nothing: its reading is where its
    deltas start. A source missing from the snapshot adds nothing now and, back within
    :data:`SOURCE_TTL_S`, what it counted since its own last reading."""
    canary, baseline = EMPTY, EMPTY
    sources: dict[str, Tally] = {}
    incomplete: list[str] = []
    for name, now in sorted(snapshot.sources.items()):
        before = last.get(name)
        if before is None:
            sources[name] = now
            continue
        restarted = now.canary.went_down_since(before.canary) or now.baseline.went_down_since(
            before.baseline
        )
        partial = now.canary.lacks_series_of(before.canary) or now.baseline.lacks_series_of(
            before.baseline
        )
        if partial and not restarted:
            # Not a restart (that would take some series lower): a partial answer. The source
            # waits for a whole reading, so that its series' deltas span the same time.
            if snapshot.at - before.at > SOURCE_TTL_S:
                sources[name] = now  # what it lacks is gone for good: start again from here
            else:
                sources[name] = before
                incomplete.append(name)
            continue
        canary = canary.plus(now.canary.increase(before.canary).judged())
        baseline = baseline.plus(now.baseline.increase(before.baseline).judged())
        sources[name] = now
    unread = sorted(
        n for n, t in last.items() if n not in sources and snapshot.at - t.at <= SOURCE_TTL_S
    )
    for name in unread:
        sources[name] = last[name]
    if len(sources) > MAX_SOURCES:
        newest = sorted(sources, key=lambda n: sources[n].at, reverse=True)[:MAX_SOURCES]
        sources = {n: sources[n] for n in sorted(newest)}
    return Interval(canary, baseline, sources, tuple(unread), tuple(incomplete))


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
        out["sources"] = [{"name": n, **t.to_dict()} for n, t in sorted(self.sources.items())]
        # Every key, null when unset: a merge patch removes what a null names.
        # A step's sums without their calls: only a source's own readings need them (deltas).
        out["stepCounts"] = self.step_counts.to_dict(calls=False) if self.step_counts else None
        out["window"] = self.window.to_dict(calls=False) if self.window else None
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
            window = Tally.from_dict(raw.get("window"))
            counted = raw.get("stepSeconds") is not None
            sources = {
                str(s["name"]): Tally.from_dict(s) or Tally(0.0)
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
                step_counts=Tally.from_dict(raw.get("stepCounts")),
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
        phase=PROGRESSING,
        step=0,
        step_started=now,
        evaluated_at=now,
        baseline=baseline,
        baseline_weight=baseline_weight,
        canary_weight=weights.canary,
        baseline_step_weight=weights.baseline,
        reason=SHADOWING if shadowing else WARMING_UP,
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
        done = replace(
            _fresh_step(state, now),
            phase=PROMOTED,
            step=len(spec.steps) - 1,
            canary_weight=weights.canary,
            baseline_step_weight=weights.baseline,
            reason=PROMOTED,
            message=f"{PROMOTING} canary weight {weights.canary}, baseline {state.baseline} 0. "
            + why,
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
        evaluated_at=now,
        step_seconds=0.0,
        judging_from=0.0,
        sources={},
        step_counts=None,
        window=None,
        checks={},
        guardrail=statistics.Counts(0, 0),
    )


def clip(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters ending in "…" if it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    if state.finished or state.phase == PAUSED:
        return Decision(state)
    if snapshot is not None and not snapshot.sources:
        snapshot, source_error = None, NO_SOURCE
    if state.phase == PROMOTED:
        return _promotion(state, snapshot, source_error)
    if snapshot is None:
        held = replace(
            state,
            phase=HOLDING,
            reason=METRICS_UNAVAILABLE,
            message=f"Holding: the metrics cannot be read ({source_error or 'no data'})",
        )
        first = state.reason != METRICS_UNAVAILABLE
        return Decision(held, event=held.message if first else None, warning=True)
    if unapplied := snapshot.unapplied(state.canary_weight, state.baseline_step_weight):
        return _unapplied(state, snapshot, now, unapplied)
    if state.reason in (METRICS_UNAVAILABLE, WEIGHTS_NOT_APPLIED):
        resumed = SHADOWING if state.shadowing else INCONCLUSIVE
        state = replace(state, phase=PROGRESSING, reason=resumed)
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
    decided = state.message.split(WAITING, 1)[0]
    if snapshot is None:
        waiting = f"the metrics cannot be read ({source_error or 'no data'})"
    elif unapplied := snapshot.unapplied(state.canary_weight, state.baseline_step_weight):
        waiting = "; ".join(unapplied)
    else:
        done = "Promoted:" + decided.removeprefix(PROMOTING)
        return Decision(replace(state, routed=True, message=done), event=done)
    return Decision(replace(state, message=f"{decided}{WAITING}{waiting}"))


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
        return rollback(state, SHADOW_DISAGREES, f"{verdict}, below {gate.min_agreement:g}.")
    if state.step_seconds >= spec.max_seconds:
        message = (
            f"Holding before step 1: {seen} after {spec.max_seconds} s, {gate.min_copies} needed"
        )
        return _hold(state, INSUFFICIENT_DATA, message)
    message = f"Shadowing: {seen} of {gate.min_copies} needed before step 1"
    return Decision(replace(state, phase=PROGRESSING, reason=SHADOWING, message=message))


def _unapplied(
    state: AnalysisState, snapshot: Snapshot, now: float, unapplied: list[str]
) -> Decision:
    """Hold while a gateway does not split by the step's weights: its requests are not the
    split being judged, so they count nowhere and the step's time stands still."""
    wanted = f"{state.canary_weight}/{state.baseline_step_weight}"
    why = "; ".join(unapplied)
    held = replace(
        state,
        phase=HOLDING,
        reason=WEIGHTS_NOT_APPLIED,
        evaluated_at=now,
        sources=count(state.sources, snapshot).sources,
        message=f"Holding: the step's weights {wanted} are not in force yet ({why})",
    )
    first = state.reason != WEIGHTS_NOT_APPLIED
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
            reason=INSUFFICIENT_DATA,
            message=f"Step {state.step + 1}: judging from now on",
        )
        return Decision(judging)
    return Decision(replace(state, step_counts=step, reason=WARMING_UP))


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
            GUARDRAIL,
            f"The canary failed {guardrail.bad} of {guardrail.requests} requests, above the "
            f"guardrail of {g.max_error_ratio:.0%}.",
        )
    failed = [n for n, c in checks.items() if c.verdict == statistics.FAIL and not _dry(spec, n)]
    if failed:
        return rollback(judged, CANARY_WORSE, f"The canary is worse: {evidence}.")

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
    return Decision(replace(judged, phase=PROGRESSING, reason=reason, message=message))


def _hold(state: AnalysisState, reason: str, message: str) -> Decision:
    """Hold at ``maxSeconds`` without a verdict: a warning Event the first time only."""
    first = state.phase != HOLDING
    held = replace(state, phase=HOLDING, reason=reason, message=message)
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


_STREAM_HISTOGRAMS: dict[str, Callable[[VersionCounts], _Histogram]] = {
    TTFT: lambda counts: counts.ttft_buckets,
    TPOT: lambda counts: counts.tpot_buckets,
}
"""The histogram each stream check judges."""


def _slow_streams(buckets: _Histogram, bound: float | None) -> statistics.Counts:
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

"""A version's counters and their algebra: one source's readings, the deltas between two, their
sums, and the interval a reading of every source adds up to (:func:`count`).

The deltas are taken per source (a gateway replica) and summed, so that a replica missing from a
reading, restarted or new never passes its history off as one interval's counts. Only requests
routed by weight are judged, and a stream that ended badly is an error whatever its status line
said (:meth:`VersionCounts.judged`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ..schema import api
from . import shapes
from .shapes import Histogram
from .spec import STREAM_ERROR, ErrorCheck

_K = TypeVar("_K")

SOURCE_TTL_S = 300.0
"""Seconds a source that is not read is remembered (default 300): one back within them counts
what it counted since its last reading; one gone longer is forgotten, and if it comes back its
next reading is a first one. Long enough for a gateway pod's restart or a readiness blip, short
enough that replicas scaled away do not stay in ``status.analysis``."""
MAX_SOURCES = 64
"""At most this many sources are remembered (the most recently read): a bound on the size of
``status.analysis``, far above a gateway's replica count."""

STREAM_OUTCOMES_NOT_FAILED = ("completed", "whole", "client_disconnect", "client_stalled")
"""Stream outcomes (modelroll_gateway_llm_requests_total) that are no failure of the version:
it answered in full, or the client went away or took nothing. Every other outcome (an error
event, a stream that broke off or was cut, a version unreachable or silent) is a failure."""


@dataclass(frozen=True)
class VersionCounts:
    """One version's counters: cumulative, as one source exports them, or the sum of deltas.
    Declared as status.analysis stores them (shapes.py)."""

    codes: Mapping[str, float] = shapes.counted_field(
        "Requests by status code (cumulative, as this source exports them).",
        "code",
        "The status code, or stream_error (a stream that ended badly under a 200).",
        "Requests answered with it.",
    )
    """Requests routed by weight, or by a cohort key within its budget, by status code (the
    judged ones)."""
    buckets: Histogram = shapes.histogram_field(
        "The latency histogram: cumulative counts by upper bound.", "Requests at most this slow."
    )
    """Their latency histogram: cumulative (le, count), ascending, the last le is +Inf."""
    pinned: Mapping[str, float] = shapes.counted_field(
        "Requests pinned to the version by header, by status code (cumulative); never judged.",
        "code",
        "The status code.",
        "Pinned requests answered with it.",
        omit_empty=True,
    )
    """Requests pinned to the version by header, or routed by a cohort key past its budget, by
    status code: never judged."""
    outcomes: Mapping[str, float] = shapes.counted_field(
        "OpenAI requests by how they ended (cumulative, pinned ones included).",
        "outcome",
        "The outcome (modelroll_gateway_llm_requests_total's label).",
        "Requests that ended so.",
        omit_empty=True,
    )
    """OpenAI requests by how they ended, pinned ones included (the gateway does not tell them
    apart there): only :meth:`judged` reads them."""
    calls: Mapping[str, float] = shapes.counted_field(
        "The model calls behind the requests, by status code: each request adds 1/n, n the "
        "requests its model call held (modelroll_gateway_model_calls_total).",
        "code",
        "The status code, or stream_error.",
        "Model calls answered with it.",
        omit_empty=True,
    )
    """The model calls behind the weighted requests, by status code: each request is 1/n of a
    call that answered n requests together (modelroll_gateway_model_calls_total). After
    :meth:`judged`, a source that does not export them has one call per request."""
    call_buckets: Histogram = shapes.histogram_field(
        "The latency histogram counted per model call "
        "(modelroll_gateway_model_call_duration_seconds): cumulative by upper bound.",
        "Model calls at most this slow.",
        omit_empty=True,
    )
    """The latency histogram counted the same way (the model_call_duration histogram)."""
    ttft_buckets: Histogram = shapes.histogram_field(
        "The streams routed by weight (modelroll_gateway_llm_time_to_first_token_seconds): "
        "cumulative counts by upper bound; only while a stream check judges them.",
        "Streams at most this slow.",
        omit_empty=True,
    )
    """The weighted generation streams' time to first token, as a cumulative histogram; read
    only for a spec with a stream check (AnalysisSpec.judges_streams)."""
    tpot_buckets: Histogram = shapes.histogram_field(
        "The streams routed by weight (modelroll_gateway_llm_time_per_output_token_seconds): "
        "cumulative counts by upper bound; only while a stream check judges them.",
        "Streams at most this slow.",
        omit_empty=True,
    )
    """Their time per output token, likewise."""
    agreement: Mapping[str, float] = api(
        "The canary's shadow copies compared with the baseline's answers "
        "(modelroll_gateway_shadow_agreement): only while a shadow gate judges them.",
        default_factory=dict,
        stored={
            "type": "object",
            "properties": {
                "sum": {"type": "number", "description": "The agreement of the copies, summed."},
                "count": {"type": "number", "description": "The copies compared."},
            },
        },
        read=shapes.read_sums,
        write=shapes.write_sums,
        omit_empty=True,
    )
    """The canary's shadow copies compared with the baseline's answers: the agreement
    histogram's ``sum`` and ``count``; read only for a spec with a shadow gate."""

    def without_calls(self) -> VersionCounts:
        """These counts but the model calls (a step's sums keep none: only a source's own
        readings need them, for their deltas)."""
        return replace(self, calls={}, call_buckets=())

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


def _increases(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: _increase(n, before.get(k)) for k, n in now.items()}


def _sum(a: Mapping[_K, float], b: Mapping[_K, float]) -> dict[_K, float]:
    out = dict(a)
    for k, n in b.items():
        out[k] = out.get(k, 0.0) + n
    return out


def _bucket_increases(now: Histogram, before: Histogram) -> Histogram:
    earlier = dict(before)
    return tuple((le, _increase(n, earlier.get(le))) for le, n in now)


def _bucket_sum(a: Histogram, b: Histogram) -> Histogram:
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


def _increase(now: float, before: float | None) -> float:
    return now if before is None or now < before else now - before


EMPTY = VersionCounts()


@dataclass(frozen=True)
class Tally:
    """Both versions' counters and a time: a source's cumulative counters as read at ``at``,
    or what the per-source deltas summed to since ``at``."""

    at: float = api(
        "When these counts were taken (unix seconds): a source's last reading; for stepCounts "
        "the step's first reading, for window when judging started.",
        default=0.0,
        write=shapes.seconds,
    )
    canary: VersionCounts = api("The canary's counters.", default=EMPTY)
    baseline: VersionCounts = api("The baseline's counters.", default=EMPTY)

    def plus(self, canary: VersionCounts, baseline: VersionCounts) -> Tally:
        return Tally(self.at, self.canary.plus(canary), self.baseline.plus(baseline))

    def without_calls(self) -> Tally:
        return Tally(self.at, self.canary.without_calls(), self.baseline.without_calls())


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

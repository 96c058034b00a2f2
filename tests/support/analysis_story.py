"""The canary analysis driven as the gateway's replicas would feed it: counters per version and
replica, ticks of traffic, and the state machine's decisions after each interval."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelroll_operator.analysis import machine
from modelroll_operator.analysis.counts import Snapshot, Tally, VersionCounts
from modelroll_operator.analysis.machine import Decision
from modelroll_operator.analysis.phases import Phase
from modelroll_operator.analysis.spec import (
    AnalysisSpec,
    parse_analysis,
)
from modelroll_operator.analysis.state import AnalysisState

BOUNDS = (0.01, 0.05, 0.1, math.inf)
STREAM_BOUNDS = (0.05, 0.25, math.inf)


@dataclass
class Arm:
    """A version's cumulative counters on one gateway replica, fed by ticks of traffic."""

    ok: float = 0
    errors: float = 0
    fast: float = 0  # at most 10 ms
    medium: float = 0  # at most 50 ms
    slow: float = 0  # at most 100 ms
    codes: dict[str, float] = field(default_factory=dict)
    prompt_streams: float = 0  # streams at most 50 ms to their first token (and per token)
    late_streams: float = 0  # at most 250 ms
    compared: float = 0  # shadow copies compared with the baseline's answers
    agreement: float = 0  # their agreement, summed

    def add(self, requests: int, errors: int = 0, slow: int = 0, code: str = "500") -> None:
        self.ok += requests - errors
        self.errors += errors
        self.codes[code] = self.codes.get(code, 0) + errors
        self.medium += slow
        self.fast += requests - slow

    def stream(self, streams: int, late: int) -> None:
        self.prompt_streams += streams - late
        self.late_streams += late

    def counts(self) -> VersionCounts:
        codes = {"200": self.ok, **self.codes}
        cumulative = (self.fast, self.fast + self.medium, self.fast + self.medium + self.slow)
        total = self.ok + self.errors
        streamed = self.prompt_streams + self.late_streams
        streams = (self.prompt_streams, streamed, streamed)
        histogram = tuple(zip(STREAM_BOUNDS, streams, strict=True)) if streamed else ()
        return VersionCounts(
            codes,
            tuple(zip(BOUNDS, (*cumulative, total), strict=True)),
            ttft_buckets=histogram,
            tpot_buckets=histogram,
            agreement={"sum": self.agreement, "count": self.compared} if self.compared else {},
        )


@dataclass
class Replica:
    """One gateway replica: both versions' counters, as its /metrics exports them."""

    canary: Arm = field(default_factory=Arm)
    baseline: Arm = field(default_factory=Arm)


@dataclass
class Served:
    """Requests the replicas served (the truth the evidence should add up to)."""

    canary: int = 0
    canary_errors: int = 0
    baseline: int = 0
    baseline_errors: int = 0

    def add(self, other: Served) -> None:
        self.canary += other.canary
        self.canary_errors += other.canary_errors
        self.baseline += other.baseline
        self.baseline_errors += other.baseline_errors


def share(total: int, parts: int, i: int) -> int:
    """Replica ``i``'s part of ``total`` split evenly over ``parts`` (the rest to the first)."""
    return total // parts + (total % parts if i == 0 else 0)


class Story:
    """An analysis run against simulated traffic, one evaluation every interval, read from
    gateway replicas the way the operator reads them (each replica a source)."""

    def __init__(self, spec: AnalysisSpec, baseline_weight: int = 100, replicas: int = 1) -> None:
        self.spec = spec
        self.now = 1000.0
        self.replicas = {f"pod/gateway-{chr(ord('a') + i)}": Replica() for i in range(replicas)}
        decision = machine.start(spec, "stable", baseline_weight, self.now, "h")
        self.state = decision.state
        self.weights = [decision.weights]
        self.events = [decision.event]
        self.judged = Served()
        """What the replicas served in the intervals judged so far."""

    @property
    def canary(self) -> Arm:
        """The first replica's canary counters (the only replica, in most stories)."""
        return next(iter(self.replicas.values())).canary

    @property
    def baseline(self) -> Arm:
        return next(iter(self.replicas.values())).baseline

    def replica(self, letter: str) -> Replica:
        return self.replicas[f"pod/gateway-{letter}"]

    def snapshot(self, read: str | None = None) -> Snapshot:
        """What a reading gives; ``read``: the replicas read (letters), default every one."""
        names = [n for n in self.replicas if read is None or n[-1] in read]
        return Snapshot(
            self.now,
            {
                n: Tally(
                    self.now, self.replicas[n].canary.counts(), self.replicas[n].baseline.counts()
                )
                for n in names
            },
        )

    def tick(
        self,
        canary: int = 30,
        canary_errors: int = 0,
        baseline: int = 270,
        baseline_errors: int = 0,
        canary_slow: int = 0,
        baseline_slow: int = 0,
        canary_streams: int = 0,
        canary_late: int = 0,
        baseline_streams: int = 0,
        baseline_late: int = 0,
        copies: int = 0,
        agreeing: float = 1.0,
        readable: bool = True,
        read: str | None = None,
        edit: Callable[[Snapshot], Snapshot] | None = None,
    ) -> Decision:
        self.now += self.spec.interval_seconds
        parts = len(self.replicas)
        for i, replica in enumerate(self.replicas.values()):
            replica.canary.add(
                share(canary, parts, i),
                share(canary_errors, parts, i),
                share(canary_slow, parts, i),
            )
            replica.baseline.add(
                share(baseline, parts, i),
                share(baseline_errors, parts, i),
                share(baseline_slow, parts, i),
            )
            replica.canary.stream(share(canary_streams, parts, i), share(canary_late, parts, i))
            replica.canary.compared += share(copies, parts, i)
            replica.canary.agreement += share(copies, parts, i) * agreeing
            replica.baseline.stream(
                share(baseline_streams, parts, i), share(baseline_late, parts, i)
            )
        judged = self.state.window is not None
        snapshot = self.snapshot(read) if readable else None
        if snapshot is not None and edit is not None:
            snapshot = edit(snapshot)
        decision = machine.evaluate(self.spec, self.state, snapshot, self.now, "gone")
        if judged and not self.state.finished:
            self.judged.add(Served(canary, canary_errors, baseline, baseline_errors))
        # What the operator does: the state goes to status.analysis and is read back from it
        # at the next evaluation (numbers rounded as the status keeps them).
        restored = AnalysisState.from_dict(json.loads(json.dumps(decision.state.to_dict())))
        assert restored is not None
        assert (restored.phase, restored.step, restored.reason) == (
            decision.state.phase,
            decision.state.step,
            decision.state.reason,
        )
        again = AnalysisState.from_dict(restored.to_dict())
        assert again is not None
        assert again.to_dict() == restored.to_dict()  # rounded once, then stable
        self.state = restored
        if decision.weights is not None:
            self.weights.append(decision.weights)
        if decision.event:
            self.events.append(decision.event)
        return decision

    def run(self, ticks: int, **traffic: Any) -> AnalysisState:
        """Up to ``ticks`` evaluations, until the analysis is over or paused; the state then."""
        for _ in range(ticks):
            self.tick(**traffic)
            if self.state.finished or self.state.phase == Phase.PAUSED:
                break
        return self.state

    def evidence(self, check: str = "errors") -> Served:
        """What a check judged, in the same terms as :attr:`judged`."""
        ev = self.state.checks[check].evidence
        return Served(ev.canary.requests, ev.canary.bad, ev.baseline.requests, ev.baseline.bad)


def spec(**overrides: object) -> AnalysisSpec:
    raw = {"steps": [{"weight": 10}, {"weight": 50}], "minSeconds": 30, "minRequests": 100}
    parsed = parse_analysis({**raw, **overrides})
    assert parsed is not None
    return parsed

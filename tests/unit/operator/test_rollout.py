"""The canary analysis state machine (rollout.py), driven with counters as the gateway exports
them: what a user would see happen to the weights and the phase."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from modelroll_operator import rollout
from modelroll_operator.analysis_spec import (
    PROMOTE,
    ROLLBACK,
    AnalysisSpec,
    Guardrail,
    LatencyCheck,
    Step,
    parse_analysis,
)
from modelroll_operator.rollout import AnalysisState, Decision, Snapshot, VersionCounts

BOUNDS = (0.01, 0.05, 0.1, math.inf)


@dataclass
class Arm:
    """A version's cumulative counters, fed by ticks of traffic."""

    ok: float = 0
    errors: float = 0
    fast: float = 0  # at most 10 ms
    medium: float = 0  # at most 50 ms
    slow: float = 0  # at most 100 ms
    codes: dict[str, float] = field(default_factory=dict)

    def add(self, requests: int, errors: int = 0, slow: int = 0, code: str = "500") -> None:
        self.ok += requests - errors
        self.errors += errors
        self.codes[code] = self.codes.get(code, 0) + errors
        self.medium += slow
        self.fast += requests - slow

    def counts(self) -> VersionCounts:
        codes = {"200": self.ok, **self.codes}
        cumulative = (self.fast, self.fast + self.medium, self.fast + self.medium + self.slow)
        total = self.ok + self.errors
        return VersionCounts(codes, tuple(zip(BOUNDS, (*cumulative, total), strict=True)))


class Story:
    """An analysis run against simulated traffic, one evaluation every interval."""

    def __init__(self, spec: AnalysisSpec, baseline_weight: int = 100) -> None:
        self.spec = spec
        self.now = 1000.0
        self.canary = Arm()
        self.baseline = Arm()
        decision = rollout.start(spec, "stable", baseline_weight, self.now, "h")
        self.state = decision.state
        self.weights = [decision.weights]
        self.events = [decision.event]

    def snapshot(self) -> Snapshot:
        return Snapshot(self.now, self.canary.counts(), self.baseline.counts())

    def tick(
        self,
        canary: int = 30,
        canary_errors: int = 0,
        baseline: int = 270,
        baseline_errors: int = 0,
        canary_slow: int = 0,
        baseline_slow: int = 0,
        readable: bool = True,
    ) -> Decision:
        self.now += self.spec.interval_seconds
        self.canary.add(canary, canary_errors, canary_slow)
        self.baseline.add(baseline, baseline_errors, baseline_slow)
        snapshot = self.snapshot() if readable else None
        decision = rollout.evaluate(self.spec, self.state, snapshot, self.now, "gone")
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

    def run(self, ticks: int, **traffic: Any) -> None:
        for _ in range(ticks):
            self.tick(**traffic)
            if self.state.finished or self.state.phase == rollout.PAUSED:
                return


def spec(**overrides: object) -> AnalysisSpec:
    raw = {"steps": [{"weight": 10}, {"weight": 50}], "minSeconds": 30, "minRequests": 100}
    parsed = parse_analysis({**raw, **overrides})
    assert parsed is not None
    return parsed


def test_a_healthy_canary_goes_through_every_step_and_is_promoted() -> None:
    story = Story(spec())
    assert story.weights == [rollout.Weights(10, 90)]
    story.run(200, canary=30, canary_errors=1, baseline=270, baseline_errors=9)
    assert story.state.phase == rollout.PROMOTED
    assert story.weights == [
        rollout.Weights(10, 90),
        rollout.Weights(50, 50),
        rollout.Weights(100, 0),  # the canary takes the baseline's weight; the baseline stays
    ]
    assert any("Step 2 of 2" in (e or "") for e in story.events)
    assert "Promoted" in (story.events[-1] or "")


def test_warm_up_traffic_is_not_judged() -> None:
    story = Story(spec(warmupSeconds=9))
    for _ in range(3):  # 9 s of a canary failing everything: warm-up, not judged
        story.tick(canary=30, canary_errors=30)
        assert story.state.phase == rollout.PROGRESSING
    assert story.state.reason == rollout.INSUFFICIENT_DATA  # judging starts now
    assert story.state.checks["errors"].evidence.canary.requests == 0


def test_a_canary_failing_a_fifth_of_its_requests_is_rolled_back_within_seconds() -> None:
    """20% errors at 10 req/s of canary traffic (30 per 3 s interval), baseline healthy."""
    story = Story(spec())
    started = story.now
    story.run(100, canary=30, canary_errors=6, baseline=270, baseline_errors=0)
    assert story.state.phase == rollout.ROLLED_BACK
    assert story.state.reason == rollout.CANARY_WORSE
    assert story.now - started <= 15
    assert story.weights[-1] == rollout.Weights(0, 100)
    assert "errors: canary 6/30 vs baseline 0/270" in (story.events[-1] or "") or (
        "errors: canary" in (story.events[-1] or "")
    )


def test_a_slower_canary_is_rolled_back_on_the_latency_check() -> None:
    story = Story(spec())
    story.run(100, canary=30, canary_slow=12, baseline=270, baseline_slow=5)
    assert story.state.phase == rollout.ROLLED_BACK
    assert story.state.checks["latency"].verdict == "Fail"
    assert story.state.checks["latency"].bound == 0.01
    assert story.state.checks["errors"].verdict != "Fail"


def test_a_dry_run_check_reports_but_never_acts() -> None:
    dry = spec(checks={"errors": {"dryRun": True}, "latency": {}})
    story = Story(dry)
    story.run(8, canary=30, canary_errors=6, baseline=270, baseline_errors=0)
    assert story.state.checks["errors"].verdict == "Fail"
    assert story.state.phase == rollout.PROGRESSING
    story.run(100, canary=30, canary_errors=6, baseline=270, baseline_errors=0)
    assert story.state.phase == rollout.PROMOTED  # on the latency check alone


def test_the_guardrail_rolls_back_at_once() -> None:
    guarded = spec(checks={"guardrail": {"maxErrorRatio": 0.5, "minRequests": 20}})
    story = Story(guarded)
    story.tick()  # warm-up
    story.tick()
    story.tick(canary=30, canary_errors=20)
    assert story.state.phase == rollout.ROLLED_BACK
    assert story.state.reason == rollout.GUARDRAIL


def test_metrics_that_cannot_be_read_hold_and_never_roll_back() -> None:
    story = Story(spec())
    story.run(3)
    weights = list(story.weights)
    for _ in range(20):
        story.tick(readable=False)
        assert story.state.phase == rollout.HOLDING
        assert story.state.reason == rollout.METRICS_UNAVAILABLE
    assert story.weights == weights
    story.tick()  # readable again: the analysis goes on
    assert story.state.phase == rollout.PROGRESSING


def test_a_canary_with_little_traffic_holds_and_is_not_rolled_back() -> None:
    """1% weight, a few requests a minute: never enough to pass, nothing that says worse."""
    story = Story(spec(steps=[{"weight": 1}], maxSeconds=120))
    for i in range(200):
        story.tick(canary=1 if i % 10 == 0 else 0, baseline=10)
    assert story.state.phase == rollout.HOLDING
    assert story.state.reason == rollout.INSUFFICIENT_DATA
    assert story.weights == [rollout.Weights(1, 99)]


def test_an_inconclusive_step_follows_the_policy() -> None:
    for policy, phase in ((ROLLBACK, rollout.ROLLED_BACK), (PROMOTE, rollout.PROMOTED)):
        story = Story(spec(steps=[{"weight": 1}], maxSeconds=60, onInconclusive=policy))
        story.run(100, canary=1, baseline=10)
        assert story.state.phase == phase, policy


def test_a_pause_step_waits_for_resume() -> None:
    story = Story(spec(steps=[{"weight": 10, "pause": True}, {"weight": 50}]))
    story.run(100, canary=30, baseline=270)
    assert story.state.phase == rollout.PAUSED
    assert story.state.reason == rollout.STEP_PAUSE
    assert story.weights == [rollout.Weights(10, 90)]
    story.tick()
    assert story.state.phase == rollout.PAUSED  # nothing moves while paused
    decision = rollout.resume(story.spec, story.state, story.now)
    assert decision.weights == rollout.Weights(50, 50)
    assert decision.state.step == 1


def test_skip_and_abort() -> None:
    story = Story(spec())
    skipped = rollout.skip(story.spec, story.state, story.now)
    assert skipped.weights == rollout.Weights(50, 50)
    aborted = rollout.abort(skipped.state)
    assert aborted.weights == rollout.Weights(0, 100)
    assert aborted.state.reason == rollout.ABORTED
    assert rollout.abort(aborted.state).weights is None  # once over, it stays over


def test_weights_scale_to_a_baseline_above_100() -> None:
    story = Story(spec(), baseline_weight=900)
    assert story.weights == [rollout.Weights(90, 810)]
    assert rollout.promoted_weights(story.state) == rollout.Weights(900, 0)


def test_a_gateway_restart_starts_the_window_again() -> None:
    story = Story(spec())
    story.run(4)
    story.canary, story.baseline = Arm(), Arm()  # counters back to zero
    decision = story.tick()
    assert decision.weights is None
    assert story.state.phase == rollout.PROGRESSING
    story.run(5, canary=30, baseline=270)
    assert story.state.checks["errors"].evidence.canary.requests > 0


def test_default_checks_and_types() -> None:
    parsed = spec()
    assert set(parsed.checks()) == {"errors", "latency"}
    assert isinstance(parsed.latency, LatencyCheck)
    assert parsed.steps == (Step(10), Step(50))
    assert parsed.guardrail is None
    assert spec(checks={"guardrail": {}}).guardrail == Guardrail(max_error_ratio=0.5)
    assert parsed.errors is not None
    assert parsed.errors.is_error("503")
    assert parsed.errors.is_error("422")
    assert not parsed.errors.is_error("404")


def test_a_baseline_with_no_requests_is_never_a_pass() -> None:
    """A canary judged against a baseline that answers nothing holds, whatever its own traffic,
    and even a policy of promoting inconclusive steps does not promote it."""
    for policy in (PROMOTE, ROLLBACK, "Hold"):
        story = Story(spec(steps=[{"weight": 10}], maxSeconds=60, onInconclusive=policy))
        story.run(60, canary=30, baseline=0)
        assert story.state.phase == rollout.HOLDING, policy
        assert story.state.reason == rollout.INSUFFICIENT_DATA, policy
        assert "no baseline requests" in story.state.message, policy
        assert story.weights == [rollout.Weights(10, 90)], policy
        story.run(60, canary=30, baseline=270)  # the baseline serves again: judged, promoted
        assert story.state.phase == rollout.PROMOTED, policy

"""The canary analysis state machine (analysis/machine.py), driven with counters as the gateway
exports them: what a user would see happen to the weights and the phase."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from modelroll_operator.analysis import machine
from modelroll_operator.analysis.counts import SOURCE_TTL_S, Snapshot, Split, VersionCounts
from modelroll_operator.analysis.daemon import _waits_for_replicas
from modelroll_operator.analysis.phases import Phase, Reason
from modelroll_operator.analysis.spec import (
    PROMOTE,
    ROLLBACK,
    Guardrail,
    LatencyCheck,
    Step,
)
from modelroll_operator.analysis.state import AnalysisState
from modelroll_operator.schema import encode
from modelroll_operator.status import analysis_conditions
from tests.support.analysis_story import Replica, Served, Story, share, spec


def test_a_healthy_canary_goes_through_every_step_and_is_promoted() -> None:
    story = Story(spec())
    assert story.weights == [machine.Weights(10, 90)]
    story.run(200, canary=30, canary_errors=1, baseline=270, baseline_errors=9)
    assert story.state.phase == Phase.PROMOTED
    assert story.weights == [
        machine.Weights(10, 90),
        machine.Weights(50, 50),
        machine.Weights(100, 0),  # the canary takes the baseline's weight; the baseline stays
    ]
    assert any("Step 2 of 2" in (e or "") for e in story.events)
    assert "Promoted" in (story.events[-1] or "")


def test_warm_up_traffic_is_not_judged() -> None:
    story = Story(spec(warmupSeconds=9))
    for _ in range(3):  # 9 s of a canary failing everything: warm-up, not judged
        story.tick(canary=30, canary_errors=30)
        assert story.state.phase == Phase.PROGRESSING
    assert story.state.reason == Reason.INSUFFICIENT_DATA  # judging starts now
    assert story.state.checks["errors"].evidence.canary.requests == 0


def test_a_canary_failing_a_fifth_of_its_requests_is_rolled_back_within_seconds() -> None:
    """20% errors at 10 req/s of canary traffic (30 per 3 s interval), baseline healthy."""
    story = Story(spec())
    started = story.now
    story.run(100, canary=30, canary_errors=6, baseline=270, baseline_errors=0)
    assert story.state.phase == Phase.ROLLED_BACK
    assert story.state.reason == Reason.CANARY_WORSE
    assert story.now - started <= 15
    assert story.weights[-1] == machine.Weights(0, 100)
    assert "errors: canary 6/30 vs baseline 0/270" in (story.events[-1] or "") or (
        "errors: canary" in (story.events[-1] or "")
    )


def test_a_slower_canary_is_rolled_back_on_the_latency_check() -> None:
    story = Story(spec())
    story.run(100, canary=30, canary_slow=12, baseline=270, baseline_slow=5)
    assert story.state.phase == Phase.ROLLED_BACK
    assert story.state.checks["latency"].verdict == "Fail"
    assert story.state.checks["latency"].bound == 0.01
    assert story.state.checks["errors"].verdict != "Fail"


@pytest.mark.parametrize("check", ["timeToFirstToken", "timePerOutputToken"])
def test_a_canary_slower_to_stream_is_rolled_back_on_its_stream_check(check: str) -> None:
    """Every request a stream, errors and request latency alike in both versions: only the
    stream check sees that 4 in 10 of the canary's streams are late (1 in 50 of the baseline's)."""
    story = Story(spec(checks={"errors": {}, "latency": {}, check: {}}))
    started = story.now
    streams = {"canary_streams": 30, "canary_late": 12, "baseline_streams": 270, "baseline_late": 5}
    story.run(100, canary=30, canary_errors=1, baseline=270, baseline_errors=9, **streams)
    assert story.state.phase == Phase.ROLLED_BACK
    assert story.now - started <= 30
    assert story.weights[-1] == machine.Weights(0, 100)
    verdicts = {name: c.verdict for name, c in story.state.checks.items()}
    assert verdicts == {"errors": "Pass", "latency": "Pass", check: "Fail"}
    assert story.state.checks[check].bound == 0.05
    assert f"{check}: canary 12/30" in (story.events[-1] or ""), story.events[-1]


def test_a_stream_check_holds_until_both_versions_stream() -> None:
    """A stream check with no streams to judge (a canary that never streams, say) is no pass:
    the step holds, saying so, and goes on once both versions stream."""
    story = Story(spec(steps=[{"weight": 10}], checks={"timeToFirstToken": {}}, maxSeconds=60))
    story.run(40, canary=30, baseline=270, baseline_streams=270)
    assert story.state.phase == Phase.HOLDING
    assert "no streams of both versions yet for timeToFirstToken" in story.state.message
    after = story.run(40, canary=30, baseline=270, canary_streams=30, baseline_streams=270)
    assert after.phase == Phase.PROMOTED


SHADOW_GATE = {"minAgreement": 0.99, "minCopies": 100}


def test_a_shadow_gate_lets_an_agreeing_canary_on_to_step_1() -> None:
    story = Story(spec(shadow=SHADOW_GATE))
    assert story.weights == [machine.Weights(0, 100)]
    assert story.state.shadowing
    assert story.state.reason == Reason.SHADOWING
    story.tick(canary=0, baseline=300, copies=60)  # the first reading: where deltas start
    story.tick(canary=0, baseline=300, copies=60, agreeing=0.999)
    assert story.state.shadowing
    assert "60 copies compared, mean agreement 0.9990 of 100 needed" in story.state.message
    decision = story.tick(canary=0, baseline=300, copies=60, agreeing=0.995)
    assert not decision.state.shadowing
    assert story.weights[-1] == machine.Weights(10, 90)
    assert "agree with stable's 0.9970 on average, at least 0.99" in (story.events[-1] or "")
    story.run(200, canary=30, baseline=270)
    assert story.state.phase == Phase.PROMOTED


def test_a_shadow_gate_rolls_back_a_disagreeing_canary_before_any_live_traffic() -> None:
    story = Story(spec(shadow=SHADOW_GATE))
    story.run(10, canary=0, baseline=300, copies=30, agreeing=0.9)
    assert story.state.phase == Phase.ROLLED_BACK
    assert story.state.reason == Reason.SHADOW_DISAGREES
    assert {w.canary for w in story.weights if w} == {0}  # it never had a weight above 0
    assert "0.9000 on average, below 0.99" in (story.events[-1] or "")


def test_a_shadow_gate_without_copies_holds_at_max_seconds() -> None:
    story = Story(spec(shadow=SHADOW_GATE, maxSeconds=30))
    story.run(20, canary=0, baseline=300)
    assert story.state.phase == Phase.HOLDING
    assert story.state.shadowing
    assert story.state.message.startswith("Holding before step 1: 0 copies compared after 30 s")
    assert story.weights == [machine.Weights(0, 100)]


def test_a_dry_run_check_reports_but_never_acts() -> None:
    dry = spec(checks={"errors": {"dryRun": True}, "latency": {}})
    story = Story(dry)
    story.run(8, canary=30, canary_errors=6, baseline=270, baseline_errors=0)
    assert story.state.checks["errors"].verdict == "Fail"
    assert story.state.phase == Phase.PROGRESSING
    after = story.run(100, canary=30, canary_errors=6, baseline=270, baseline_errors=0)
    assert after.phase == Phase.PROMOTED  # on the latency check alone


def test_the_guardrail_rolls_back_at_once() -> None:
    guarded = spec(checks={"guardrail": {"maxErrorRatio": 0.5, "minRequests": 20}})
    story = Story(guarded)
    story.tick()  # warm-up
    story.tick()
    story.tick(canary=30, canary_errors=20)
    assert story.state.phase == Phase.ROLLED_BACK
    assert story.state.reason == Reason.GUARDRAIL


def test_metrics_that_cannot_be_read_hold_and_never_roll_back() -> None:
    story = Story(spec())
    story.run(3)
    weights = list(story.weights)
    for _ in range(20):
        story.tick(readable=False)
        assert story.state.phase == Phase.HOLDING
        assert story.state.reason == Reason.METRICS_UNAVAILABLE
    assert story.weights == weights
    story.tick()  # readable again: the analysis goes on
    assert story.state.phase == Phase.PROGRESSING


def test_a_message_longer_than_the_crd_allows_is_cut_to_fit() -> None:
    """The status patch would be refused whole (the CRD's maxLength), leaving the analysis
    stuck with its reason only in the operator's log."""
    story = Story(spec())
    story.tick(readable=False)
    bound = 32768  # status.analysis.message's maxLength (test_crd_schema.py: MESSAGE_MAX)
    long = replace(story.state, message="x" * (bound * 2))
    written = long.to_dict()["message"]
    assert len(written) == bound
    assert written.endswith("…")


def splits(**by_letter: tuple[float | None, float | None]) -> Callable[[Snapshot], Snapshot]:
    """A snapshot edit: replica ``letter`` routes by the given canary/baseline weights."""

    def edit(snapshot: Snapshot) -> Snapshot:
        given = {f"pod/gateway-{k}": Split(*w) for k, w in by_letter.items()}
        return replace(snapshot, splits=given)

    return edit


def test_a_step_waits_until_every_gateway_routes_by_its_weights() -> None:
    """Replica b still routes by the weights before the step (it has not seen the routes
    change): the analysis holds, naming it, and its failing requests under that split are
    judged nowhere; once b applies 10/90 judging goes on from there."""
    story = Story(spec(), replicas=2)
    stale = splits(a=(10, 90), b=(0, 100))
    for _ in range(10):
        story.tick(canary=30, canary_errors=30, edit=stale)
        assert story.state.phase == Phase.HOLDING
        assert story.state.reason == Reason.WEIGHTS_NOT_APPLIED
        assert "pod/gateway-b routes by 0/100" in story.state.message
        assert "pod/gateway-a" not in story.state.message
    assert story.state.step_seconds == 0  # the step's clock stood still
    assert story.weights == [machine.Weights(10, 90)]
    assert sum("not in force" in (e or "") for e in story.events) == 1  # one event, not ten

    def applied(snapshot: Snapshot) -> Snapshot:  # every replica follows each step at once
        split = Split(story.state.canary_weight, story.state.baseline_step_weight)
        return replace(snapshot, splits=dict.fromkeys(snapshot.sources, split))

    story.run(200, canary=30, canary_errors=1, baseline=270, baseline_errors=9, edit=applied)
    # Promoted, not rolled back: the 300 failures served under the stale split were never judged.
    assert story.state.phase == Phase.PROMOTED


def test_a_promotion_is_complete_only_once_every_gateway_routes_by_it() -> None:
    story = Story(spec(steps=[{"weight": 50}], minSeconds=9), replicas=2)
    lagging = splits(a=(100, 0), b=(50, 50))
    for _ in range(40):
        story.tick(edit=splits(a=(50, 50), b=(50, 50)))
        if story.state.phase == Phase.PROMOTED:
            break
    assert story.weights[-1] == machine.Weights(100, 0)
    assert not story.state.finished
    story.tick(edit=lagging)
    assert not story.state.finished
    assert story.state.message.endswith(
        "Waiting for every gateway to route by it: pod/gateway-b routes by 50/50"
    )
    conditions = {c["type"]: c for c in analysis_conditions(story.state.to_dict())}
    assert conditions["Promoted"]["status"] == "False"
    assert conditions["Progressing"]["reason"] == Reason.WEIGHTS_NOT_APPLIED
    done = story.tick(edit=splits(a=(100, 0), b=(100, 0))).state
    assert done.finished
    assert done.message.startswith("Promoted: canary weight 100, baseline stable 0.")
    assert story.events[-1] == done.message
    conditions = {c["type"]: c for c in analysis_conditions(done.to_dict())}
    assert conditions["Promoted"]["status"] == "True"


def promoting() -> Story:
    """A canary promoted at its one step, while gateway b still routes by the step's weights."""
    story = Story(spec(steps=[{"weight": 50}], minSeconds=9), replicas=2)
    for _ in range(40):
        if story.tick(edit=splits(a=(50, 50), b=(50, 50))).state.phase == Phase.PROMOTED:
            break
    assert story.tick(edit=splits(a=(100, 0), b=(50, 50))).state.phase == Phase.PROMOTED
    assert not story.state.finished
    return story


def test_a_promotion_in_progress_survives_a_round_trip_through_the_stored_state() -> None:
    story = promoting()
    written = json.loads(json.dumps(story.state.to_dict()))
    promotion = written["promotion"]
    assert promotion.startswith("canary weight 100, baseline stable 0. Step 1 passed (errors: ")
    assert written["message"] == (
        f"Promoting: {promotion} Waiting for every gateway to route by it: "
        "pod/gateway-b routes by 50/50"
    )
    # The message is for people: the promotion is read back from its own field.
    restored = AnalysisState.from_dict({**written, "message": "edited by hand"})
    assert restored is not None
    story.state = restored
    done = story.tick(edit=splits(a=(100, 0), b=(100, 0))).state
    assert done.finished
    assert done.message == story.events[-1] == f"Promoted: {promotion}"
    assert done.to_dict()["promotion"] == promotion


def test_a_promotion_stored_without_its_field_is_read_from_its_message() -> None:
    """status.analysis as written before it had ``promotion``: the promotion goes on, and
    completes with the same message, the field filled in."""
    story = promoting()
    waiting = story.state.message
    promotion = story.state.promotion
    written = story.state.to_dict()
    del written["promotion"]
    restored = AnalysisState.from_dict(written)
    assert restored is not None
    story.state = restored
    assert story.tick(edit=splits(a=(100, 0), b=(50, 50))).state.message == waiting
    assert story.state.promotion == promotion
    done = story.tick(edit=splits(a=(100, 0), b=(100, 0))).state
    assert done.message == f"Promoted: {promotion}"


def test_a_promotion_rolled_back_by_hand_keeps_no_promotion() -> None:
    story = promoting()
    aborted = machine.abort(story.state).state
    assert aborted.phase == Phase.ROLLED_BACK
    assert aborted.to_dict()["promotion"] == ""


def test_a_version_missing_from_a_gateways_route_holds_the_step() -> None:
    story = Story(spec())
    story.tick(edit=splits(a=(None, 90)))
    assert story.state.reason == Reason.WEIGHTS_NOT_APPLIED
    assert "routes by none/90" in story.state.message
    story.tick(edit=splits(a=(10, 90)))
    assert story.state.phase == Phase.PROGRESSING


def test_a_canary_with_little_traffic_holds_and_is_not_rolled_back() -> None:
    """1% weight, a few requests a minute: never enough to pass, nothing that says worse."""
    story = Story(spec(steps=[{"weight": 1}], maxSeconds=120))
    for i in range(200):
        story.tick(canary=1 if i % 10 == 0 else 0, baseline=10)
    assert story.state.phase == Phase.HOLDING
    assert story.state.reason == Reason.INSUFFICIENT_DATA
    assert story.weights == [machine.Weights(1, 99)]


def test_an_inconclusive_step_follows_the_policy() -> None:
    for policy, phase in ((ROLLBACK, Phase.ROLLED_BACK), (PROMOTE, Phase.PROMOTED)):
        story = Story(spec(steps=[{"weight": 1}], maxSeconds=60, onInconclusive=policy))
        story.run(100, canary=1, baseline=10)
        assert story.state.phase == phase, policy


def test_a_pause_step_waits_for_resume() -> None:
    story = Story(spec(steps=[{"weight": 10, "pause": True}, {"weight": 50}]))
    story.run(100, canary=30, baseline=270)
    assert story.state.phase == Phase.PAUSED
    assert story.state.reason == Reason.STEP_PAUSE
    assert story.weights == [machine.Weights(10, 90)]
    story.tick()
    assert story.state.phase == Phase.PAUSED  # nothing moves while paused
    decision = machine.resume(story.spec, story.state, story.now)
    assert decision.weights == machine.Weights(50, 50)
    assert decision.state.step == 1


def test_skip_and_abort() -> None:
    story = Story(spec())
    skipped = machine.skip(story.spec, story.state, story.now)
    assert skipped.weights == machine.Weights(50, 50)
    aborted = machine.abort(skipped.state)
    assert aborted.weights == machine.Weights(0, 100)
    assert aborted.state.reason == Reason.ABORTED
    assert machine.abort(aborted.state).weights is None  # once over, it stays over


def test_weights_scale_to_a_baseline_above_100() -> None:
    story = Story(spec(), baseline_weight=900)
    assert story.weights == [machine.Weights(90, 810)]
    assert machine.promoted_weights(story.state) == machine.Weights(900, 0)


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
        assert story.state.phase == Phase.HOLDING, policy
        assert story.state.reason == Reason.INSUFFICIENT_DATA, policy
        assert "no baseline requests" in story.state.message, policy
        assert story.weights == [machine.Weights(10, 90)], policy
        after = story.run(60, canary=30, baseline=270)  # the baseline serves again: judged
        assert after.phase == Phase.PROMOTED, policy


# -- counters read per gateway replica -------------------------------------------------------

INCIDENT: dict[str, Any] = {
    "canary": 100,
    "canary_errors": 2,
    "baseline": 900,
    "baseline_errors": 18,
}
"""An interval of an incident that fails 2% of both versions' requests: the canary is no worse."""


def incident(replicas: int = 2) -> Story:
    """An identical canary at 10% during an incident, judged for one interval, on gateway
    replicas whose counters hold hours of the baseline at 0.5% errors and the canary's earlier
    steps, in the incident."""
    story = Story(spec(steps=[{"weight": 10}], minSeconds=600, maxSeconds=1200), replicas=replicas)
    for replica in story.replicas.values():
        replica.baseline.add(2_000_000, 10_000)
        replica.canary.add(4_000, 80)
    story.run(3, **INCIDENT)  # warm-up, judging starts, one judged interval
    assert story.state.window is not None
    assert story.evidence() == story.judged
    return story


def assert_unharmed(story: Story) -> None:
    assert story.state.phase == Phase.PROGRESSING, story.state.message
    assert story.weights == [machine.Weights(10, 90)]


def test_a_reading_without_a_replica_adds_nothing_and_the_replica_brings_its_counts_back() -> None:
    story = incident()
    before = story.evidence()
    story.tick(**INCIDENT, read="a")
    assert_unharmed(story)
    assert "gateway pod/gateway-b not read this interval" in story.state.message
    a_only = Served(50, 1, 450, 9)  # replica a's half of the interval
    assert story.evidence() == Served(
        before.canary + a_only.canary,
        before.canary_errors + a_only.canary_errors,
        before.baseline + a_only.baseline,
        before.baseline_errors + a_only.baseline_errors,
    )
    story.run(10, **INCIDENT)
    assert_unharmed(story)
    assert "not read" not in story.state.message
    assert story.evidence() == story.judged  # b's missed interval came back with b


def test_a_replica_restarted_counts_from_zero_and_loses_nothing() -> None:
    story = incident()
    story.replicas["pod/gateway-b"] = Replica()  # its counters back to 0
    story.tick(**INCIDENT)
    assert_unharmed(story)
    assert story.evidence() == story.judged
    story.run(10, **INCIDENT)
    assert_unharmed(story)
    assert story.evidence() == story.judged


def test_a_replica_that_appears_counts_from_its_first_reading_on() -> None:
    for history in (0, 1):  # a new pod, and one that was not Ready until now
        story = incident()
        new = Replica()
        new.baseline.add(2_000_000 * history, 10_000 * history)
        new.canary.add(4_000 * history, 80 * history)
        story.replicas["pod/gateway-c"] = new
        story.tick(**INCIDENT)
        assert_unharmed(story)
        # c's part of this interval (a third) comes before its first reading: not counted
        unseen = Served(*(share(n, 3, 2) for n in INCIDENT.values()))
        story.run(10, **INCIDENT)
        assert_unharmed(story)
        judged, counted = story.judged, story.evidence()
        assert (judged.canary - unseen.canary, judged.baseline - unseen.baseline) == (
            counted.canary,
            counted.baseline,
        ), history
        assert judged.canary_errors - unseen.canary_errors == counted.canary_errors, history
        assert judged.baseline_errors - unseen.baseline_errors == counted.baseline_errors


def test_a_reading_of_no_source_holds_and_the_next_one_spans_it() -> None:
    """A reading with no source at all (an answer with no series) is no reading: the step
    holds, as for metrics that cannot be read, and the next reading's deltas span it."""
    story = incident()
    before = story.evidence()
    story.tick(**INCIDENT, read="")  # Prometheus answered with no series at all
    assert story.state.phase == Phase.HOLDING
    assert story.state.reason == Reason.METRICS_UNAVAILABLE
    assert story.state.message == f"Holding: the metrics cannot be read ({machine.NO_SOURCE})"
    assert story.weights == [machine.Weights(10, 90)]
    assert story.evidence() == before
    story.run(10, **INCIDENT)
    assert_unharmed(story)
    assert story.evidence() == story.judged


def without(source: str, version: str, code: str) -> Callable[[Snapshot], Snapshot]:
    """A reading that lacks one series of one source (``version``: canary or baseline)."""

    def edit(snapshot: Snapshot) -> Snapshot:
        tally = snapshot.sources[source]
        counts: VersionCounts = getattr(tally, version)
        codes = {c: n for c, n in counts.codes.items() if c != code}
        lacks = replace(counts, codes=codes)
        lacking = (
            replace(tally, canary=lacks) if version == "canary" else replace(tally, baseline=lacks)
        )
        return replace(snapshot, sources={**snapshot.sources, source: lacking})

    return edit


def test_a_series_missing_for_several_intervals_is_counted_when_it_is_back() -> None:
    for version in ("canary", "baseline"):
        story = incident()
        for _ in range(4):
            story.tick(**INCIDENT, edit=without("pod/gateway-a", version, "200"))
            assert_unharmed(story)
            assert "gateway pod/gateway-a read without some of its series" in story.state.message
        story.run(10, **INCIDENT)
        assert_unharmed(story)
        assert story.evidence() == story.judged, version


def test_a_replica_gone_for_long_is_forgotten_and_starts_again_when_back() -> None:
    story = incident()
    ticks = int(SOURCE_TTL_S // story.spec.interval_seconds) + 2
    for _ in range(ticks):
        story.tick(**INCIDENT, read="a")
    assert_unharmed(story)
    assert set(story.state.sources) == {"pod/gateway-a"}
    assert "not read" not in story.state.message
    before = story.evidence()
    story.tick(**INCIDENT)  # b is back: a first reading, its history not counted
    assert_unharmed(story)
    assert story.evidence().baseline == before.baseline + 450
    assert len(json.dumps(story.state.to_dict())) < 4000


def test_a_canary_failing_a_fifth_is_rolled_back_as_fast_across_a_replica_blip() -> None:
    story = Story(spec(), replicas=2)
    started = story.now
    story.tick(canary=30, canary_errors=6)
    story.tick(canary=30, canary_errors=6)  # judging starts
    story.tick(canary=30, canary_errors=6, read="a")  # replica b not read
    story.run(100, canary=30, canary_errors=6)
    assert story.state.phase == Phase.ROLLED_BACK
    assert story.state.reason == Reason.CANARY_WORSE
    assert story.now - started <= 15
    assert story.weights[-1] == machine.Weights(0, 100)


def test_a_state_with_summed_counters_starts_its_window_again() -> None:
    """status.analysis as written with one summed reading (``last``, ``windowStart``): read,
    it restarts judging from the next reading, and the analysis goes on."""
    story = incident(replicas=1)
    summed = {"at": story.now, "canary": encode(story.canary.counts()), "baseline": {}}
    raw = story.state.to_dict()
    for key in ("sources", "stepCounts", "window"):
        del raw[key]
    raw.update(stepFirst=summed, windowStart=summed, last=summed)
    state = AnalysisState.from_dict(raw)
    assert state is not None
    assert (state.step, state.window, state.sources, state.checks) == (0, None, {}, {})
    story.state = state
    story.judged = Served()
    story.run(12, **INCIDENT)
    assert_unharmed(story)
    assert story.state.window is not None
    assert story.evidence() == story.judged  # from the interval after the first reading


def test_the_phase_and_reason_are_stored_as_the_strings_users_see() -> None:
    story = Story(spec())
    story.run(3)
    written = json.loads(json.dumps(story.state.to_dict()))
    assert (written["phase"], written["reason"]) == ("Progressing", "InsufficientData")
    restored = AnalysisState.from_dict(written)
    assert restored is not None
    assert (restored.phase, restored.reason) == (Phase.PROGRESSING, Reason.INSUFFICIENT_DATA)


@pytest.mark.parametrize("field", ["phase", "reason"])
def test_a_stored_state_with_an_unknown_phase_or_reason_is_no_state(field: str) -> None:
    """A status edited by hand to a phase or reason the analysis does not know: it holds no
    state this code can go on from."""
    written = Story(spec()).state.to_dict()
    assert AnalysisState.from_dict({**written, field: "Exploded"}) is None


def test_a_step_held_for_the_canarys_replicas_says_so() -> None:
    """Scale before shift keeps a step's weights out of force until the canary's replicas are
    Ready: the hold (its clock standing still) names what the canary waits for."""
    story = Story(spec())
    held = story.tick(edit=splits(a=(0, 100)))
    assert held.state.reason == Reason.WEIGHTS_NOT_APPLIED
    waiting = "Waiting for 2 ready replicas before it takes 10.0% of model m's traffic: 1 ready"
    capacity = {"type": "Capacity", "status": "False", "message": waiting}
    told = _waits_for_replicas(held, {"status": {"conditions": [capacity]}})
    assert (
        told.state.message
        == f"Holding: the step's weights 10/90 wait for the canary's replicas: {waiting}"
    )
    assert told.state.step_seconds == 0
    assert told.event == told.state.message
    assert _waits_for_replicas(held, {"status": {"conditions": []}}) == held

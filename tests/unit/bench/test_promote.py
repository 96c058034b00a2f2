"""The promotion benchmark's arithmetic over runs made up here (nothing here is timed): the
stand-in's capacity, the phases' failures by kind and percentiles, and the verdicts."""

from __future__ import annotations

import pytest

from modelroll_bench import results
from modelroll_bench.promote import Measured, Round, Setup, checks, render, summarize
from modelroll_bench.promotion import (
    CANARY,
    PHASES,
    STABLE,
    Answer,
    Plan,
    PromotionRun,
    Shift,
    StandIn,
    failure_kind,
    manifest,
    routed_by,
    window,
    windows,
)


def test_the_stand_ins_capacity_and_the_load_follow_from_its_flags() -> None:
    plan = Plan(stable_replicas=3, load=0.7, stand_in=StandIn(fixed_ms=200, parallel=4))
    assert plan.stand_in.replica_rps == 20
    assert plan.rate == pytest.approx(42)
    spec = manifest(CANARY, 0, 1, plan.stand_in)["spec"]
    assert spec["batching"]["maxBatchSize"] == 1
    assert spec["batching"]["maxConcurrentBatches"] == 4
    assert spec["batching"]["maxQueueSize"] == plan.stand_in.queue
    assert "--parallel=4" in spec["server"]["args"]
    assert "--fixed-ms=200" in spec["server"]["args"]
    assert "--per-token-ms=0" in spec["server"]["args"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(200, None), (0, "connection"), (429, "429"), (502, "5xx"), (503, "5xx"), (404, "other")],
)
def test_each_failure_has_the_kind_a_user_sees(status: int, kind: str | None) -> None:
    assert failure_kind(status) == kind


def test_the_gateways_weights_are_read_as_shares() -> None:
    assert routed_by({CANARY: 100, STABLE: 0}, {CANARY: 1, STABLE: 0})
    assert routed_by({CANARY: 7}, {CANARY: 1, STABLE: 0})
    assert not routed_by({CANARY: 100, STABLE: 100}, {CANARY: 1, STABLE: 0})
    assert not routed_by({}, {CANARY: 1, STABLE: 0})


def test_a_window_counts_failures_by_kind_and_times_only_the_successes() -> None:
    answers = [Answer(0.0, 0.2, 200, STABLE) for _ in range(98)]
    answers += [Answer(0.0, 0.001, 429, CANARY), Answer(0.0, 5.0, 0, "")]
    w = window("promoted", answers)
    assert w.requests == 100
    assert w.failures == {"429": 1, "connection": 1}
    assert w.answered_by == {"-": 1, CANARY: 1, STABLE: 98}
    assert (w.p50_ms, w.p99_ms) == (200.0, 200.0)


def run(label: str, *, failing: bool, p99_s: float, ready: int) -> PromotionRun:
    """Requests every 0.1 s for 40 s: promote at 10 s, in force at 11 s, rollback at 25 s, in
    force at 25.5 s; with ``failing``, the canary answers every other request 429 once it has
    the traffic."""
    answers = []
    for i in range(400):
        sent = i / 10
        canary = 11 <= sent < 25.5
        bad = failing and canary and i % 2 == 0
        latency = p99_s if i % 50 == 1 else 0.2
        answers.append(Answer(sent, latency, 429 if bad else 200, CANARY if canary else STABLE))
    promote = Shift("promote", CANARY, 10.0, 11.0, ready, ready, 3, not failing, "")
    rollback = Shift("rollback", STABLE, 25.0, 25.5, 3, 3, 1, False, "")
    phases = {
        "before": (2.0, 10.0),
        "promoting": (10.0, 13.0),
        "promoted": (13.0, 25.0),
        "rolling back": (25.0, 27.5),
        "rolled back": (27.5, 40.0),
    }
    return PromotionRun(label, 42.0, promote, rollback, phases, answers, {CANARY: ready})


def measured(scaled_failing: bool = False) -> Measured:
    scaled = run("scale before shift", failing=scaled_failing, p99_s=0.4, ready=3)
    at_once = run("weights at once", failing=True, p99_s=0.9, ready=1)
    return Measured([Round(0, [scaled, at_once]), Round(1, [at_once, scaled])])


def test_phases_split_a_run_by_send_time() -> None:
    found = {w.phase: w for w in windows(run("x", failing=True, p99_s=0.4, ready=1))}
    assert list(found) == list(PHASES)
    assert found["before"].answered_by == {STABLE: 80}
    assert found["promoted"].answered_by == {CANARY: 120}
    assert found["promoted"].failures == {"429": 60}


def test_the_summary_pairs_the_arms_and_the_verdicts_judge_scale_before_shift() -> None:
    setup = Setup(rounds=2)
    summary = summarize(setup, measured())
    scaled, at_once = summary.arms
    assert (scaled.arm, at_once.arm) == ("scale before shift", "weights at once")
    promoted = {p.phase: p for p in at_once.phases}["promoted"]
    assert promoted.failures == {"429": 120}  # 60 in each of two rounds
    assert scaled.ready_at_force == [3, 3]
    assert at_once.to_force_s is not None
    assert at_once.to_force_s.median == 1.0
    assert summary.promoted_p99_ratio.by_round == [2.25, 2.25]
    assert all(met for _, met, _ in checks(setup, summary))
    table = render(setup, summary)
    assert "weights at once | promoted | 240 | 120 429 |" in table

    failing = summarize(setup, measured(scaled_failing=True))
    verdicts = {what.split(":")[1].strip(): met for what, met, _ in checks(setup, failing)}
    assert verdicts["no request failed in any phase"] is False


def test_a_measurement_reads_back_from_its_json() -> None:
    data = measured()
    assert results.from_json(Measured, results.to_json(data)) == data

"""The canary analyses' Prometheus series (analysis/exporter.py): what a dashboard reads of an
analysis as it starts, judges, moves on, finishes and goes away."""

from __future__ import annotations

import urllib.request
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from modelroll_operator.analysis import daemon, machine, statistics
from modelroll_operator.analysis.counts import Snapshot, Tally, VersionCounts
from modelroll_operator.analysis.exporter import (
    DECISIONS,
    PHASES,
    VERDICTS,
    AnalysisMetrics,
    serve,
)
from modelroll_operator.analysis.phases import FINISHED, Phase, Reason
from modelroll_operator.analysis.spec import AnalysisSpec, parse_analysis
from modelroll_operator.analysis.state import AnalysisState, CheckState
from tests.support.processes import free_port

NS, MODEL, CANARY = "prod", "sentiment", "canary-v2"
LABELS = {"namespace": NS, "model": MODEL, "version": CANARY}
P = "modelroll_operator_analysis_"


def spec() -> AnalysisSpec:
    parsed = parse_analysis(
        {
            "steps": [{"weight": 10}, {"weight": 50}],
            "minSeconds": 30,
            "minRequests": 100,
            "warmupSeconds": 0,
        }
    )
    assert parsed is not None
    return parsed


def started() -> AnalysisState:
    return machine.start(spec(), "stable", 100, 1000.0, "h").state


def check(
    canary_counts: tuple[int, int], baseline_counts: tuple[int, int], verdict: str
) -> CheckState:
    evidence = statistics.update(
        statistics.new_evidence(),
        1.5,
        statistics.Counts(*canary_counts),
        statistics.Counts(*baseline_counts),
    )
    return CheckState(evidence, verdict)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(P + name, {**LABELS, **labels})


def series_of(registry: CollectorRegistry, version: str = CANARY) -> list[str]:
    """The exposition's sample lines of one version."""
    text = generate_latest(registry).decode()
    return [
        line for line in text.splitlines() if line.startswith(P) and f'version="{version}"' in line
    ]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> AnalysisMetrics:
    return AnalysisMetrics(registry)


def test_a_started_analysis_shows_its_phase_step_weights_and_baseline(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    metrics.observe(NS, MODEL, CANARY, started())
    gauges = {p: value(registry, "phase", phase=p) for p in PHASES}
    assert gauges == {p: (1.0 if p == Phase.PROGRESSING else 0.0) for p in PHASES}
    assert value(registry, "step") == 1.0  # as the status counts steps
    assert value(registry, "weight", arm="canary") == 10.0
    assert value(registry, "weight", arm="baseline") == 90.0
    assert value(registry, "info", baseline="stable", reason=Reason.WARMING_UP) == 1.0
    # The counters exist at 0, so that the first decision shows in increase().
    for decision in DECISIONS:
        assert value(registry, "decisions_total", decision=decision) == 0.0
    assert value(registry, "metrics_read_errors_total") == 0.0
    # Warming up: no check is judged yet.
    assert not [line for line in series_of(registry) if 'check="' in line]


def test_each_check_shows_its_statistic_ratio_verdict_and_judged_counts(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    errors = check((200, 20), (1800, 18), statistics.FAIL)
    latency = check((200, 2), (1800, 20), statistics.INCONCLUSIVE)
    state = replace(
        started(),
        phase=Phase.ROLLED_BACK,
        reason=Reason.CANARY_WORSE,
        canary_weight=0,
        baseline_step_weight=100,
        checks={"errors": errors, "latency": latency},
    )
    metrics.observe(NS, MODEL, CANARY, state)
    assert value(registry, "phase", phase=Phase.ROLLED_BACK) == 1.0
    assert value(registry, "phase", phase=Phase.PROGRESSING) == 0.0
    assert value(registry, "weight", arm="canary") == 0.0
    assert value(registry, "weight", arm="baseline") == 100.0
    assert value(registry, "statistic", check="errors") == pytest.approx(
        statistics.statistic(errors.evidence)
    )
    assert statistics.statistic(errors.evidence) > 100  # the test's own sanity: decisive evidence
    assert value(registry, "ratio", check="errors") == pytest.approx(10.0)
    assert value(registry, "ratio", check="latency") == pytest.approx(0.9)
    verdicts = {v: value(registry, "verdict", check="errors", verdict=v) for v in VERDICTS}
    assert verdicts == {statistics.PASS: 0.0, statistics.FAIL: 1.0, statistics.INCONCLUSIVE: 0.0}
    assert value(registry, "verdict", check="latency", verdict=statistics.INCONCLUSIVE) == 1.0
    judged = {
        (arm, kind): value(registry, f"judged_{kind}", check="errors", arm=arm)
        for arm in ("canary", "baseline")
        for kind in ("requests", "bad_requests")
    }
    assert judged == {
        ("canary", "requests"): 200.0,
        ("canary", "bad_requests"): 20.0,
        ("baseline", "requests"): 1800.0,
        ("baseline", "bad_requests"): 18.0,
    }


def test_an_unknown_ratio_has_no_series_until_known_and_loses_it_when_unknown_again(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    unknown = check((100, 3), (900, 0), statistics.INCONCLUSIVE)  # no bad baseline request yet
    assert unknown.ratio() is None
    metrics.observe(NS, MODEL, CANARY, replace(started(), checks={"errors": unknown}))
    assert value(registry, "ratio", check="errors") is None
    assert value(registry, "statistic", check="errors") is not None
    known = check((100, 3), (900, 9), statistics.INCONCLUSIVE)
    metrics.observe(NS, MODEL, CANARY, replace(started(), checks={"errors": known}))
    assert value(registry, "ratio", check="errors") == pytest.approx(3.0)
    metrics.observe(NS, MODEL, CANARY, replace(started(), checks={"errors": unknown}))
    assert value(registry, "ratio", check="errors") is None
    assert "NaN" not in generate_latest(registry).decode()


def test_a_new_step_drops_the_last_steps_checks(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    """Driven by rollout itself: a step passes, the next one warms up with no checks."""
    analysis = spec()
    state = started()
    now = 1000.0
    canary_codes = {"200": 0.0}
    baseline_codes = {"200": 0.0}
    for _ in range(200):
        now += analysis.interval_seconds
        canary_codes["200"] += 30
        baseline_codes["200"] += 270
        counts = Tally(now, VersionCounts(dict(canary_codes)), VersionCounts(dict(baseline_codes)))
        snapshot = Snapshot(now, {"pod/gateway": counts})
        state = machine.evaluate(analysis, state, snapshot, now).state
        metrics.observe(NS, MODEL, CANARY, state)
        if state.step == 1:
            break
        if state.checks:
            assert value(registry, "statistic", check="errors") is not None
    assert state.step == 1, "the first step never passed"
    assert state.checks == {}
    assert value(registry, "step") == 2.0
    assert value(registry, "weight", arm="canary") == 50.0
    assert not [line for line in series_of(registry) if 'check="' in line]


def test_the_info_series_follows_the_reason(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    state = started()
    metrics.observe(NS, MODEL, CANARY, state)
    held = replace(state, phase=Phase.HOLDING, reason=Reason.METRICS_UNAVAILABLE)
    metrics.observe(NS, MODEL, CANARY, held)
    info = [line for line in series_of(registry) if line.startswith(P + "info")]
    assert len(info) == 1, info
    assert value(registry, "info", baseline="stable", reason=Reason.METRICS_UNAVAILABLE) == 1.0
    assert value(registry, "phase", phase=Phase.HOLDING) == 1.0


def test_decisions_and_read_errors_are_counted(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    metrics.decided(NS, MODEL, CANARY, "step")
    metrics.decided(NS, MODEL, CANARY, "step")
    metrics.decided(NS, MODEL, CANARY, "rollback")
    metrics.source_error(NS, MODEL, CANARY)
    assert value(registry, "decisions_total", decision="step") == 2.0
    assert value(registry, "decisions_total", decision="rollback") == 1.0
    assert value(registry, "decisions_total", decision="promote") == 0.0
    assert value(registry, "metrics_read_errors_total") == 1.0
    with pytest.raises(ValueError, match="unknown decision 'stepped'"):
        metrics.decided(NS, MODEL, CANARY, "stepped")


def test_forget_removes_every_series_of_that_canary_only(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    state = replace(started(), checks={"errors": check((100, 3), (900, 9), statistics.PASS)})
    metrics.observe(NS, MODEL, CANARY, state)
    metrics.observe(NS, MODEL, "other-canary", state)
    metrics.observe("staging", MODEL, CANARY, state)
    metrics.decided(NS, MODEL, CANARY, "promote")
    metrics.source_error(NS, MODEL, CANARY)
    assert series_of(registry)
    metrics.forget(NS, CANARY)
    left = generate_latest(registry).decode().splitlines()
    assert not [x for x in left if f'namespace="{NS}"' in x and f'version="{CANARY}"' in x]
    assert value(registry, "step") is None
    assert value(registry, "step", version="other-canary") == 1.0
    assert value(registry, "step", namespace="staging") == 1.0
    metrics.forget(NS, CANARY)  # twice: nothing to do
    metrics.forget(NS, "never-seen")
    # Back again (a new spec.analysis): the counters start at 0.
    metrics.observe(NS, MODEL, CANARY, started())
    assert value(registry, "decisions_total", decision="promote") == 0.0
    assert value(registry, "metrics_read_errors_total") == 0.0


def test_a_canary_that_changed_model_loses_the_old_models_series(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    metrics.observe(NS, MODEL, CANARY, started())
    metrics.observe(NS, "other-model", CANARY, started())
    assert value(registry, "step") is None
    assert value(registry, "step", model="other-model") == 1.0
    metrics.forget(NS, CANARY)
    assert series_of(registry) == []


def test_the_phases_are_the_operators() -> None:
    assert daemon.PENDING in PHASES
    assert set(FINISHED) <= set(PHASES)
    assert {Phase.PROGRESSING, Phase.PAUSED, Phase.HOLDING} <= set(PHASES)
    assert set(VERDICTS) == {statistics.PASS, statistics.FAIL, statistics.INCONCLUSIVE}


def test_serve_answers_metrics_over_http(
    registry: CollectorRegistry, metrics: AnalysisMetrics
) -> None:
    metrics.observe(NS, MODEL, CANARY, started())
    port = free_port()
    server = serve(registry, port, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
            text = response.read().decode()
        assert f'{P}step{{model="{MODEL}",namespace="{NS}",version="{CANARY}"}} 1.0' in text
        assert "python_info" in text  # and the process's own series
        with pytest.raises(OSError, match="in use"):
            serve(registry, port, "127.0.0.1")  # the port is taken: the caller stops
    finally:
        server.shutdown()
        server.server_close()

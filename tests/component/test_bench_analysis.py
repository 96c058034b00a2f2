"""modelroll-bench analysis: the samplers, Prometheus's histogram_quantile, and a tiny run of the
whole simulation (every scenario, determinism, a sane ordering, read back from its file)."""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from modelroll_bench import analysis, results
from modelroll_bench.analysis import JUDGES, Setup, Summary, Version
from modelroll_bench.suite import Report


@pytest.mark.parametrize("lam", [0.3, 4.0, 25.0, 600.0])
def test_poisson_has_the_right_mean_and_variance(lam: float) -> None:
    rng = random.Random(1)
    xs = [analysis.poisson(rng, lam) for _ in range(20_000)]
    assert statistics.fmean(xs) == pytest.approx(lam, rel=0.03, abs=0.02)
    assert statistics.pvariance(xs) == pytest.approx(lam, rel=0.06, abs=0.02)


@pytest.mark.parametrize(("n", "p"), [(5, 0.3), (200, 0.01), (600, 0.2), (600, 0.917)])
def test_binomial_has_the_right_mean_and_variance(n: int, p: float) -> None:
    rng = random.Random(2)
    xs = [analysis.binomial(rng, n, p) for _ in range(20_000)]
    assert statistics.fmean(xs) == pytest.approx(n * p, rel=0.03)
    assert statistics.pvariance(xs) == pytest.approx(n * p * (1 - p), rel=0.06)
    assert min(xs) >= 0
    assert max(xs) <= n


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    counts = [0] * len(analysis.LES)
    i = analysis.LES.index(0.1)
    counts[i], counts[i + 1] = 90, 10  # 90 in (0.05, 0.1], 10 in (0.1, 0.25]
    assert analysis.histogram_quantile(0.5, counts) == pytest.approx(0.05 + 0.05 * 50 / 90)
    assert analysis.histogram_quantile(0.95, counts) == pytest.approx(0.1 + 0.15 * 5 / 10)
    assert analysis.histogram_quantile(0.95, [0] * len(analysis.LES)) is None
    counts[-1] = 1000  # most of it in +Inf: the largest finite bound
    assert analysis.histogram_quantile(0.95, counts) == 30.0


def test_a_version_s_buckets_hold_its_lognormal() -> None:
    probabilities = Version(median_s=0.05, sigma=0.5).bucket_probabilities()
    assert len(probabilities) == len(analysis.LES)
    assert math.fsum(probabilities) == pytest.approx(1.0)
    below_median = math.fsum(probabilities[: analysis.LES.index(0.05) + 1])
    assert below_median == pytest.approx(0.5)


TINY = Setup(
    rollouts=12,
    detect_seeds=12,
    detect_weights=(25,),
    batch_sizes=(8,),
    batch_failure_rates=(0.01,),
    batched_rollouts=12,
)


@pytest.fixture(scope="module")
def report() -> Summary:
    return analysis.summarize(TINY, analysis.simulate(TINY))


def test_a_tiny_simulation_reports_every_scenario(report: Summary) -> None:
    measured = report.simulation
    aa = measured.aa
    assert set(aa) == {"low", "high"}
    for row in aa.values():
        for name in JUDGES:
            rollouts = row.judges[name]
            assert rollouts.runs == TINY.rollouts
            assert rollouts.rolled_back + rollouts.promoted + rollouts.held == 12
    detection = measured.detection
    assert set(detection) == {"errors 2x @ 25%", "errors 10x @ 25%", "latency 1.5x @ 25%"}
    assert set(measured.batched) == {"batches of 8, 1.0% failing"}
    json.dumps(results.to_json(report), allow_nan=False)  # nothing JSON cannot hold
    assert results.from_json(Summary, results.to_json(report)) == report
    assert analysis.render(TINY, report)
    names = [name for name, _, _ in analysis.checks(TINY, report)]
    assert len(names) == len(set(names))
    assert sum("A/A" in name for name in names) == 2 * 2 + 1 + 1
    assert sum("fixed-sample" in name for name in names) == 3 + 1
    assert set(measured.streams) == {"25%"}


def test_bigger_regressions_are_caught_sooner(report: Summary) -> None:
    detection = report.simulation.detection

    def median(cell: str) -> float:
        value = detection[cell].judges[analysis.MODELROLL].median_s
        return math.inf if value is None else value

    assert median("errors 10x @ 25%") < median("errors 2x @ 25%")
    assert median("errors 10x @ 25%") <= 15
    fast = report.simulation.fast.judges
    assert fast[analysis.MODELROLL].detected == TINY.detect_seeds
    assert (fast[analysis.MODELROLL].max_s or math.inf) <= 15
    # Flagger needs (threshold + 1) x interval at least: 5 failed checks, one a minute, and
    # the tick that compares their count with the threshold.
    assert (fast[analysis.FLAGGER].median_s or math.inf) >= 360


def test_identical_versions_are_not_rolled_back_by_modelroll(report: Summary) -> None:
    aa = report.simulation.aa
    assert aa["high"].judges[analysis.MODELROLL].rolled_back == 0
    assert aa["high"].judges[analysis.MODELROLL].promoted == TINY.rollouts
    assert aa["low"].judges[analysis.MODELROLL].held == TINY.rollouts  # never 100 requests


def test_a_chat_canary_slower_to_its_first_token_is_caught_and_an_identical_one_is_not(
    report: Summary,
) -> None:
    row = report.simulation.streams["25%"]
    assert row.aa.rolled_back == 0
    assert row.aa.promoted == TINY.detect_seeds
    assert row.detection.detected == TINY.detect_seeds
    assert row.fixed_sample_s is not None
    assert row.detection.median_s is not None
    assert row.detection.median_s <= 2 * row.fixed_sample_s


def test_a_saved_result_renders_the_same_tables_again(
    report: Summary, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--from reads the file a run wrote and prints the same tables, simulating nothing."""
    saved = tmp_path / "analysis.json"
    results.write(Report("analysis", TINY, report.simulation, report), saved)
    parser = argparse.ArgumentParser()
    analysis.SUITE.add_harness_arguments(parser)
    args = parser.parse_args(["--from", str(saved), "--out", str(tmp_path / "again.json")])
    analysis.SUITE.main(args)
    assert analysis.render(TINY, report) in capsys.readouterr().out


def test_the_simulation_is_deterministic_given_its_seed() -> None:
    small = replace(TINY, rollouts=3, detect_seeds=3, detect_weights=(5,), batched_rollouts=3)
    once, twice = analysis.simulate(small), analysis.simulate(small)
    assert replace(once, seconds=0) == replace(twice, seconds=0)
    other = analysis.simulate(replace(small, seed=2))
    assert replace(other, seconds=0) != replace(once, seconds=0)


BATCHED = Setup(batch_failure_rates=(0.002, 0.005, 0.01), batched_rollouts=1000)


def test_identical_versions_failing_whole_batches_are_rolled_back_within_the_budget() -> None:
    """1,000 A/A rollouts per cell through the operator's own rollout code, behind a sidecar
    whose model calls of 8 or 32 fail whole (0.2, 0.5, 1%) and share their duration: at most
    1% (the false-rollback budget) rolled back."""
    rows = analysis.batched_aa(BATCHED, judges=(analysis.MODELROLL,))
    assert len(rows) == 6
    for name, row in rows.items():
        assert row.judges[analysis.MODELROLL].runs == 1000
        assert row.judges[analysis.MODELROLL].rolled_back <= 10, name


def test_the_same_traffic_judged_by_requests_is_rolled_back_far_more_often() -> None:
    """What the budget would be worth if every request counted as independent evidence."""
    setup = Setup(batch_sizes=(32,), batch_failure_rates=(0.01,), batched_rollouts=100)
    row = analysis.batched_aa(setup, judges=(analysis.BY_REQUESTS,))["batches of 32, 1.0% failing"]
    assert row.judges[analysis.BY_REQUESTS].rolled_back >= 20


def test_a_fixed_sample_test_needs_longer_for_smaller_regressions_and_thinner_canaries() -> None:
    setup = Setup()
    healthy = setup.healthy
    spec = setup.spec((25,))

    def seconds(canary_version: Version, check: str, weight: int) -> float:
        return analysis.fixed_sample_s(spec, canary_version, healthy, check, weight, 200.0)

    twice = analysis.regressed(healthy, "errors 2x")
    tenfold = analysis.regressed(healthy, "errors 10x")
    slower = analysis.regressed(healthy, "latency 1.5x")
    assert seconds(healthy, "errors", 25) == math.inf  # no worse than maxRatio: never
    assert seconds(tenfold, "errors", 25) < seconds(twice, "errors", 25)
    assert seconds(twice, "errors", 25) < seconds(twice, "errors", 5)
    assert seconds(slower, "latency", 5) < math.inf
    # Never sooner than modelroll's first judged reading: warm-up, then one interval.
    assert seconds(tenfold, "errors", 25) >= 9

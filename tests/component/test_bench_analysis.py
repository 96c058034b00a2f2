"""modelroll-bench analysis: the samplers, Prometheus's histogram_quantile, and a tiny run of the
whole simulation (report keys, determinism, a sane ordering)."""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import replace
from typing import Any

import pytest

from modelroll_bench import analysis
from modelroll_bench.analysis import JUDGES, Setup, Version


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
def report() -> dict[str, Any]:
    return analysis.simulate(TINY)


def test_a_tiny_simulation_reports_every_scenario(report: dict[str, Any]) -> None:
    assert set(report) >= {
        "setup",
        "modelroll",
        "flagger",
        "aa",
        "batched",
        "detection",
        "fast",
        "streams",
    }
    aa = report["aa"]
    assert set(aa) == {"low", "high"}
    for row in aa.values():
        for name in JUDGES:
            assert row[name]["runs"] == TINY.rollouts
            assert row[name]["rolled_back"] + row[name]["promoted"] + row[name]["held"] == 12
    detection = report["detection"]
    assert set(detection) == {"errors 2x @ 25%", "errors 10x @ 25%", "latency 1.5x @ 25%"}
    assert set(report["batched"]) == {"batches of 8, 1.0% failing"}
    json.dumps(report, allow_nan=False)  # nothing JSON cannot hold
    assert analysis.table(report)
    names = [name for name, _, _ in analysis.targets(report)]
    assert len(names) == len(set(names))
    assert sum("A/A" in name for name in names) == 2 * 2 + 1 + 1
    assert sum("fixed-sample" in name for name in names) == 3 + 1
    assert set(report["streams"]) == {"25%"}


def test_bigger_regressions_are_caught_sooner(report: dict[str, Any]) -> None:
    detection = report["detection"]

    def median(cell: str) -> float:
        value = detection[cell]["modelroll"]["median_s"]
        return math.inf if value is None else float(value)

    assert median("errors 10x @ 25%") < median("errors 2x @ 25%")
    assert median("errors 10x @ 25%") <= 15
    fast = report["fast"]
    assert fast["modelroll"]["detected"] == TINY.detect_seeds
    assert fast["modelroll"]["max_s"] <= 15
    # Flagger needs (threshold + 1) x interval at least: 5 failed checks, one a minute, and
    # the tick that compares their count with the threshold.
    assert fast["flagger"]["median_s"] >= 360


def test_identical_versions_are_not_rolled_back_by_modelroll(report: dict[str, Any]) -> None:
    aa = report["aa"]
    assert aa["high"]["modelroll"]["rolled_back"] == 0
    assert aa["high"]["modelroll"]["promoted"] == TINY.rollouts
    assert aa["low"]["modelroll"]["held"] == TINY.rollouts  # 0.05 req/s: never 100 requests


def test_a_chat_canary_slower_to_its_first_token_is_caught_and_an_identical_one_is_not(
    report: dict[str, Any],
) -> None:
    row = report["streams"]["25%"]
    assert row["aa"]["rolled_back"] == 0
    assert row["aa"]["promoted"] == TINY.detect_seeds
    assert row["detection"]["detected"] == TINY.detect_seeds
    assert row["detection"]["median_s"] <= 2 * row["fixed_sample_s"]


def test_the_simulation_is_deterministic_given_its_seed() -> None:
    small = replace(TINY, rollouts=3, detect_seeds=3, detect_weights=(5,), batched_rollouts=3)
    assert analysis.simulate(small) == analysis.simulate(small)
    other = analysis.simulate(replace(small, seed=2))
    assert other != analysis.simulate(small)


BATCHED = Setup(batch_failure_rates=(0.002, 0.005, 0.01), batched_rollouts=1000)


def test_identical_versions_failing_whole_batches_are_rolled_back_within_the_budget() -> None:
    """1,000 A/A rollouts per cell through the operator's own rollout code, behind a sidecar
    whose model calls of 8 or 32 fail whole (0.2, 0.5, 1%) and share their duration: at most
    1% (the false-rollback budget) rolled back."""
    rows = analysis.batched_aa(BATCHED, judges=(analysis.MODELROLL,))
    assert len(rows) == 6
    for name, row in rows.items():
        assert row[analysis.MODELROLL]["runs"] == 1000
        assert row[analysis.MODELROLL]["rolled_back"] <= 10, name


def test_the_same_traffic_judged_by_requests_is_rolled_back_far_more_often() -> None:
    """What the budget would be worth if every request counted as independent evidence."""
    setup = Setup(batch_sizes=(32,), batch_failure_rates=(0.01,), batched_rollouts=100)
    row = analysis.batched_aa(setup, judges=(analysis.BY_REQUESTS,))["batches of 32, 1.0% failing"]
    assert row[analysis.BY_REQUESTS]["rolled_back"] >= 20


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

"""The statistics of the canary analysis (analysis/statistics.py), with seeded simulations:
identical versions fail at most at the documented rate, regressions are caught, and the evidence
keeps per-interval conditioning, round-trips through the status and reads the histogram as the
gateway writes it."""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Callable

import pytest

from modelroll_operator.analysis import statistics
from modelroll_operator.analysis.statistics import Counts, Evidence
from modelroll_operator.schema import decode, encode

LES = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def poisson(rng: random.Random, lam: float) -> int:
    """Knuth's method: fine for the small means of these tests."""
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def binomial(rng: random.Random, n: int, p: float) -> int:
    """Inversion (n p is small here)."""
    if n == 0 or p <= 0:
        return 0
    q = 1 - p
    r, u, x = q**n, rng.random(), 0
    while u > r and x < n:
        u -= r
        x += 1
        r *= (n - x + 1) / x * p / q
    return x


def lognormal_cdf(median_s: float, sigma: float) -> list[float]:
    """P(latency <= le) for each finite bucket bound."""
    return [0.5 * math.erfc(-math.log(le / median_s) / sigma / math.sqrt(2)) for le in LES]


def histogram(rng: random.Random, n: int, cdf: list[float]) -> list[tuple[float, float]]:
    """``n`` latencies drawn from ``cdf``, as the gateway's cumulative buckets."""
    counts = [0] * (len(LES) + 1)
    for _ in range(n):
        counts[bisect.bisect_right(cdf, rng.random())] += 1
    out, total = [], 0
    for le, c in zip((*LES, math.inf), counts, strict=True):
        total += c
        out.append((le, float(total)))
    return out


HEALTHY = lognormal_cdf(0.05, 0.5)  # p95 114 ms
SLOWER = lognormal_cdf(0.075, 0.5)  # 1.5x


def plus(a: statistics.Buckets, b: statistics.Buckets) -> list[tuple[float, float]]:
    if not a:
        return list(b)
    return [(le, x + y) for (le, x), (_, y) in zip(a, b, strict=True)]


def margin(rate: float, runs: int) -> float:
    """Three binomial standard deviations."""
    return 3 * math.sqrt(rate * (1 - rate) / runs)


def failure_rate(
    runs: int,
    intervals: int,
    alpha: float,
    interval: Callable[[random.Random, int], tuple[Counts, Counts]],
) -> float:
    rng = random.Random(20240611)
    failed = 0
    for _ in range(runs):
        evidence = statistics.new_evidence()
        for i in range(intervals):
            canary, baseline = interval(rng, i)
            evidence = statistics.update(evidence, 1.5, canary, baseline)
            if statistics.verdict(evidence, alpha) == statistics.FAIL:
                failed += 1
                break
    return failed / runs


# -- validity --------------------------------------------------------------------------------


def test_identical_versions_fail_at_most_at_alpha_however_often_judged() -> None:
    # 2000 steps of 60 intervals, judged after each one; the canary's share changes every
    # interval (1% .. 50%), the error rate is the same in both (binomial counts).
    alpha = 0.05
    shares = (0.01, 0.05, 0.25, 0.5)

    def interval(rng: random.Random, i: int) -> tuple[Counts, Counts]:
        n_c = max(1, round(60 * shares[i % 4]))
        n_b = 60 - n_c
        return Counts(n_c, binomial(rng, n_c, 0.05)), Counts(n_b, binomial(rng, n_b, 0.05))

    rate = failure_rate(2000, 60, alpha, interval)
    assert rate <= alpha + margin(alpha, 2000)


def batched(rng: random.Random, n: int, size: int, q: float) -> Counts:
    """``n`` requests in calls of ``size``, each call failing whole with probability ``q``."""
    calls = n / size
    failed = binomial(rng, round(calls), q)
    return Counts(n, failed * size, calls, float(failed))


@pytest.mark.parametrize("size", [8, 32])
def test_identical_versions_failing_whole_batches_fail_at_most_at_alpha(size: int) -> None:
    """Judged by model calls, a batch that fails whole is one failure: identical versions that
    fail 1% of their batches stay within alpha. Judged by requests, they do not."""
    alpha = 0.05
    shares = (0.05, 0.25, 0.5)

    def interval(rng: random.Random, i: int) -> tuple[Counts, Counts]:
        n_c = max(size, round(960 * shares[i % 3]))
        return batched(rng, n_c, size, 0.01), batched(rng, 960 - n_c, size, 0.01)

    def by_requests(rng: random.Random, i: int) -> tuple[Counts, Counts]:
        c, b = interval(rng, i)
        return Counts(c.requests, c.bad), Counts(b.requests, b.bad)

    assert failure_rate(1000, 30, alpha, interval) <= alpha + margin(alpha, 1000)
    assert failure_rate(1000, 30, alpha, by_requests) > 3 * alpha


def test_one_failed_batch_of_eight_is_one_bad_call() -> None:
    """A 25% canary whose one batch of 8 failed: evidence of one failure, not of eight."""
    items = statistics.update(statistics.new_evidence(), 1.5, Counts(100, 8), Counts(300, 0))
    calls = statistics.update(
        statistics.new_evidence(), 1.5, Counts(100, 8, 12.5, 1.0), Counts(300, 0, 37.5, 0.0)
    )
    assert statistics.verdict(items, 1 / 600) == statistics.FAIL
    assert statistics.statistic(calls) < 10
    assert (calls.canary.requests, calls.canary.bad) == (100, 8)  # what the status shows


def test_a_canary_exactly_at_max_ratio_fails_at_most_at_alpha() -> None:
    # The edge of H0 (r = k = 1.5) with Poisson bad counts, where the test is exact.
    alpha = 0.05

    def interval(rng: random.Random, i: int) -> tuple[Counts, Counts]:
        n_c, n_b = (10, 90) if i % 2 else (50, 50)
        return Counts(n_c, poisson(rng, n_c * 0.03)), Counts(n_b, poisson(rng, n_b * 0.02))

    rate = failure_rate(2000, 80, alpha, interval)
    assert rate <= alpha + margin(alpha, 2000)


def test_the_union_bound_splits_the_budget_over_checks_and_steps() -> None:
    assert statistics.check_alpha(0.01, 2, 3) == pytest.approx(0.01 / 6)
    assert statistics.check_alpha(0.01, 0, 1) == 0.01  # no active check: nothing to split
    with pytest.raises(ValueError, match="budget"):
        statistics.check_alpha(0, 2, 3)


# -- power -----------------------------------------------------------------------------------


def intervals_to_fail(
    rng: random.Random,
    alpha: float,
    limit: int,
    interval: Callable[[random.Random], tuple[Counts, Counts]],
) -> float:
    evidence = statistics.new_evidence()
    for i in range(1, limit + 1):
        evidence = statistics.update(evidence, 1.5, *interval(rng))
        if statistics.verdict(evidence, alpha) == statistics.FAIL:
            return i
    return math.inf


def test_a_canary_failing_where_the_baseline_never_does_is_rolled_back_at_once() -> None:
    # 20% errors at 10 req/s against a baseline of 190 req/s with none; intervals of 3 s and
    # the defaults' alpha (2 checks, 3 steps). The first judged interval ends 9 s into the step.
    alpha = statistics.check_alpha(0.01, 2, 3)
    rng = random.Random(7)

    def interval(rng: random.Random) -> tuple[Counts, Counts]:
        n_c, n_b = poisson(rng, 30), poisson(rng, 570)
        return Counts(n_c, binomial(rng, n_c, 0.2)), Counts(n_b, 0)

    times = [intervals_to_fail(rng, alpha, 10, interval) for _ in range(300)]
    assert max(times) <= 2  # judged by 12 s into the step: within 15 s
    assert sum(t == 1 for t in times) >= 0.8 * len(times)
    one = statistics.update(statistics.new_evidence(), 1.5, Counts(30, 5), Counts(570, 0))
    assert statistics.verdict(one, alpha) == statistics.FAIL


def test_a_twice_as_frequent_error_is_caught_with_enough_traffic() -> None:
    # 2% errors against 1%, 250 req/s each side for 3 s: maxRatio 1.5 leaves a small margin,
    # so it takes a few hundred bad requests.
    alpha = statistics.check_alpha(0.01, 2, 3)
    rng = random.Random(11)

    def interval(rng: random.Random) -> tuple[Counts, Counts]:
        return Counts(750, poisson(rng, 15)), Counts(750, poisson(rng, 7.5))

    times = sorted(intervals_to_fail(rng, alpha, 400, interval) for _ in range(100))
    assert times[95] < math.inf
    assert times[50] <= 100


def test_a_latency_regression_of_one_and_a_half_is_caught() -> None:
    # Lognormal latencies (median 50 ms, sigma 0.5), the canary 1.5x slower; 30 canary and
    # 570 baseline requests per interval (10 of 200 req/s, 3 s); the bound from the baseline's
    # earlier intervals, warm-up included.
    alpha = statistics.check_alpha(0.01, 2, 1)
    rng = random.Random(3)
    times = []
    for _ in range(40):
        evidence, earlier = statistics.new_evidence(), histogram(rng, 570, HEALTHY)  # warm-up
        caught = math.inf
        for i in range(1, 100):
            canary, baseline = histogram(rng, 30, SLOWER), histogram(rng, 570, HEALTHY)
            bound = statistics.slow_bound(earlier, 0.95)
            assert bound == 0.1  # the bucket bound nearest the baseline's p95 (114 ms)
            evidence = statistics.update(
                evidence,
                1.5,
                Counts(30, round(statistics.over(canary, bound))),
                Counts(570, round(statistics.over(baseline, bound))),
            )
            earlier = plus(earlier, baseline)
            if statistics.verdict(evidence, alpha) == statistics.FAIL:
                caught = i
                break
        times.append(caught)
    times.sort()
    assert times[-3] < math.inf
    assert times[20] <= 10


def test_a_bound_taken_from_the_counts_it_judges_fails_identical_versions() -> None:
    # Why the latency bound must come from earlier intervals: the smallest le at which the
    # baseline reaches its p95 *in the same counts* leaves the baseline few slow requests there
    # by construction, the canary not. With a bound from earlier counts the test stays valid.
    alpha = 0.05

    def same_counts_bound(buckets: statistics.Buckets, quantile: float) -> float:
        total = buckets[-1][1]
        return next(le for le, n in buckets if n >= quantile * total and math.isfinite(le))

    def run(same: bool, rng: random.Random) -> bool:
        evidence, earlier = statistics.new_evidence(), histogram(rng, 20, HEALTHY)
        for _ in range(100):
            canary, baseline = histogram(rng, 10, HEALTHY), histogram(rng, 20, HEALTHY)
            bound = (
                same_counts_bound(baseline, 0.95) if same else statistics.slow_bound(earlier, 0.95)
            )
            assert bound is not None
            c, b = statistics.over(canary, bound), statistics.over(baseline, bound)
            evidence = statistics.update(evidence, 1.5, Counts(10, round(c)), Counts(20, round(b)))
            earlier = plus(earlier, baseline)
            if statistics.verdict(evidence, alpha) == statistics.FAIL:
                return True
        return False

    rng = random.Random(5)
    biased = sum(run(True, rng) for _ in range(150)) / 150
    valid = sum(run(False, rng) for _ in range(150)) / 150
    assert biased > 3 * alpha
    assert valid <= alpha + margin(alpha, 150)


# -- the evidence ----------------------------------------------------------------------------


def test_fresh_evidence_is_neutral() -> None:
    fresh = statistics.new_evidence()
    assert statistics.statistic(fresh) == 1.0
    assert statistics.verdict(fresh, 0.01) == statistics.PASS
    assert fresh.canary == fresh.baseline == Counts(0, 0)
    assert len(fresh.log_lr) == len(statistics.MULTIPLIERS)


def test_the_verdict_thresholds() -> None:
    m = len(statistics.MULTIPLIERS)

    def at(log_value: float) -> Evidence:
        return Evidence(Counts(1, 1), Counts(1, 0), (log_value,) * m)

    assert statistics.verdict(at(math.log(100) + 1e-9), 0.01) == statistics.FAIL
    assert statistics.verdict(at(math.log(99)), 0.01) == statistics.INCONCLUSIVE
    assert statistics.verdict(at(0.0), 0.01) == statistics.PASS
    assert statistics.verdict(at(-3.0), 0.01) == statistics.PASS
    assert statistics.statistic(at(math.log(99))) == pytest.approx(99)
    assert statistics.statistic(at(5000.0)) == statistics.STATISTIC_CAP  # finite, for JSON
    # The strict pass rule: every likelihood ratio at most beta; nothing bad at all passes.
    assert statistics.verdict(at(-1.0), 0.01, beta=0.05) == statistics.INCONCLUSIVE
    assert statistics.verdict(at(-3.0), 0.01, beta=0.05) == statistics.PASS
    assert statistics.verdict(statistics.new_evidence(), 0.01, beta=0.05) == statistics.PASS


def test_intervals_without_bad_requests_or_without_one_version_change_nothing() -> None:
    fresh = statistics.new_evidence()
    assert statistics.update(fresh, 1.5, Counts(10, 0), Counts(90, 0)).log_lr == fresh.log_lr
    assert statistics.update(fresh, 1.5, Counts(0, 0), Counts(90, 9)).log_lr == fresh.log_lr
    alone = statistics.update(fresh, 1.5, Counts(10, 3), Counts(0, 0))
    assert alone.log_lr == fresh.log_lr
    assert alone.canary == Counts(10, 3)  # counted, not judged


def test_counts_that_disagree_are_clamped() -> None:
    # The request counter and the histogram are read together but not updated atomically.
    evidence = statistics.update(statistics.new_evidence(), 1.5, Counts(3, 4), Counts(-1, 0))
    assert (evidence.canary, evidence.baseline) == (Counts(3, 3), Counts(0, 0))
    with pytest.raises(ValueError, match="max_ratio"):
        statistics.update(statistics.new_evidence(), 0, Counts(1, 0), Counts(1, 0))


INTERVALS = [
    (Counts(100, 3), Counts(900, 20)),
    (Counts(500, 9), Counts(500, 4)),
    (Counts(10, 1), Counts(990, 8)),
    (Counts(250, 0), Counts(750, 11)),
]


def judged(intervals: list[tuple[Counts, Counts]]) -> Evidence:
    evidence = statistics.new_evidence()
    for canary, baseline in intervals:
        evidence = statistics.update(evidence, 1.5, canary, baseline)
    return evidence


def test_the_order_of_intervals_does_not_matter() -> None:
    forward, backward = judged(INTERVALS), judged(INTERVALS[::-1])
    assert (forward.canary, forward.baseline) == (backward.canary, backward.baseline)
    assert forward.log_lr == pytest.approx(backward.log_lr)


def test_intervals_with_the_same_split_may_be_merged_others_not() -> None:
    same = judged([(Counts(100, 2), Counts(300, 5)), (Counts(200, 7), Counts(600, 9))])
    merged = judged([(Counts(300, 9), Counts(900, 14))])
    assert same.log_lr == pytest.approx(merged.log_lr)
    # Simpson's paradox: errors at 10% in both versions while the canary had 90% of the
    # traffic, then 1% in both at 10%. Interval by interval the versions are alike; pooled,
    # the canary looks almost 5x worse.
    apart = [(Counts(900, 90), Counts(100, 10)), (Counts(100, 1), Counts(900, 9))]
    pooled = [(Counts(1000, 91), Counts(1000, 19))]
    alpha = statistics.check_alpha(0.01, 2, 3)
    assert statistics.verdict(judged(apart), alpha) == statistics.PASS
    assert statistics.verdict(judged(pooled), alpha) == statistics.FAIL


def test_the_mixture_is_over_whole_paths_not_per_interval() -> None:
    # Lambda is the mean over alternatives of the product over intervals, not the product of
    # per-interval means (which would not be a supermartingale's value).
    both = judged(INTERVALS[:2])
    product = statistics.statistic(judged(INTERVALS[:1])) * statistics.statistic(
        judged(INTERVALS[1:2])
    )
    assert statistics.statistic(both) != pytest.approx(product)


def test_evidence_round_trips_through_the_status() -> None:
    evidence = judged(INTERVALS)
    raw = json.loads(json.dumps(encode(evidence), allow_nan=False))
    assert set(raw) == {"canary", "baseline", "logLR"}
    back = decode(Evidence, raw, "evidence")
    assert (back.canary, back.baseline) == (evidence.canary, evidence.baseline)
    assert back.log_lr == pytest.approx(evidence.log_lr, rel=1e-5)
    assert statistics.verdict(back, 0.01) == statistics.verdict(evidence, 0.01)
    assert all(x == float(f"{x:.6g}") for x in raw["logLR"])  # small in the status


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"canary": None, "baseline": "x", "logLR": None},
        {"logLR": [1.0, 2.0]},  # another grid of alternatives
        {"logLR": ["a"] * len(statistics.MULTIPLIERS)},
        {"canary": {"requests": -3, "bad": True}},
    ],
)
def test_unreadable_evidence_reads_as_fresh(raw: dict[str, object]) -> None:
    assert decode(Evidence, raw, "evidence") == statistics.new_evidence()


def test_calls_round_trip_through_the_status() -> None:
    evidence = statistics.update(
        statistics.new_evidence(), 1.5, Counts(100, 8, 12.5, 1.0), Counts(300, 3, 37.5, 3.0)
    )
    raw = json.loads(json.dumps(encode(evidence), allow_nan=False))
    assert raw["canary"] == {"requests": 100, "bad": 8, "calls": 12.5, "badCalls": 1.0}
    back = decode(Evidence, raw, "evidence")
    assert (back.canary, back.baseline) == (evidence.canary, evidence.baseline)


def test_partial_evidence_keeps_what_it_has() -> None:
    back = decode(Evidence, {"canary": {"requests": 12, "bad": 2}}, "evidence")
    assert back.canary == Counts(12, 2)
    assert back.baseline == Counts(0, 0)
    assert back.log_lr == statistics.new_evidence().log_lr


# -- the latency bound -----------------------------------------------------------------------


def cumulative(*pairs: tuple[float, float]) -> list[tuple[float, float]]:
    return [*pairs]


def test_the_bound_is_the_bucket_bound_nearest_the_quantile() -> None:
    # p95 between 0.1 (91.7% below) and 0.25 (99.94% below): 0.1 leaves 8.3% slower, 0.25
    # leaves 0.06%; 0.1 is nearer to 5% by ratio.
    b = cumulative((0.05, 500.0), (0.1, 917.0), (0.25, 999.4), (0.5, 1000.0), (math.inf, 1000.0))
    assert statistics.slow_bound(b, 0.95) == 0.1
    # 30% slower than 0.1, 4% slower than 0.25: 0.25 is nearer.
    b = cumulative((0.1, 700.0), (0.25, 960.0), (math.inf, 1000.0))
    assert statistics.slow_bound(b, 0.95) == 0.25
    # Exactly at the quantile: that bound (5% slower).
    b = cumulative((0.1, 80.0), (0.25, 95.0), (0.5, 100.0), (math.inf, 100.0))
    assert statistics.slow_bound(b, 0.95) == 0.25


def test_a_baseline_in_one_bucket_gets_the_bound_above_it_not_below() -> None:
    """Every baseline request between 25 and 50 ms: below 25 ms nothing, so every request
    would be "slow" at 25 ms, and a canary could never look worse. The bound is 50 ms (found
    on the real stack: a canary twice as slow passed against 25 ms)."""
    b = cumulative((0.01, 0.0), (0.025, 0.0), (0.05, 504.0), (0.1, 504.0), (math.inf, 504.0))
    assert statistics.slow_bound(b, 0.95) == 0.05


def test_the_bound_at_the_edges() -> None:
    assert statistics.slow_bound([], 0.95) is None
    assert statistics.slow_bound([(0.1, 0.0), (math.inf, 0.0)], 0.95) is None
    assert statistics.slow_bound([(math.inf, 10.0)], 0.95) is None
    # The quantile in the +Inf bucket: the largest finite bound.
    assert statistics.slow_bound([(0.1, 1.0), (30.0, 2.0), (math.inf, 10.0)], 0.95) == 30.0
    # In the first bucket: its bound.
    assert statistics.slow_bound([(0.1, 99.0), (0.25, 100.0), (math.inf, 100.0)], 0.95) == 0.1
    with pytest.raises(ValueError, match="quantile"):
        statistics.slow_bound([(math.inf, 1.0)], 1.0)


def test_over_counts_the_requests_slower_than_the_bound() -> None:
    b = cumulative((0.05, 40.0), (0.1, 90.0), (0.25, 99.0), (math.inf, 100.0))
    assert statistics.over(b, 0.1) == 10.0
    assert statistics.over(b, 0.25) == 1.0
    assert statistics.over(b, math.inf) == 0.0
    assert statistics.over([], 0.1) == 0.0  # a version that never answered
    with pytest.raises(ValueError, match="bucket bound"):
        statistics.over(b, 0.2)

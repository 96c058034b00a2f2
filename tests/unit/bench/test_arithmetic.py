"""SLO checks, the goodput search, spread over rounds, and the sweep's recommendation."""

from __future__ import annotations

from modelroll_bench.arithmetic import (
    Point,
    goodput_by_setting,
    goodput_windows,
    median_points,
    meets_slo,
    next_probe,
    recommend,
)
from modelroll_bench.metrics import BatchCounters, parse_model_stats, parse_sidecar_metrics


def row(p99: float | None, requests: int = 1000, **errors: int) -> dict[str, object]:
    return {"p99_ms": p99, "requests": requests, "errors": errors}


def test_a_run_meets_the_slo_with_its_p99_and_almost_no_errors() -> None:
    assert meets_slo(row(149.9), 150)
    assert not meets_slo(row(150.1), 150)
    assert meets_slo(row(100, **{"429": 1}), 150)  # 0.1%
    assert not meets_slo(row(100, **{"429": 2}), 150)
    assert not meets_slo(row(0, requests=0), 150)
    assert not meets_slo(row(None), 150)  # the p99 request was never answered


def test_goodput_search_tries_the_ceiling_then_bisects() -> None:
    assert next_probe([100, 200], [], ceiling=400) == 400
    assert next_probe([100, 200], [400], ceiling=400) == 300
    assert next_probe([100, 200, 300], [400], ceiling=400) == 350
    assert next_probe([], [50], ceiling=90) == 25


def test_goodput_search_stops_when_the_ceiling_passes_or_noise_crosses() -> None:
    assert next_probe([100, 400], [], ceiling=400) is None
    assert next_probe([300], [200], ceiling=400) is None


def sweep_table() -> list[Point]:
    """A synthetic sweep: (batch, wait) at rates 100..400, p99 given by hand."""
    p99 = {
        (8, 2.0): [20, 30, 500, 900],  # saturates early
        (16, 5.0): [40, 50, 80, 400],
        (32, 10.0): [60, 70, 90, 140],  # the only one within 150 ms at 400
        (32, 2.0): [30, 40, 85, 135],  # ties with (32, 10) on goodput, lower p99
        (64, 20.0): [90, 100, 120, 130],  # but fails 1% of requests at 400 (429: queue full)
    }
    points = []
    for (b, w), values in p99.items():
        for rate, lat in zip((100, 200, 300, 400), values, strict=True):
            errors = 0.01 if (b, rate) == (64, 400) else 0.0
            points.append(Point(b, w, rate, rate * (0.995 - errors), lat, errors))
    return points


def test_goodput_is_each_settings_best_rate_within_the_slo() -> None:
    best = goodput_by_setting(sweep_table(), slo_p99_ms=150)
    assert best[(8, 2.0)].offered_rps == 200
    assert best[(16, 5.0)].offered_rps == 300
    assert best[(64, 20.0)].offered_rps == 300  # 400 failed requests
    assert best[(32, 10.0)].offered_rps == 400


def test_recommendation_takes_top_goodput_then_lowest_p99() -> None:
    pick = recommend(sweep_table(), slo_p99_ms=150)
    assert pick is not None
    assert (pick.max_batch, pick.max_wait_ms) == (32, 2.0)
    assert pick.p99_ms == 135


def test_a_tighter_slo_moves_the_recommendation_to_small_batches() -> None:
    pick = recommend(sweep_table(), slo_p99_ms=60)
    assert pick is not None
    assert (pick.max_batch, pick.max_wait_ms, pick.goodput_rps) == (8, 2.0, 199.0)


def test_no_recommendation_when_nothing_meets_the_slo() -> None:
    assert recommend(sweep_table(), slo_p99_ms=10) is None


def test_sweep_rounds_combine_as_medians_and_a_missing_run_fails() -> None:
    rounds = [
        [Point(8, 2.0, 100, 99, 40), Point(8, 2.0, 200, 199, 90)],
        [Point(8, 2.0, 100, 101, 60), Point(8, 2.0, 200, 198, 400)],  # one noisy run
        [Point(8, 2.0, 100, 100, 50), Point(8, 2.0, 200, 200, 100)],
    ]
    low, high = median_points(rounds)
    assert (low.throughput_rps, low.p99_ms) == (100, 50)
    assert (high.throughput_rps, high.p99_ms) == (199, 100)
    assert high.meets(150)
    rounds[2] = rounds[2][:1]  # the last round stopped before 200 req/s
    _, high = median_points(rounds)
    assert high.p99_ms == 400
    assert not high.meets(150)


def test_errors_disqualify_a_point() -> None:
    assert not Point(8, 2.0, 100, 99.9, 10, error_fraction=0.01).meets(150)


def test_batch_counters_from_sidecar_metrics_and_model_stats() -> None:
    text = """# TYPE modelroll_batch_size histogram
modelroll_batch_size_bucket{model="m",version="v",le="+Inf"} 4.0
modelroll_batch_size_count{model="m",version="v"} 4.0
modelroll_batch_size_sum{model="m",version="v"} 40.0
# TYPE modelroll_batches_total counter
modelroll_batches_total{model="m",version="v",reason="full"} 3.0
modelroll_batches_total{model="m",version="v",reason="timeout"} 1.0
"""
    before = parse_sidecar_metrics(text)
    assert (before.batches, before.items, before.mean_batch) == (4.0, 40.0, 10.0)
    after = BatchCounters(10.0, 100.0, {"full": 8.0, "timeout": 2.0})
    delta = after - before
    assert delta.summary() == {
        "batches": 6,
        "items": 60,
        "mean_batch": 10.0,
        "useful_tokens": 0,
        "padded_tokens": 0,
        "padding_efficiency": None,
        "closed_by": {"full": 5, "timeout": 1},
    }
    stats = parse_model_stats(
        {"batches": 5, "items": 12, "batch_sizes": [], "max_parallel_seen": 1}
    )
    assert stats.mean_batch == 2.4
    assert BatchCounters().mean_batch is None


def test_goodput_windows_count_answers_within_the_slo_by_arrival() -> None:
    timeline = [
        (0, 0.5, 0.1),  # before the first window
        (1, 1.2, 0.1),
        (2, 1.9, 0.3),  # answered, but past the SLO
        (3, 2.1, None),  # unanswered
        (4, 2.5, 0.2),
        (5, 2.6, 0.05),
        (6, 3.5, 0.1),  # after the last window
    ]
    assert goodput_windows(timeline, 1.0, 1.0, 2, slo_s=0.2) == [1.0, 2.0]
    assert goodput_windows(timeline, 1.0, 0.5, 4, slo_s=0.2) == [2.0, 0.0, 0.0, 4.0]

"""The batching simulator (bench/modelroll_bench/simulate.py): the sidecar's Batcher in virtual
time on a cost surface, checked where the answer is known in closed form, and the grid search
of the best static configuration on a surface where padding costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelroll_bench import results
from modelroll_bench.figures import LoadSummary, OpenRun
from modelroll_bench.lengths import parse
from modelroll_bench.simulate import (
    Figures,
    Found,
    Grid,
    Search,
    Trace,
    best_static,
    pick,
    saturation_rps,
    search,
    simulate,
    table,
)
from modelroll_bench.simulate_check import Pair, compared, line
from modelroll_bench.surface import Point, Surface, fit
from modelroll_bench.systems import Batching

NO_BATCHING = Batching(max_batch=1)
PADDED = Surface(call=0.001, token=0.0002)
"""Cost follows padded tokens, with a small fixed part: where first-in-first-out batching
loses to batching by length (and to no batching)."""
BIMODAL = parse("bimodal:8,16,100,200,0.2").sample(500, seed=1)


def test_a_constant_cost_without_batching_saturates_at_one_over_the_cost() -> None:
    assert saturation_rps(NO_BATCHING, Surface(call=0.010), [7], 200) == pytest.approx(100.0)


def test_a_full_batch_closes_when_its_last_request_arrives() -> None:
    trace = Trace((0.0, 0.001, 0.002, 0.003), (5, 5, 5, 5), 0.003)
    found = simulate(Batching(max_batch=4, max_wait_ms=1000), Surface(call=0.010), trace)
    assert found.batches == 1
    assert found.mean_batch == 4
    assert sorted(round(s * 1000, 6) for s in found.run.latencies_s) == [10, 11, 12, 13]


def test_a_lone_request_waits_max_wait_then_the_model() -> None:
    trace = Trace((0.0,), (5,), 1.0)
    found = simulate(Batching(max_batch=8, max_wait_ms=5), Surface(call=0.010), trace)
    assert found.run.latencies_s == [pytest.approx(0.015)]


def test_a_batch_costs_what_the_surface_says_for_its_size_and_longest_length() -> None:
    surface = Surface(call=0.002, row=0.001, token=0.0001, token_squared=0.000001)
    trace = Trace((0.0, 0.0, 0.0), (10, 30, 20), 0.0)
    found = simulate(Batching(max_batch=3, max_wait_ms=0), surface, trace)
    expected = 0.002 + 3 * (0.001 + 0.0001 * 30 + 0.000001 * 30 * 30)
    assert found.run.latencies_s == [pytest.approx(expected)] * 3
    assert found.padding_efficiency == pytest.approx(60 / 90)


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    config = Batching(batch_by="length")

    def run(seed: int) -> Figures:
        trace = Trace.poisson(200.0, 2.0, BIMODAL, seed=seed)
        return simulate(config, PADDED, trace, noise=0.2, seed=seed).figures(300.0)

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_the_grid_beats_first_in_first_out_to_32_where_padding_costs() -> None:
    fifo = Batching(max_batch=32, max_wait_ms=10, length_from="tokenizer")
    grid = Grid(max_batch=(1, 8, 32), max_wait_ms=(0.0, 10.0), max_batch_tokens=(0, 512))
    rate = 0.7 * saturation_rps(NO_BATCHING, PADDED, BIMODAL, 300)
    config, best = best_static(PADDED, BIMODAL, rate, 300.0, grid=grid, requests=400)
    trace = Trace.poisson(rate, 400 / rate, BIMODAL)
    theirs = simulate(fifo, PADDED, trace).figures(300.0)
    assert config != fifo
    assert best.meets_slo
    assert not theirs.meets_slo
    assert best.within_slo_rps > theirs.within_slo_rps


def test_a_grid_lists_each_distinct_configuration_once() -> None:
    configs = Grid(max_batch=(1, 4), max_wait_ms=(0.0, 5.0), max_batch_tokens=(0, 64)).configs(16)
    assert [c.max_batch for c in configs].count(1) == 1  # nothing to wait for or choose
    assert all(c.max_batch_tokens == 0 for c in configs)  # 64 >= 4 x 16: no budget at all
    assert len(configs) == 1 + 2 * 2  # by arrival and by length, two waits each


def test_ties_in_goodput_go_to_the_lower_p99() -> None:
    def row(within: float, p99: float, meets: bool = True) -> Figures:
        return Figures("", within, within, meets, 1.0, p99, p99, 1.0, 1.0)

    rows = [
        (Batching(max_batch=2), row(100.0, 90.0)),
        (Batching(max_batch=4), row(99.5, 50.0)),
        (Batching(max_batch=8), row(120.0, 400.0, meets=False)),
    ]
    assert pick(rows)[0] == Batching(max_batch=4)


def test_a_recorded_trace_loads_and_scales_to_a_rate(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([[0.5, 10], [1.0, 20], [2.0, 30]]))
    trace = Trace.load(path)
    assert trace.lengths == (10, 20, 30)
    assert trace.at_rate(3.0).arrivals == pytest.approx((0.25, 0.5, 1.0))


@pytest.mark.parametrize(
    ("text", "why"),
    [('{"a": 1}', "not a JSON list"), ("[[1.0]]", "not a JSON list"), ("[]", "empty")],
)
def test_a_bad_trace_is_refused_with_the_reason(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "trace.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=why):
        Trace.load(path)


def test_arrivals_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="must not go back"):
        Trace((1.0, 0.5), (1, 1), 1.0)


def test_the_fit_recovers_a_surface_and_keeps_its_terms_non_negative() -> None:
    truth = Surface(call=0.003, row=0.0005, token=0.0002, token_squared=0.000001)
    points = [
        Point(size, length, truth.seconds(size, length))
        for size in (1, 2, 4, 8, 16, 32)
        for length in (8, 32, 128)
    ]
    found = fit(points)
    for name in ("call", "row", "token", "token_squared"):
        assert getattr(found, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    # Durations that fall with size would need a negative term: the fit has none.
    falling = [Point(size, 10, 0.010 / size) for size in (1, 2, 4, 8)]
    assert min(vars(fit(falling)).values()) >= 0.0


def test_a_file_without_a_surface_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "surface.json"
    path.write_text(json.dumps({"terms": {"call": 0.001}}))
    with pytest.raises(ValueError, match="holds no cost surface"):
        Surface.load(path)


def test_a_search_renders_its_table_and_reads_back_from_its_json() -> None:
    grid = Grid(max_batch=(1, 8), max_wait_ms=(0.0,), max_batch_tokens=(0,))
    found = search(PADDED, BIMODAL, Search(shares=(0.5,), requests=200, grid=grid))
    [load] = found.loads
    assert load.best.name == load.best_config.name
    assert len(load.best_at_other_seeds) == 2
    assert load.fifo_32 is None  # not in this grid
    text = table(found, 300.0)
    assert load.best.name.replace(", lengths from the tokenizer", "") in text
    assert text.splitlines()[-1].endswith("-")  # no FIFO 32 figure
    assert results.from_json(Found, results.to_json(found)) == found


def test_the_check_compares_each_figure_and_leaves_out_what_was_not_measured() -> None:
    simulated = Figures("", 100.0, 90.0, True, 10.0, 20.0, 40.0, 4.0, 1.0)
    load = LoadSummary("sidecar", 50.0, 80.0, 400, 400, {}, 12.0, 30.0, None)
    found = compared("sidecar", 0.5, 50.0, simulated, OpenRun(load, None, 90.0, []))
    assert found.throughput_rps == Pair(100.0, 80.0, 1.25)
    assert found.p50_ms == Pair(10.0, 12.0, 0.833)
    assert found.p99_ms == Pair(40.0, None, None)  # fell among unanswered requests
    assert found.mean_batch == Pair(4.0, None)
    assert line(found).endswith("4.0 / -")

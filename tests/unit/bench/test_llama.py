"""The real-engine benchmark's own arithmetic: its prompts, its ratios over rounds, its
summary and targets. The engine itself runs in ``make bench-llama``, not here."""

from __future__ import annotations

from dataclasses import replace

from modelroll_bench.llama import (
    QUICK,
    Measured,
    Slots,
    SlotsRate,
    SlotsRun,
    SlotsSaturation,
    chat_prompts,
    checks,
    label,
    median_ratios,
    render,
    summarize_run,
)
from modelroll_bench.llm_load import StreamSummary, summarize
from modelroll_bench.stats import Spread


def test_the_prompts_are_distinct_and_the_same_for_a_seed() -> None:
    prompts = chat_prompts(1)
    assert len(prompts) == len(set(prompts)) == 150
    assert chat_prompts(1) == prompts
    assert chat_prompts(2) != prompts


def clients(output_tps: float, ttft_p99_ms: float, bound: bool = False) -> StreamSummary:
    found = summarize([], 1.0)
    at_least = ["ttft_p99_ms"] if bound else []
    return replace(found, output_tps=output_tps, ttft_p99_ms=ttft_p99_ms, at_least=at_least)


def rate(many: StreamSummary, one: StreamSummary) -> SlotsRate:
    runs = {label(QUICK.slots): SlotsRun(many, 0.0, False), label(1): SlotsRun(one, 0.0, False)}
    return SlotsRate(2.0, 0.5, runs)


def test_ratios_are_medians_over_rounds_of_exact_ratios_only() -> None:
    one = clients(100.0, 100.0)
    rounds = [
        [rate(clients(120.0, 50.0), one)],
        [rate(clients(140.0, 900.0, bound=True), one)],
        [rate(clients(130.0, 70.0), one)],
    ]
    [row] = median_ratios(rounds, QUICK.slots)
    assert row.rate_rps == 2.0
    assert row.figures["output_tps"] == Spread(median=1.3, low=1.2, high=1.4, rounds=3)
    assert row.figures["ttft_p99_ms"] == Spread(median=0.6, low=0.5, high=0.7, rounds=2)  # no bound
    assert row.figures["e2e_p50_ms"] is None


def saturated(output_tps: float | None) -> SlotsSaturation:
    return SlotsSaturation(1, 8, output_tps, 1.0, None, None, 0, {})


def test_slots_that_serve_no_more_than_one_miss_the_target() -> None:
    for many, met in ((125.0, True), (100.0, False), (None, False)):
        found = Slots({label(QUICK.slots): saturated(many), label(1): saturated(100.0)}, 1.0, [])
        summary = summarize_run(QUICK, Measured(slots=found))
        [(target, ok, measured)] = checks(QUICK, summary)
        assert ok is met, (target, measured)
        assert "Saturation (closed loop)" in render(QUICK, summary)

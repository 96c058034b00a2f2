"""The real-engine benchmark's own arithmetic: its prompts, its ratios over rounds, its
targets. The engine itself runs in ``make bench-llama``, not here."""

from __future__ import annotations

from typing import Any

from modelroll_bench.llama import QUICK, chat_prompts, checks, median_ratios
from modelroll_bench.stats import Spread


def test_the_prompts_are_distinct_and_the_same_for_a_seed() -> None:
    prompts = chat_prompts(1)
    assert len(prompts) == len(set(prompts)) == 150
    assert chat_prompts(1) == prompts
    assert chat_prompts(2) != prompts


def ratio(value: float | None, relation: str = "=") -> dict[str, Any]:
    return {"ratio": value, "is": relation}


def test_ratios_are_medians_over_rounds_of_exact_ratios_only() -> None:
    rounds = [
        [{"rate_rps": 2.0, "ratio": {"output_tps": ratio(1.2), "ttft_p99_ms": ratio(0.5)}}],
        [{"rate_rps": 2.0, "ratio": {"output_tps": ratio(1.4), "ttft_p99_ms": ratio(9, ">=")}}],
        [{"rate_rps": 2.0, "ratio": {"output_tps": ratio(1.3), "ttft_p99_ms": ratio(0.7)}}],
    ]
    [row] = median_ratios(rounds)
    assert row["output_tps"] == Spread(median=1.3, low=1.2, high=1.4, rounds=3)
    assert row["ttft_p99_ms"] == Spread(median=0.6, low=0.5, high=0.7, rounds=2)  # no bound
    assert row["e2e_p50_ms"] is None


def test_slots_that_serve_no_more_than_one_miss_the_target() -> None:
    for found, met in ((1.25, True), (1.0, False), (None, False)):
        report = {"setup": {"slots": QUICK.slots}, "slots": {"saturation_ratio": found}}
        [(target, ok, measured)] = checks(report)
        assert ok is met, (target, measured)

"""How make bench turns rounds into medians, ranges and ratios to the sidecar (nothing timed)."""

from __future__ import annotations

from typing import Any

from modelroll_bench.compare import BASELINE, Setup, aggregate


def row(round_no: int, rps: float, p99_at_30: float | None) -> dict[str, Any]:
    shares: dict[str, Any] = {"0.3": {"share": 0.3, "p50_ms": 1.0, "p95_ms": 2.0}}
    if p99_at_30 is None:
        shares["0.3"] = {"share": 0.3, "skipped": "beyond saturation"}
    else:
        shares["0.3"]["p99_ms"] = p99_at_30
    return {
        "round": round_no,
        "saturation": {"rps": rps},
        "goodput": {"rps": rps / 2},
        "shares": shares,
    }


SETUP = Setup(shares=(0.3,))


def test_ratios_are_taken_round_by_round_then_the_median() -> None:
    rounds = {
        BASELINE: [row(1, 100, 10), row(2, 200, 20), row(3, 100, 30)],
        "other": [row(1, 50, 20), row(2, 300, 20), row(3, 90, 90)],
    }
    summary = aggregate(SETUP, rounds, limit=100)
    sat = summary["other"]["saturation_rps"]
    assert sat["value"]["median"] == 90
    assert (sat["ratio_to_baseline"]["median"], sat["ratio_to_baseline"]["low"]) == (0.9, 0.5)
    assert sat["ratio_to_baseline"]["high"] == 1.5
    p99 = summary["other"]["p99_at_30%"]["ratio_to_baseline"]
    assert (p99["median"], p99["low"], p99["high"]) == (2.0, 1.0, 3.0)
    assert summary[BASELINE]["saturation_of_limit"] == 1.0


def test_a_round_missing_from_the_baseline_is_left_out_of_the_ratios() -> None:
    rounds = {
        BASELINE: [row(1, 100, 10), row(3, 100, 10)],  # round 2 did not start
        "other": [row(1, 50, 20), row(2, 999, 20), row(3, 70, 30)],
    }
    sat = aggregate(SETUP, rounds, limit=100)["other"]["saturation_rps"]
    assert sat["ratio_to_baseline"]["rounds"] == 2
    assert sat["ratio_to_baseline"]["median"] == 0.6


def test_without_the_baseline_there_are_no_ratios_and_skipped_rates_have_no_value() -> None:
    summary = aggregate(SETUP, {"other": [row(1, 50, None)]}, limit=100)
    assert summary["other"]["saturation_rps"]["ratio_to_baseline"] is None
    assert summary["other"]["p99_at_30%"]["value"] is None

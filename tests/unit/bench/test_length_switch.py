"""The length switch's figures: goodput by window, ratios paired by round, and when the
sidecar's defaults are back near the best static configuration (nothing timed)."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_bench.length_switch import Switch, parse_switch, recovery_s, summarize
from modelroll_bench.stats import Spread


def run(round_no: int, before: float, windows: list[float]) -> dict[str, Any]:
    return {"round": round_no, "before_rps": before, "windows_rps": windows}


def test_ratios_to_the_best_static_are_paired_by_round_window_by_window() -> None:
    rounds = {
        "base": [run(1, 10, [10, 10]), run(2, 10, [10, 10])],
        "best": [run(1, 20, [20, 40]), run(2, 20, [40, 40])],
        "mine": [run(1, 20, [10, 40]), run(2, 20, [40, 40])],
    }
    summary = summarize(rounds, "base", "best")
    w0, w1 = summary["mine"]["w0"], summary["mine"]["w1"]
    assert w0.value == Spread(median=25, low=10, high=40, rounds=2)
    assert w0.ratio_to_best_static == Spread(median=0.75, low=0.5, high=1.0, rounds=2)
    assert w1.ratio_to_baseline == Spread(median=4.0, low=4.0, high=4.0, rounds=2)
    assert list(summary["mine"]) == ["before", "w0", "w1"]


def test_recovery_is_the_first_window_from_which_it_stays_within_five_percent() -> None:
    rounds = {
        "best": [run(1, 10, [10, 10, 10, 10])],
        "mine": [run(1, 10, [5, 9.6, 9.4, 9.5])],
    }
    assert recovery_s(summarize(rounds, "base", "best")["mine"], 5.0) == 15.0
    rounds["mine"] = [run(1, 10, [5, 9.6, 9.5, 9.0])]
    assert recovery_s(summarize(rounds, "base", "best")["mine"], 5.0) is None


def test_without_the_best_static_there_is_no_recovery_time() -> None:
    summary = summarize({"mine": [run(1, 10, [10])]}, "base", "best")
    assert recovery_s(summary["mine"], 5.0) is None


def test_the_switch_takes_two_length_distributions() -> None:
    assert parse_switch(f"{Switch().before},{Switch().after}") == (Switch().before, Switch().after)
    with pytest.raises(ValueError, match="two length distributions"):
        parse_switch("lognormal:2,0.5")
    assert Switch(half_s=40, window_s=5).windows == 8

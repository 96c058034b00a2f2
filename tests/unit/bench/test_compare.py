"""How make bench configures its systems and turns rounds into medians, ranges, ratios to no
batching and targets (nothing timed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from modelroll_bench import compare, results
from modelroll_bench.compare import (
    BASELINE,
    BEST_STATIC,
    DEFAULTS,
    TEI,
    Goodput,
    Round,
    Setup,
    ShareRun,
    _best_static,
    aggregate,
    checks,
    unavailable,
)
from modelroll_bench.figures import LoadSummary, OpenRun
from modelroll_bench.runs import Saturated
from modelroll_bench.stats import Spread
from modelroll_bench.systems import Batching
from modelroll_bench.wrk import WrkResult


def load(
    p50: float | None = None, p95: float | None = None, p99: float | None = None
) -> LoadSummary:
    return LoadSummary("", None, 1.0, 100, 100, {}, p50, p95, p99)


def a_round(
    round_no: int,
    rps: float,
    goodput: float,
    shares: dict[float, OpenRun],
) -> Round:
    """A round with the figures given; every other figure empty."""
    saturated = Saturated(WrkResult("", rps, 1000, 0, 0, 1.0, 2.0), None)
    found = {str(s): ShareRun(s, run) for s, run in shares.items()}
    return Round(
        round_no, 0.0, 1.0, saturated, 1.0, found, Goodput(goodput, None, None, None, []), None
    )


def row(round_no: int, rps: float, p99_at_30: float | None) -> Round:
    """Saturation ``rps``, goodput half of it, and at 30% load p99 ``p99_at_30`` (None: that
    load was not run)."""
    shares = {} if p99_at_30 is None else {0.3: OpenRun(load(1.0, 2.0, p99_at_30), None, None, [])}
    return a_round(round_no, rps, rps / 2, shares)


SETUP = Setup(shares=(0.3,))


def test_ratios_are_taken_round_by_round_then_the_median() -> None:
    rounds = {
        BASELINE: [row(1, 100, 10), row(2, 200, 20), row(3, 100, 30)],
        "other": [row(1, 50, 20), row(2, 300, 20), row(3, 90, 90)],
    }
    summary = aggregate(SETUP, rounds, limit=100)
    sat = summary["other"]["saturation_rps"]
    assert sat.value == Spread(median=90, low=50, high=300, rounds=3)
    assert sat.ratio_to_baseline == Spread(median=0.9, low=0.5, high=1.5, rounds=3)
    p99 = summary["other"]["p99_at_30%"].ratio_to_baseline
    assert p99 == Spread(median=2.0, low=1.0, high=3.0, rounds=3)
    assert summary[BASELINE]["saturation_of_limit"] == 1.0
    assert results.from_json(Round, results.to_json(rounds["other"][0])) == rounds["other"][0]


def test_a_round_missing_from_the_baseline_is_left_out_of_the_ratios() -> None:
    rounds = {
        BASELINE: [row(1, 100, 10), row(3, 100, 10)],  # round 2 did not start
        "other": [row(1, 50, 20), row(2, 999, 20), row(3, 70, 30)],
    }
    sat = aggregate(SETUP, rounds, limit=100)["other"]["saturation_rps"]
    assert sat.ratio_to_baseline is not None
    assert (sat.ratio_to_baseline.rounds, sat.ratio_to_baseline.median) == (2, 0.6)


def test_without_the_baseline_there_are_no_ratios_and_skipped_rates_have_no_value() -> None:
    summary = aggregate(SETUP, {"other": [row(1, 50, None)]}, limit=100)
    assert summary["other"]["saturation_rps"].ratio_to_baseline is None
    assert summary["other"]["p99_at_30%"].value is None


def slo_row(round_no: int, within: float) -> Round:
    """A round with only goodput figures: within-SLO req/s at 10% load and under the SLO."""
    at_low = OpenRun(load(p50=within / 10), None, within, [])
    return a_round(round_no, 0.0, within, {0.1: at_low})


LOW = Setup(shares=(0.1,))


def test_every_sidecar_row_but_the_defaults_passes_every_batching_flag() -> None:
    rows = {s.label: s for s in Setup().systems()}
    fifo = rows["sidecar FIFO, B=32 10 ms"].argv(1, "http://m", 1)
    for flag, value in [
        ("--max-batch-size", "32"),
        ("--max-wait-ms", "10"),
        ("--max-batch-tokens", "0"),
        ("--batch-by", "arrival"),
        ("--wait-policy", "fixed"),
        ("--length-from", "words"),
    ]:
        assert fifo[fifo.index(flag) + 1] == value
    defaults = rows[DEFAULTS].argv(1, "http://m", 1)
    batching = {"--max-batch-size", "--max-wait-ms", "--max-batch-tokens", "--batch-by"}
    assert not batching & set(defaults) | {"--wait-policy", "--length-from"} & set(defaults)
    assert "--max-queue-size" in defaults


def test_the_tei_row_never_waits_and_closes_batches_at_a_padded_token_budget() -> None:
    tei = {s.label: s for s in Setup().systems()}[TEI].argv(1, "http://m", 1)
    assert tei[tei.index("--max-wait-ms") + 1] == "0"
    assert tei[tei.index("--batch-by") + 1] == "arrival"
    assert tei[tei.index("--max-batch-tokens") + 1] == str(32 * 256)


def test_the_best_static_row_runs_only_when_given_and_per_load_where_given() -> None:
    assert BEST_STATIC not in {s.label for s in Setup().systems()}
    setup = Setup(
        shares=(0.1, 0.5),
        best_static=(("", "--batch-by length --max-wait-ms 0"), ("0.5", "--max-batch-size 8")),
    )
    [best] = [s for s in setup.systems() if s.label == BEST_STATIC]
    assert (best.batching.batch_by, best.batching.max_wait_ms) == ("length", 0)
    per_load = setup.share_systems(best)
    assert list(per_load) == [0.5]
    # Each entry is a whole configuration over the FIFO row's, not over the other entry.
    assert (per_load[0.5].batching.max_batch, per_load[0.5].batching.batch_by) == (8, "arrival")


def test_best_static_flags_are_checked_before_anything_runs() -> None:
    assert _best_static("0.5=--max-wait-ms=0") == ("0.5", "--max-wait-ms=0")
    assert _best_static("--max-wait-ms=0") == ("", "--max-wait-ms=0")
    assert _best_static("switch=--batch-by length") == ("switch", "--batch-by length")
    for bad in ("--batch-by sorted", "--timeout-ms 5", "half=--max-wait-ms 0"):
        with pytest.raises(argparse.ArgumentTypeError):
            _best_static(bad)


def test_batching_from_flags_applies_them_over_a_base() -> None:
    base = Batching(length_from="tokenizer")
    got = Batching.from_flags("--batch-by length --max-batch-size 16 --max-wait-ms 0", base)
    assert got == Batching(16, 0.0, 0, "length", "fixed", "tokenizer")
    with pytest.raises(ValueError, match="not a batching flag: --upstream"):
        Batching.from_flags("--upstream http://x", base)


def test_the_defaults_are_judged_against_no_batching_and_the_best_static_at_every_load() -> None:
    rounds = {
        BASELINE: [slo_row(1, 100), slo_row(2, 100)],
        BEST_STATIC: [slo_row(1, 120), slo_row(2, 200)],
        DEFAULTS: [slo_row(1, 118), slo_row(2, 180)],
    }
    found = {(t, s): (met, m) for t, s, met, m in checks(LOW, aggregate(LOW, rounds, 1))}
    at_low = "at 10% load, requests/s answered within the SLO"
    assert found[(f"{at_low} not below {BASELINE}'s", DEFAULTS)][0]
    # 118/120 and 180/200: the median of paired ratios, 0.94, misses 0.95.
    met, measured = found[(f"{at_low} at least 0.95x {BEST_STATIC}'s", DEFAULTS)]
    assert not met
    assert "0.94x" in measured
    assert {s for _, s in found} == {DEFAULTS}


def test_at_low_load_the_defaults_p50_is_judged_against_no_batching() -> None:
    rounds = {BASELINE: [slo_row(1, 100)], DEFAULTS: [slo_row(1, 115)]}
    found = {t: met for t, _, met, _ in checks(LOW, aggregate(LOW, rounds, 1))}
    [p50] = [t for t in found if "p50" in t]
    assert not found[p50]  # 11.5 ms against 10 ms


def test_bentoml_is_reported_unavailable_without_its_virtualenv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(compare, "BENTOML_PYTHON", tmp_path / "python")
    [bento] = [s for s in Setup().systems() if s.kind == "bentoml"]
    assert "make bentoml" in (unavailable(bento) or "")

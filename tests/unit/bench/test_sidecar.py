"""The sidecar suite's summary, table and targets, from measurements made up here; and the
harness writing them to JSON and rendering them again from it (nothing here is timed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from modelroll_bench.cli import build_parser
from modelroll_bench.figures import Latency, LoadSummary, Rate
from modelroll_bench.results import write
from modelroll_bench.sidecar import (
    SUITE,
    AtShare,
    Measured,
    Setup,
    SystemRun,
    ZeroCostRound,
    checks,
    render,
    summarize,
)
from modelroll_bench.suite import Report
from modelroll_bench.wrk import WrkResult

SETUP = Setup(duration_s=1, rounds=3, shares=(0.3, 0.7))


def load(p50: float, p95: float, p99: float | None) -> LoadSummary:
    return LoadSummary("x", 100.0, 100.0, 100, 100, {}, p50, p95, p99)


def measured(p99_at_70: float | None = 80.0) -> Measured:
    limit = SETUP.model_limit_rps
    return Measured(
        systems=[
            SystemRun(
                "no batching",
                WrkResult("no batching", 0.066 * limit, 400, 0, 0, 900.0, 2000.0),
                1.0,
                [AtShare(0.3), AtShare(0.7)],
            ),
            SystemRun(
                "sidecar",
                WrkResult("sidecar", 0.967 * limit, 6000, 0, 0, 90.0, 120.0),
                32.0,
                [
                    AtShare(0.3, load(41.2, 54.6, 58.5), 3.1),
                    AtShare(0.7, load(57.6, 76.5, p99_at_70), 9.0),
                ],
            ),
        ],
        zero_cost=[
            ZeroCostRound(Rate(16_000.0, 68.0), Rate(16_400.0, 67.0)),
            ZeroCostRound(Rate(17_000.0, 69.0), Rate(15_300.0, 70.0)),
            ZeroCostRound(Rate(16_500.0, 68.1), Rate(16_500.0, 68.0)),
        ],
    )


def test_the_table_has_a_row_per_system_and_a_column_per_share() -> None:
    summary = summarize(SETUP, measured())
    [no_batching, sidecar] = summary.rows
    assert no_batching.at_share == [None, None]
    assert sidecar.at_share == [Latency(41.2, 54.6, 58.5), Latency(57.6, 76.5, 80.0)]
    assert sidecar.of_model_limit == 0.967
    table = render(SETUP, summary).splitlines()
    assert (
        "| p50 / p95 / p99 at 30% of the limit | p50 / p95 / p99 at 70% of the limit |"
        in (table[3])
    )
    assert table[5] == (
        "| no batching | 46.3 req/s = 6.6% of the limit (mean batch 1.0) | overloaded | "
        "overloaded |"
    )
    assert table[6].endswith("| 41.2 / 54.6 / 58.5 ms | 57.6 / 76.5 / 80.0 ms |")


def test_the_zero_cost_ratio_is_of_medians_and_paired_by_round() -> None:
    zero = summarize(SETUP, measured()).zero_cost
    assert zero.ratio == pytest.approx(16_400 / 16_500, abs=1e-3)
    assert zero.paired.by_round == [1.025, 0.9, 1.0]
    assert zero.cpu_ratio == pytest.approx(68.1 / 68.0, abs=1e-3)


@pytest.mark.parametrize(("p99", "met"), [(80.0, True), (200.0, False), (None, False)])
def test_the_p99_target_at_70_percent(p99: float | None, met: bool) -> None:
    found = {t: ok for t, ok, _ in checks(SETUP, summarize(SETUP, measured(p99)))}
    assert found["p99 at 70% load <= 1.1 x (max(max-wait, C) + C) + 2 ms"] is met
    assert found["saturation >= 95% of the model's limit"]


def test_a_saved_result_renders_the_same_tables_without_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sidecar.json"
    summary = summarize(SETUP, measured())
    write(Report("sidecar", SETUP, measured(), summary), out)
    again = tmp_path / "again.json"
    args = build_parser().parse_args(["sidecar", "--from", str(out), "--out", str(again)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert render(SETUP, summary) in printed
    assert "[met] saturation >= 95%" in printed
    assert SUITE.read(again) == (SETUP, measured(), {})


def test_a_saved_result_of_another_suite_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "other.json"
    out.write_text('{"suite": "gateway"}')
    with pytest.raises(SystemExit, match="not a sidecar result"):
        SUITE.main(argparse.Namespace(saved=out))

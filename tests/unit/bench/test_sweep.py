"""The sweep's medians, goodput and recommendation from runs made up here, and a saved sweep
judged again against another SLO from its JSON alone (nothing is run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelroll_bench.cli import build_parser
from modelroll_bench.figures import LoadSummary, OpenRun
from modelroll_bench.results import write
from modelroll_bench.runs import Scenario
from modelroll_bench.suite import Report
from modelroll_bench.sweep import SUITE, Measured, Setup, SweepRun, render, summarize
from modelroll_bench.systems import Batching

SETUP = Setup(
    scenario=Scenario(lengths="fixed:16", model="demo"),
    batches=(8, 32),
    waits_ms=(5.0,),
    shares=(0.5, 1.0),
    slo_ms=150.0,
    duration_s=1.0,
)


def run(batch: int, rate: float, p99: float | None) -> SweepRun:
    load = LoadSummary("", rate, rate, 100, 100, {}, 10.0, 20.0, p99)
    return SweepRun(1, Batching(batch, 5.0), OpenRun(load, None, None, []))


# 8 is within 150 ms only at 100 req/s, 32 at 200 too; within 100 ms both only at 100 req/s,
# where 8 has the lower p99.
MEASURED = Measured(
    {8: 150.0, 32: 200.0},
    [100.0, 200.0],
    [run(8, 100.0, 40.0), run(8, 200.0, 160.0), run(32, 100.0, 60.0), run(32, 200.0, 130.0)],
)


def test_the_recommendation_is_the_best_goodput_within_the_slo() -> None:
    summary = summarize(SETUP, MEASURED)
    assert [(g.max_batch, g.goodput_rps) for g in summary.goodput] == [(8, 100.0), (32, 200.0)]
    assert summary.recommendation is not None
    assert summary.recommendation.max_batch == 32
    assert "Recommended for p99 <= 150 ms: --max-batch-size 32" in render(SETUP, summary)


def test_a_p99_never_answered_fails_the_slo() -> None:
    measured = Measured({8: 150.0}, [100.0], [run(8, 100.0, None)])
    summary = summarize(Setup(batches=(8,), waits_ms=(5.0,)), measured)
    assert summary.recommendation is None
    assert summary.points[0].p99_low_ms is None


def test_a_saved_sweep_is_judged_again_against_another_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved, again = tmp_path / "sweep.json", tmp_path / "again.json"
    write(Report("sweep", SETUP, MEASURED, summarize(SETUP, MEASURED), [], {"cpus": 2}), saved)
    args = build_parser().parse_args(
        ["sweep", "--from", str(saved), "--slo-ms", "100", "--out", str(again)]
    )
    args.plots = tmp_path
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "Recommended for p99 <= 100 ms: --max-batch-size 8" in printed
    setup, measured, machine = SUITE.read(again)
    assert (setup.slo_ms, measured, machine) == (100.0, MEASURED, {"cpus": 2})
    assert (tmp_path / "bench-sweep.png").exists()

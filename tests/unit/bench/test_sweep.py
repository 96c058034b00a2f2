"""A saved sweep judged again against another SLO, from its JSON alone (nothing is run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelroll_bench.results import write
from modelroll_bench.runs import Scenario
from modelroll_bench.sweep import Setup, analyse, reanalyse

SETUP = Setup(
    scenario=Scenario(lengths="fixed:16", model="demo"),
    batches=(8, 32),
    waits_ms=(5.0,),
    shares=(0.5, 1.0),
    slo_ms=150.0,
    duration_s=1.0,
)


def run(batch: int, rate: float, p99: float) -> dict[str, Any]:
    return {
        "round": 1,
        "max_batch": batch,
        "max_wait_ms": 5.0,
        "offered_rps": rate,
        "throughput_rps": rate,
        "requests": 100,
        "errors": {},
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "batching": None,
    }


def test_a_saved_sweep_is_judged_again_against_another_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [run(8, 100.0, 40.0), run(8, 200.0, 160.0), run(32, 100.0, 60.0), run(32, 200.0, 130.0)]
    saved = tmp_path / "sweep.json"
    report = analyse(SETUP, rows, {8: 150.0, 32: 200.0}, tmp_path)
    write({**report, "machine": {"cpus": 2}}, saved)
    assert report["recommendation"]["max_batch"] == 32  # the only one within 150 ms at 200/s
    again = reanalyse(saved, 100.0, tmp_path)
    assert again["setup"] == Setup(**{**SETUP.__dict__, "slo_ms": 100.0})
    assert again["recommendation"]["max_batch"] == 8  # 100 req/s both; 8 has the lower p99
    assert again["machine"] == {"cpus": 2}
    assert "Recommended for p99 <= 100 ms: --max-batch-size 8" in capsys.readouterr().out

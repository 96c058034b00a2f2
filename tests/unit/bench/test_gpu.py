"""The GPU comparison's figures: the defaults against no batching and the best static
configuration at equal p95, and the carry folder's size check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelroll_bench import results
from modelroll_bench.encoder import BASELINE, SweepPoint
from modelroll_bench.figures import LoadSummary
from modelroll_bench.gpu import (
    CONFIGS,
    DEFAULTS,
    STATIC,
    Options,
    Report,
    headline,
    point_seconds,
    ratios,
    write_report,
)
from modelroll_bench.gpu_carry import TooLarge, carried_bytes, check_size

FIFO, LENGTH = STATIC[0].label, STATIC[-1].label


def point(label: str, concurrency: int, rps: float, p95: float) -> SweepPoint:
    load = LoadSummary(label, None, rps, 100, 100, {}, p95 / 2, p95, p95 * 2)
    return SweepPoint(1, concurrency, load)


SWEEP = [
    point(BASELINE, 1, 300, 4),
    point(BASELINE, 8, 320, 30),
    point(DEFAULTS, 1, 290, 5),
    point(DEFAULTS, 8, 900, 12),
    point(FIFO, 1, 200, 9),
    point(FIFO, 8, 700, 14),
    point(LENGTH, 1, 280, 4),
    point(LENGTH, 8, 1000, 25),
]

COSTS = {"median_sentence_alone_ms": 2.0, "longest_full_batch_ms": 20.0}


def test_the_defaults_are_compared_at_each_of_no_batchings_p95() -> None:
    found = ratios(SWEEP, CONFIGS)
    # At p95 30 ms the defaults served 900, no batching 320, the best static (by length) 1000.
    over_none = {e.concurrency: e.ratio for e in found.defaults_over_no_batching}
    over_static = {e.concurrency: e.ratio for e in found.defaults_over_best_static}
    assert over_none == {1: 0.0, 8: 2.81}  # at 4 ms the defaults had no point as fast
    assert over_static == {1: 0.0, 8: 0.9}
    assert found.static_over_no_batching[LENGTH][1].ratio == 3.12


def test_a_p95_no_static_configuration_reached_has_no_ratio_against_them() -> None:
    sweep = [p for p in SWEEP if p.label != LENGTH]
    found = ratios(sweep, CONFIGS)
    [at_4ms, _] = found.defaults_over_best_static
    assert at_4ms.ratio is None  # FIFO's fastest p95 is 9 ms
    assert at_4ms.text() == "- at p95 4 ms (c=1)"
    top = headline(found)
    assert top.defaults_over_no_batching_best is not None
    assert top.defaults_over_no_batching_best.ratio == 2.81
    assert top.defaults_over_best_static_worst is not None
    assert top.defaults_over_best_static_worst.ratio == round(900 / 700, 2)


def test_the_report_is_written_as_json_and_text_after_each_concurrency(tmp_path: Path) -> None:
    options = Options(out=tmp_path, quick=False)
    report = Report("a model", {"cpus": 2, "commit": "abc"}, {}, 0.99999, COSTS, 1.0, SWEEP, [64])
    write_report(report, options)
    text = (tmp_path / "gpu.txt").read_text()
    assert "Defaults over no batching, best point: 2.81x at p95 30 ms" in text
    assert "not measured for lack of time: c=64" in text
    saved = json.loads((tmp_path / "gpu.json").read_text())
    assert saved["headline"]["defaults_over_no_batching_best"]["ratio"] == 2.81
    assert results.from_json(Report, saved) == report


def test_points_shrink_to_fit_the_time_left_but_not_below_a_second() -> None:
    options = Options(point_s=3.0)
    assert point_seconds(options, 3600, 1.0) == 3.0
    assert 1.0 < point_seconds(options, 200, 1.0) < 3.0
    assert point_seconds(options, 60, 1.0) == 1.0


def test_a_carry_folder_over_the_device_limit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tracked.py").write_bytes(b"x" * 1000)
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "weights.zip").write_bytes(b"w" * 3000)
    total = carried_bytes([tmp_path / "tracked.py", tmp_path / "deleted.py"], [carry])
    assert total == 4000
    check_size(total, limit=4000)
    with pytest.raises(TooLarge, match="MiB a device call carries"):
        check_size(total, limit=3999)

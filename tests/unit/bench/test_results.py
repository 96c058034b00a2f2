"""Results to JSON and back, for any dataclass (nothing here is timed)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from modelroll_bench.results import from_json, read, to_json, write


@dataclass(frozen=True)
class Latency:
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class Row:
    label: str
    share: float
    latency: Latency
    runs_rps: list[float] = field(default_factory=list)
    by_system: dict[str, Latency] = field(default_factory=dict)
    lengths: tuple[int, int] = (0, 0)
    skipped: str | None = None


ROW = Row(
    "sidecar",
    0.5,
    Latency(12.5, None),
    [100.0, 101.5],
    {"echo": Latency(1.0, 2.0)},
    (3, 9),
)


def test_a_result_is_json_of_its_fields() -> None:
    assert to_json(ROW) == {
        "label": "sidecar",
        "share": 0.5,
        "latency": {"p50_ms": 12.5, "p99_ms": None},
        "runs_rps": [100.0, 101.5],
        "by_system": {"echo": {"p50_ms": 1.0, "p99_ms": 2.0}},
        "lengths": [3, 9],
        "skipped": None,
    }


def test_a_result_reads_back_as_it_was_written(tmp_path: Path) -> None:
    out = tmp_path / "results" / "row.json"
    write({"rows": [ROW]}, out)
    [row] = json.loads(out.read_text())["rows"]
    assert from_json(Row, row) == ROW
    write(ROW, out)
    assert read(Row, out) == ROW


def test_whole_numbers_read_back_as_floats_where_floats_are_declared() -> None:
    found = from_json(Latency, {"p50_ms": 12, "p99_ms": None})
    assert found == Latency(12.0, None)
    assert isinstance(found.p50_ms, float)


def test_a_field_the_result_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="Latency has no field p95_ms"):
        from_json(Latency, {"p50_ms": 1, "p95_ms": 2, "p99_ms": 3})

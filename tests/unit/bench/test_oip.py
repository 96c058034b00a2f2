"""make bench-oip's own arithmetic: the request bodies it sends, the model's cost per row,
ratios to MLServer called directly taken round by round, and the sidecar's mean batch."""

from __future__ import annotations

from modelroll_bench.figures import LoadSummary
from modelroll_bench.oip import (
    BASELINE,
    Cost,
    Measured,
    Run,
    Setup,
    infer_body,
    label,
    oip_bodies,
    summarize,
)

DIGITS = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]}
SENTIMENT = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]}


def test_rows_of_numbers_make_a_two_dimensional_tensor() -> None:
    body = infer_body(DIGITS, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert body == {
        "inputs": [
            {
                "name": "pixels",
                "datatype": "FP32",
                "data": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                "shape": [2, 3],
            }
        ]
    }


def test_strings_make_a_bytes_tensor_of_one_column() -> None:
    [tensor] = infer_body(SENTIMENT, ["good", "bad", "fine"])["inputs"]
    assert (tensor["shape"], tensor["data"]) == ([3, 1], ["good", "bad", "fine"])


def test_each_load_request_holds_one_row_in_turn() -> None:
    body = oip_bodies(SENTIMENT, ["good", "bad"])
    assert [body(i) for i in range(3)] == [
        b'{"inputs": [{"name": "text", "datatype": "BYTES", "data": ["good"], "shape": [1, 1]}]}',
        b'{"inputs": [{"name": "text", "datatype": "BYTES", "data": ["bad"], "shape": [1, 1]}]}',
        b'{"inputs": [{"name": "text", "datatype": "BYTES", "data": ["good"], "shape": [1, 1]}]}',
    ]


def test_cost_splits_into_a_part_per_call_and_a_part_per_row() -> None:
    cost = Cost(one_row_ms=5.1, rows=33, rows_ms=8.3)
    assert round(cost.per_row_ms, 6) == 0.1
    assert round(cost.per_call_ms, 6) == 5.0


def load(system: str, rps: float, p99_ms: float) -> LoadSummary:
    return LoadSummary(system, None, rps, 100, 100, {}, 1.0, 2.0, p99_ms)


def test_ratios_to_direct_are_taken_round_by_round() -> None:
    setup = Setup(paths=("direct", "sidecar"), server_batching=("off",), rounds=2)
    sidecar = label("sidecar", "off")
    runs = [
        Run(1, BASELINE, load(BASELINE, 100.0, 10.0), 0.0),
        Run(1, sidecar, load(sidecar, 300.0, 5.0), 0.0, mean_batch=4.0),
        Run(2, BASELINE, load(BASELINE, 50.0, 20.0), 0.0),
        Run(2, sidecar, load(sidecar, 200.0, 20.0), 0.0, mean_batch=6.0),
    ]
    summary = summarize(setup, Measured("digits", Cost(5.0, 2, 6.0), {}, runs))
    figures = summary.systems[sidecar]
    throughput, p99 = figures.throughput_rps, figures.p99_ms
    assert throughput.value is not None
    assert throughput.value.median == 250.0
    assert throughput.ratio_to_baseline is not None
    assert (throughput.ratio_to_baseline.low, throughput.ratio_to_baseline.high) == (3.0, 4.0)
    assert p99.ratio_to_baseline is not None
    assert (p99.ratio_to_baseline.low, p99.ratio_to_baseline.high) == (0.5, 1.0)
    assert figures.mean_batch is not None
    assert figures.mean_batch.median == 5.0
    assert summary.systems[BASELINE].mean_batch is None

"""make bench-encoder's summary: medians over rounds, ratios to no batching paired by round, the
share of the model's own limit, and a system skipped at a rate it cannot serve."""

from __future__ import annotations

from modelroll_bench import results
from modelroll_bench.encoder import (
    BASELINE,
    RateEntry,
    RateRun,
    Rows,
    SaturationRow,
    Summary,
    summarize,
)
from modelroll_bench.figures import BatchSummary, LoadSummary
from modelroll_bench.stats import Spread
from modelroll_bench.wrk import WrkResult

SIDECAR = "sidecar"


def saturated(label: str, r: int, rps: float, mean_batch: float) -> SaturationRow:
    batching = BatchSummary(10, int(10 * mean_batch), mean_batch, 0, 0, None, {})
    return SaturationRow(r, WrkResult(label, rps, 1000, 0, 0, 5.0, 9.0), batching, 1.0)


def ran(label: str, p99: float) -> RateRun:
    return RateRun(LoadSummary(label, 50.0, 50.0, 500, 500, {}, p99 / 4, p99 / 2, p99), None, 1.0)


def rows() -> Rows:
    found = Rows()
    found.saturation[BASELINE] = [
        saturated(BASELINE, 1, 100.0, 1.0),
        saturated(BASELINE, 2, 50.0, 1.0),
    ]
    found.saturation[SIDECAR] = [
        saturated(SIDECAR, 1, 300.0, 8.0),
        saturated(SIDECAR, 2, 200.0, 6.0),
    ]
    entry = RateEntry("70% of no batching", 0.7, BASELINE, 52.5)
    entry.rounds[BASELINE] = [ran(BASELINE, 100.0), ran(BASELINE, 80.0)]
    entry.rounds[SIDECAR] = [ran(SIDECAR, 20.0), None]  # skipped in round 2
    found.rates.append(entry)
    return found


def test_the_summary_pairs_each_round_with_no_batching_s_and_reads_back() -> None:
    summary = summarize(rows(), {BASELINE: 125.0, SIDECAR: 500.0})
    sidecar = summary.saturation[SIDECAR]
    assert sidecar.rps.value == Spread(250.0, 200.0, 300.0, 2)
    assert sidecar.rps.ratio_to_baseline == Spread(3.5, 3.0, 4.0, 2)  # 300/100 and 200/50
    assert sidecar.mean_batch == Spread(7.0, 6.0, 8.0, 2)
    assert sidecar.share_of_limit == 0.5
    [rate] = summary.rates
    p99 = rate.systems[SIDECAR].p99_ms
    assert p99.value == Spread(20.0, 20.0, 20.0, 1)
    assert p99.ratio_to_baseline == Spread(0.2, 0.2, 0.2, 1)  # the skipped round left out
    assert rate.systems[SIDECAR].mean_batch is None  # no batching read
    assert results.from_json(Summary, results.to_json(summary)) == summary

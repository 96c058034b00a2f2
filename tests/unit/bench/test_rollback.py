"""Rollback delays over flips made up here (nothing here is timed)."""

from __future__ import annotations

from modelroll_bench.rollback import Delays, summarize


def test_delays_leave_the_flips_that_timed_out_to_their_count() -> None:
    rows = [{"rollback_ms": v} for v in (120.0, None, 80.0, 100.0)]
    assert summarize(rows, "rollback_ms") == Delays(
        p50_ms=100.0, p99_ms=120.0, max_ms=120.0, min_ms=80.0, timeouts=1, samples=3
    )


def test_flips_that_all_timed_out_have_no_percentile() -> None:
    found = summarize([{"rollback_ms": None}] * 2, "rollback_ms")
    assert (found.p50_ms, found.p99_ms, found.timeouts, found.samples) == (None, None, 2, 0)

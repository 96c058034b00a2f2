"""The load summary and the open loop (nothing here is timed)."""

from __future__ import annotations

import asyncio

from modelroll_bench.figures import Latency, OpenRun
from modelroll_bench.loadgen import LoadResult, json_bodies, open_loop


def test_summary_counts_errors_by_status_and_times_only_successes() -> None:
    result = LoadResult("x", duration_s=2.0)
    for i in range(1, 101):
        result.record(200, i / 1000)
    result.record(429, 5.0)
    result.record(599, 9.0)
    result.record(429, 5.0)
    summary = result.summary()
    assert summary["ok"] == 100
    assert summary["requests"] == 103
    assert summary["errors"] == {"429": 2, "599": 1}
    assert summary["throughput_rps"] == 50.0
    assert (summary["p50_ms"], summary["p95_ms"], summary["p99_ms"]) == (50.0, 95.0, 99.0)
    assert result.report().latency == Latency(p50_ms=50.0, p95_ms=95.0, p99_ms=99.0)
    assert result.report().error_count == 3


def test_bodies_cycle_in_order() -> None:
    body = json_bodies(["a", "b b"])
    assert [body(i) for i in range(3)] == [
        b'{"payload": "a"}',
        b'{"payload": "b b"}',
        b'{"payload": "a"}',
    ]


def test_a_run_with_no_answer_has_no_percentiles() -> None:
    result = LoadResult("x", duration_s=1.0)
    result.record(503, 0.01)
    summary = result.summary()
    assert (summary["p50_ms"], summary["p95_ms"], summary["p99_ms"]) == (None, None, None)


def test_unanswered_requests_count_as_slower_than_any_answer() -> None:
    result = LoadResult("x", duration_s=1.0)
    for i in range(1, 98):
        result.record(200, i / 1000)
    result.unanswered = 3
    summary = result.summary()
    assert summary["requests"] == 100
    assert summary["errors"] == {"unanswered": 3}
    assert (summary["p50_ms"], summary["p95_ms"]) == (50.0, 95.0)
    assert summary["p99_ms"] is None  # the 99th slowest was never answered


async def test_an_open_loop_gives_up_on_answers_a_bounded_time_after_its_last_arrival() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def never(request: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_post("/v1/infer", never)
    async with TestServer(app) as server:
        url = str(server.make_url("/v1/infer"))
        result = await open_loop(url, json_bodies(["a"]), 200.0, 0.1, drain_s=0.05)
    assert result.ok == 0
    assert result.unanswered == sum(1 for _, _, latency in result.timeline if latency is None)
    assert result.unanswered > 0
    assert result.summary()["p50_ms"] is None


def test_an_open_run_reads_as_the_flat_row_the_dict_suites_keep() -> None:
    result = LoadResult("x", duration_s=1.0)
    result.record(200, 0.01)
    run = OpenRun(result.report(), None, None, [])
    assert run.row() == {**result.summary(), "batching": None, "by_length_decile": []}
    assert OpenRun(result.report(), None, 1.0, []).row()["within_slo_rps"] == 1.0

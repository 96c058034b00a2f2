"""Waiting for a model to finish its backlog: a batch longer than the quiet time is waited for."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from modelroll_bench.metrics import BatchCounters
from modelroll_bench.runs import idle


async def test_idle_waits_for_a_batch_longer_than_the_quiet_time_and_reports_its_probes() -> None:
    counts = {"batches": 0, "items": 0, "useful_tokens": 0, "padded_tokens": 0}
    model = asyncio.Lock()  # one batch at a time, like a model with one slot

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(counts)

    async def batch(request: web.Request) -> web.Response:
        async with model:
            counts.update(batches=counts["batches"] + 1, items=counts["items"] + 1)
            counts.update(useful_tokens=counts["useful_tokens"] + 1)
            counts.update(padded_tokens=counts["padded_tokens"] + 1)
        return web.json_response({"outputs": [None]})

    async def long_batch() -> None:
        async with model:  # the counters stay still while it runs, far past the quiet time
            await asyncio.sleep(0.5)
            counts.update(batches=counts["batches"] + 1, items=counts["items"] + 8)

    app = web.Application()
    app.router.add_get("/v1/stats", stats)
    app.router.add_post("/v1/batch", batch)
    async with TestServer(app) as server:
        running = asyncio.create_task(long_batch())
        await asyncio.sleep(0)  # it holds the model
        probes = await idle(str(server.make_url("/v1/stats")), quiet_s=0.05)
        assert running.done()
        assert counts["items"] == 8 + 2  # the long batch, then a probe behind it and one alone
    assert probes == BatchCounters(2, 2, {}, 2, 2)

"""Overload, deadlines, disconnects and model failures: each gets its status, nothing hangs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.support.processes import free_port
from tests.support.sidecar import StartModel, StartSidecar


@pytest.fixture
def batching_mode(every_mode: dict[str, str]) -> dict[str, str]:
    """Every guarantee here holds in every batching mode (FIFO, by length, adaptive wait)."""
    return every_mode


async def test_deadline_answers_504_and_the_model_never_sees_the_request(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=600, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=1, max_wait_ms=1, timeout_ms=200)

    results = await asyncio.gather(*(sidecar.infer(i) for i in range(3)))

    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 504, 504]
    expired = [body for status, body in results if status == 504]
    assert all("deadline" in body["error"] for body in expired)
    await asyncio.sleep(0.7)  # long enough for a leaked request to have reached the model
    assert model.model.items == 1
    assert sidecar.sample("modelroll_rejected_total", reason="deadline") == 2


async def until(check: Callable[[], bool], what: str) -> None:
    """Waits, polling, until ``check`` holds (the model holds each batch a second: long enough)."""
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"never: {what}")


async def test_full_queue_answers_429_with_retry_after(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1000, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=1, max_wait_ms=1, max_queue_size=2)

    running = asyncio.ensure_future(sidecar.infer("runs"))
    await until(lambda: model.model.busy == 1, "the first request is at the model")
    queued = [asyncio.ensure_future(sidecar.infer(f"queued {i}")) for i in range(2)]
    await until(lambda: sidecar.sample("modelroll_queue_depth") == 2, "two requests are queued")
    resp = await sidecar.client.post("/v1/infer", json={"payload": "one too many"})

    assert resp.status == 429
    assert int(resp.headers["Retry-After"]) >= 1
    assert "queue is full" in (await resp.json())["error"]
    assert [s for s, _ in await asyncio.gather(running, *queued)] == [200, 200, 200]
    assert sidecar.sample("modelroll_rejected_total", reason="queue_full") == 1


async def test_a_client_that_disconnects_while_queued_is_dropped(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=400, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=1, max_wait_ms=1)
    url = sidecar.client.make_url("/v1/infer")

    running = asyncio.ensure_future(sidecar.infer("runs"))
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as session:
        with contextlib.suppress(TimeoutError):
            await session.post(
                url, json={"payload": "gives up"}, timeout=aiohttp.ClientTimeout(total=0.1)
            )
    await asyncio.sleep(0.1)
    assert sidecar.sidecar.depth == 0
    assert sidecar.sample("modelroll_rejected_total", reason="disconnect") == 1
    assert (await running)[0] == 200
    await asyncio.sleep(0.5)
    assert model.model.items == 1  # the abandoned request never reached the model


async def test_per_item_errors_fail_only_their_own_requests(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, per_token_ms=0, error_rate=0.3, seed=7)
    sidecar = await start_sidecar(model.url, max_batch_size=16, max_wait_ms=5)

    results = await asyncio.gather(*(sidecar.infer(f"item {i}") for i in range(64)))

    failed = [body for status, body in results if status == 422]
    served = [body for status, body in results if status == 200]
    assert len(failed) + len(served) == 64
    assert 5 <= len(failed) <= 40
    assert all("injected failure" in body["error"] for body in failed)
    assert all(body["output"]["label"] in {"positive", "negative"} for body in served)
    assert sidecar.sample("modelroll_requests_total", code="422") == len(failed)


async def serve_model(aiohttp_server: AiohttpServer, handler: Any) -> str:
    """A model server whose /v1/batch misbehaves as ``handler`` says."""
    app = web.Application()
    app.router.add_post("/v1/batch", handler)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def test_a_model_that_fails_the_whole_batch_gives_502_to_each_request(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    async def crash(_: web.Request) -> web.Response:
        return web.Response(status=500, text="CUDA out of memory")

    sidecar = await start_sidecar(await serve_model(aiohttp_server, crash), max_wait_ms=20)

    results = await asyncio.gather(*(sidecar.infer(i) for i in range(5)))

    assert [status for status, _ in results] == [502] * 5
    assert all("HTTP 500" in body["error"] for _, body in results)


async def test_a_model_breaking_the_protocol_gives_502(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    async def short(request: web.Request) -> web.Response:
        inputs = (await request.json())["inputs"]
        return web.json_response({"outputs": inputs[:-1]})

    sidecar = await start_sidecar(await serve_model(aiohttp_server, short), max_wait_ms=20)

    results = await asyncio.gather(*(sidecar.infer(i) for i in range(3)))

    assert [status for status, _ in results] == [502] * 3
    assert "2 outputs for 3 inputs" in results[0][1]["error"]


async def test_an_answer_larger_than_the_cap_gives_502_and_is_not_read_whole(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    async def huge(request: web.Request) -> web.Response:
        inputs = (await request.json())["inputs"]
        return web.json_response({"outputs": ["x" * 4096 for _ in inputs]})

    sidecar = await start_sidecar(await serve_model(aiohttp_server, huge), max_wait_ms=20)
    sidecar.sidecar.model.max_answer_bytes = 1024

    results = await asyncio.gather(*(sidecar.infer(i) for i in range(3)))

    assert [status for status, _ in results] == [502] * 3
    assert "the model's answer is larger than 1024 bytes" in results[0][1]["error"]


async def test_a_model_slower_than_the_upstream_timeout_gives_502(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"outputs": []})

    sidecar = await start_sidecar(
        await serve_model(aiohttp_server, hang), max_wait_ms=5, upstream_timeout_ms=200
    )

    status, body = await sidecar.infer("x")

    assert status == 502
    assert "did not answer" in body["error"]


async def test_an_unreachable_model_gives_503_and_the_sidecar_stays_unready(
    start_sidecar: StartSidecar,
) -> None:
    sidecar = await start_sidecar(f"http://127.0.0.1:{free_port()}", max_wait_ms=5)

    status, body = await sidecar.infer("x")
    ready = await sidecar.client.get("/readyz")

    assert status == 503
    assert "unreachable" in body["error"]
    assert ready.status == 503

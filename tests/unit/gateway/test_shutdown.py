"""Stopping the gateway as Kubernetes does (SIGTERM): unready at once, nobody refused, open
requests answered. The real app runs in-process behind the server `modelroll-gateway` runs
(cli.serve), with the stop signal replaced by an event the test sets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from modelroll_common.sse import EventScanner, GenerationWatch
from modelroll_gateway import GatewayConfig, create_app
from modelroll_gateway.cli import STREAM_CUT_REASON, serve
from modelroll_standins.llm import DemoLLMConfig, create_demo_llm_app
from tests.support.gateway import RoutesFile, StartStandIn, route
from tests.support.processes import free_port

UNREADY_SECONDS = 1.0
"""The test's unready phase (3 s in the command): long enough to probe, short to wait for."""
SLOW_SECONDS = 2.0
"""How long the stand-in sidecar takes over the request in flight: past the unready phase, so
that it is answered after the gateway stopped listening."""


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        return resp.status, await resp.json()


async def _infer(session: aiohttp.ClientSession, base: str, payload: Any) -> tuple[int, str, Any]:
    """POST an inference; returns (status, Connection header, JSON body)."""
    async with session.post(f"{base}/v1/models/m/infer", json={"payload": payload}) as resp:
        return resp.status, resp.headers.get("Connection", ""), await resp.json()


def _serving(config: GatewayConfig, stop: asyncio.Event, unready_s: float) -> asyncio.Task[None]:
    """The gateway as `modelroll-gateway` serves it (cli.serve); ``stop`` stands for SIGTERM."""
    app = create_app(config, registry=CollectorRegistry())
    return asyncio.create_task(serve(app, config, stop=stop.wait, unready_seconds=unready_s))


async def _until_ready(session: aiohttp.ClientSession, base: str) -> None:
    deadline = time.monotonic() + 10.0
    while True:
        try:
            if (await _get(session, f"{base}/readyz"))[0] == 200:
                return
        except aiohttp.ClientConnectionError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            pytest.fail("the gateway never became ready")
        await asyncio.sleep(0.02)


async def test_stopping_turns_unready_at_once_and_still_answers_every_request(
    start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    standin = await start_standin("v1")
    routes_file.write({"m": route("m", ("v1", 1, standin.url))})
    port, admin_port = free_port(), free_port()
    config = GatewayConfig(
        host="127.0.0.1",
        port=port,
        admin_port=admin_port,
        routes_file=routes_file.path,
        routes_poll_seconds=0.05,
    )
    stop = asyncio.Event()
    serving = _serving(config, stop, UNREADY_SECONDS)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await _until_ready(session, base)
            in_flight = asyncio.ensure_future(_infer(session, base, {"sleep": SLOW_SECONDS}))
            await asyncio.wait_for(standin.reached.wait(), 5.0)  # the sidecar has it

            stop.set()  # SIGTERM
            stopped = time.monotonic()
            ready = await _get(session, f"{base}/readyz")
            # Kubernetes may still send requests for a moment: they are served, and told to
            # reconnect (to another replica).
            late = await _infer(session, base, "late")
            async with session.get(f"http://127.0.0.1:{admin_port}/metrics") as resp:
                scraped = resp.status  # the scraper still reads the drain's counts
            in_the_unready_phase = time.monotonic() - stopped
            answer = await in_flight
            answered = time.monotonic() - stopped
            await asyncio.wait_for(serving, 5.0)  # it exits once the last answer is out
        for closed in (port, admin_port):
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", closed)
    finally:
        if not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving

    assert ready == (503, {"error": "the gateway is shutting down"})
    assert late == (200, "close", {"output": "late", "model": "m", "version": "v1"})
    assert scraped == 200
    assert in_the_unready_phase < UNREADY_SECONDS, "the checks above came too late to count"
    # The request in flight at the stop gets its answer, after the gateway stopped listening.
    assert answer == (
        200,
        "close",
        {"output": {"sleep": SLOW_SECONDS}, "model": "m", "version": "v1"},
    )
    assert answered > UNREADY_SECONDS


async def test_a_stream_outlasting_the_drain_ends_with_an_error_event_not_a_silent_cut(
    aiohttp_server: AiohttpServer, routes_file: RoutesFile
) -> None:
    """A chat stream still going when the gateway's drain (`--upstream-timeout` + 1 s) runs out
    is cut, as any request would be; its client reads an SSE error event saying so, never an
    answer that merely stops."""
    engine = await aiohttp_server(
        create_demo_llm_app(DemoLLMConfig(step_ms=20.0, output_mu=9.0, output_sigma=0.1)),
        host="127.0.0.1",
    )
    url = str(engine.make_url("")).rstrip("/")
    routes_file.write({"chat": route("chat", ("chat-v1", 1, url))})
    port = free_port()
    config = GatewayConfig(
        host="127.0.0.1",
        port=port,
        admin_port=0,
        routes_file=routes_file.path,
        routes_poll_seconds=0.05,
        upstream_timeout=1.0,
    )
    stop = asyncio.Event()
    serving = _serving(config, stop, 0.2)
    base = f"http://127.0.0.1:{port}"
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "go on"}],
        "stream": True,
        "max_tokens": 1000,
    }
    watch, scanner = GenerationWatch(), EventScanner()
    try:
        async with aiohttp.ClientSession() as session:
            await _until_ready(session, base)
            await asyncio.sleep(0.2)  # the routes file read
            async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                stopped: float | None = None
                async for chunk in resp.content.iter_any():
                    for data in scanner.feed(chunk):
                        watch.saw(data, time.monotonic())
                    if stopped is None and watch.tokens:
                        stop.set()  # SIGTERM, the stream under way
                        stopped = time.monotonic()
                ended = time.monotonic()
            await asyncio.wait_for(serving, 5.0)
    finally:
        if not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
    assert stopped is not None
    assert not watch.done
    assert watch.error is not None
    assert watch.error.startswith("the stream was cut off after ")
    assert watch.error.endswith(STREAM_CUT_REASON)
    assert 0 < watch.tokens < 1000
    # Served through the unready phase and the drain, then cut: not at once, not at the end.
    assert 1.0 < ended - stopped < 5.0

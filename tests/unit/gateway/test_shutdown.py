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

from modelroll_gateway import GatewayConfig, create_app
from modelroll_gateway.cli import serve
from tests.conftest import free_port

from .conftest import RoutesFile, StartStandIn, route

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
    port = free_port()
    config = GatewayConfig(
        host="127.0.0.1", port=port, routes_file=routes_file.path, routes_poll_seconds=0.05
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(
        serve(
            create_app(config, registry=CollectorRegistry()),
            config,
            stop=stop.wait,
            unready_seconds=UNREADY_SECONDS,
        )
    )
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
            in_the_unready_phase = time.monotonic() - stopped
            answer = await in_flight
            answered = time.monotonic() - stopped
            await asyncio.wait_for(serving, 5.0)  # it exits once the last answer is out
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
    finally:
        if not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving

    assert ready == (503, {"error": "the gateway is shutting down"})
    assert late == (200, "close", {"output": "late", "model": "m", "version": "v1"})
    assert in_the_unready_phase < UNREADY_SECONDS, "the checks above came too late to count"
    # The request in flight at the stop gets its answer, after the gateway stopped listening.
    assert answer == (
        200,
        "close",
        {"output": {"sleep": SLOW_SECONDS}, "model": "m", "version": "v1"},
    )
    assert answered > UNREADY_SECONDS

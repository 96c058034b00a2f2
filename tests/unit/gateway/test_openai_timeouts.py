"""How long the gateway waits for a version on OpenAI's paths, with the official openai client
(whose default is to retry a 5xx twice): an answer not streamed may take longer than
--upstream-timeout, a stream's longest silence, and gets --generation-timeout; a 504 or 502
once the version has the request, the gateway's or a sidecar's, says not to retry it."""

from __future__ import annotations

import asyncio
import contextlib

import openai
import pytest
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from modelroll_gateway import GatewayConfig, create_app
from modelroll_gateway.cli import build_parser, config_from_args, serve
from modelroll_sidecar.app import create_app as create_sidecar_app
from modelroll_sidecar.config import SidecarConfig
from tests.support.gateway import RoutesFile, StartGateway, forwarder, gateway_to, route
from tests.support.processes import free_port
from tests.support.slow_engines import serve_slow_engine


async def ask(base_url: str) -> str:
    """One chat completion not streamed, with the client's default retries."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    try:
        answer = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "write at length"}]
        )
        return answer.choices[0].message.content or ""
    finally:
        await client.close()


async def test_an_answer_not_streamed_may_take_longer_than_the_upstream_timeout(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=0.6)
    gateway = await gateway_to(start_gateway, routes_file, engine.url, upstream_timeout=0.2)
    assert await ask(gateway.url("/v1")) == "a long answer"
    assert engine.received == [False]  # generated once


async def test_past_the_generation_timeout_a_504_says_not_to_retry_and_is_not_retried(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=1.5)
    gateway = await gateway_to(start_gateway, routes_file, engine.url)
    forwarder(gateway).generation_timeout_s = 0.3
    with pytest.raises(openai.InternalServerError) as raised:
        await ask(gateway.url("/v1"))
    assert raised.value.status_code == 504
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert raised.value.body == {
        "message": "version 'chat-v1' did not answer within 0.3s (--generation-timeout); it had "
        "the request and may have run it: a retry runs it again",
        "type": "server_error",
        "param": None,
        "code": 504,
    }
    assert engine.received == [False]


async def test_a_sidecars_504_passes_on_with_its_word_against_a_retry(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=1.5)
    config = SidecarConfig(
        upstream=engine.url,
        protocol="openai",
        model="chat",
        version="chat-v1",
        generation_timeout_ms=300,
    )
    sidecar = await aiohttp_server(
        create_sidecar_app(config, CollectorRegistry()), host="127.0.0.1"
    )
    gateway = await gateway_to(start_gateway, routes_file, str(sidecar.make_url("")).rstrip("/"))
    with pytest.raises(openai.InternalServerError) as raised:
        await ask(gateway.url("/v1"))
    assert raised.value.status_code == 504
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert raised.value.response.headers["X-Modelroll-Version"] == "chat-v1"
    assert engine.received == [False]


async def test_the_generation_timeout_flag_reaches_the_served_gateway(
    aiohttp_server: AiohttpServer, routes_file: RoutesFile
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=1.5)
    routes_file.write({"chat": route("chat", ("chat-v1", 1, engine.url))})
    port = free_port()
    flags = {"--routes-file": str(routes_file.path), "--host": "127.0.0.1", "--port": str(port)}
    flags["--admin-port"] = "0"  # not served
    argv = [word for pair in flags.items() for word in pair]
    args = build_parser(environ={}).parse_args([*argv, "--generation-timeout", "0.4"])
    config = config_from_args(args)
    assert config.generation_timeout == 0.4
    assert GatewayConfig().generation_timeout == 600.0
    stop = asyncio.Event()
    app = create_app(config, registry=CollectorRegistry())
    served = asyncio.create_task(serve(app, config, stop=stop.wait, unready_seconds=0.0))
    try:
        for _ in range(200):  # listening, with the route read
            with contextlib.suppress(openai.APIConnectionError, openai.NotFoundError):
                with pytest.raises(openai.InternalServerError) as raised:
                    await ask(f"http://127.0.0.1:{port}/v1")
                break
            await asyncio.sleep(0.02)
        assert raised.value.status_code == 504
        assert "did not answer within 0.4s (--generation-timeout)" in str(raised.value.body)
        assert engine.received == [False]
    finally:
        stop.set()
        await served

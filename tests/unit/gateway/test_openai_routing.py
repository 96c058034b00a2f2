"""The gateway's OpenAI paths: routed by the body's model, streamed back as the
version generates, a stream staying on its version through a weight change, and a client that
goes away stopping the version's engine. Two demo LLM engines stand in for two versions' sidecars
(they speak the same paths)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from pytest_aiohttp import AiohttpServer

from modelroll_standins.engine import Engine
from modelroll_standins.llm import ENGINE, DemoLLMConfig, create_demo_llm_app
from tests.support.gateway import RoutesFile, StartGateway, route


async def engine(aiohttp_server: AiohttpServer, **settings: Any) -> TestServer:
    return await aiohttp_server(create_demo_llm_app(DemoLLMConfig(**settings)), host="127.0.0.1")


def url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


def chat(model: str, max_tokens: int = 20) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "tell me"}],
        "max_tokens": max_tokens,
        "stream": True,
    }


async def test_a_chat_stream_is_routed_by_model_and_arrives_token_by_token(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    stable = await engine(aiohttp_server, step_ms=20.0, output_mu=3.0, output_sigma=0.01)
    routes_file.write({"chat": route("chat", ("chat-v1", 1, url(stable)))})
    gateway = await start_gateway()
    await gateway.wait_weights("chat", {"chat-v1": 1})
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with gateway.session.post(gateway.url("/v1/chat/completions"), json=chat("chat")) as resp:
        assert resp.status == 200
        assert resp.headers["X-Modelroll-Version"] == "chat-v1"
        await resp.content.readline()
        first_at = loop.time() - started
        lines = [line async for line in resp.content]
    done_at = loop.time() - started
    assert first_at < done_at / 3  # streamed, not buffered: 20 tokens at 20 ms each
    assert lines[-2].strip() == b"data: [DONE]"
    assert (
        gateway.sample(
            "modelroll_gateway_llm_requests_total",
            model="chat",
            version="chat-v1",
            outcome="completed",
        )
        == 1
    )
    ttft = gateway.sample(
        "modelroll_gateway_llm_time_to_first_token_seconds_sum", model="chat", version="chat-v1"
    )
    assert 0.015 < ttft < first_at + 0.01


async def test_unknown_models_and_bodies_without_one_are_refused(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    stable = await engine(aiohttp_server)
    routes_file.write({"chat": route("chat", ("chat-v1", 1, url(stable)))})
    gateway = await start_gateway()
    await gateway.wait_weights("chat", {"chat-v1": 1})
    path = gateway.url("/v1/chat/completions")
    async with gateway.session.post(path, json=chat("nope")) as resp:
        assert resp.status == 404
        assert "unknown model 'nope'" in (await resp.json())["error"]["message"]
    async with gateway.session.post(path, json={"messages": []}) as resp:
        assert resp.status == 400
    async with gateway.session.post(path, data=b"{not json") as resp:
        assert resp.status == 400


async def test_a_stream_stays_on_its_version_through_a_rollback(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    slow = dict(step_ms=10.0, output_mu=3.9, output_sigma=0.01)  # ~50 tokens, 0.5 s
    stable, canary = await engine(aiohttp_server, **slow), await engine(aiohttp_server, **slow)
    routes_file.write(
        {"chat": route("chat", ("stable", 0, url(stable)), ("canary", 1, url(canary)))}
    )
    gateway = await start_gateway()
    await gateway.wait_weights("chat", {"stable": 0, "canary": 1})
    path = gateway.url("/v1/chat/completions")
    opened = [await gateway.session.post(path, json=chat("chat", 60)) for _ in range(20)]
    assert {r.headers["X-Modelroll-Version"] for r in opened} == {"canary"}
    routes_file.write(
        {"chat": route("chat", ("stable", 1, url(stable)), ("canary", 0, url(canary)))}
    )
    await gateway.wait_weights("chat", {"stable": 1, "canary": 0})
    after = await gateway.session.post(path, json=chat("chat", 5))
    assert after.headers["X-Modelroll-Version"] == "stable"
    for resp in (*opened, after):
        lines = [line async for line in resp.content]
        assert lines[-2].strip() == b"data: [DONE]", "a stream was cut by the rollback"
    canary_engine: Engine = canary.app[ENGINE]
    assert canary_engine.stats.sequences == 20
    assert canary_engine.stats.cancelled == 0


async def test_a_client_that_goes_away_stops_the_versions_engine(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    long = await engine(aiohttp_server, step_ms=10.0, output_mu=7.0, output_sigma=0.01)
    routes_file.write({"chat": route("chat", ("chat-v1", 1, url(long)))})
    gateway = await start_gateway()
    await gateway.wait_weights("chat", {"chat-v1": 1})
    resp = await gateway.session.post(gateway.url("/v1/chat/completions"), json=chat("chat", 2000))
    await resp.content.readline()
    resp.close()
    stats = long.app[ENGINE].stats
    for _ in range(100):
        if stats.cancelled:
            break
        await asyncio.sleep(0.02)
    assert stats.cancelled == 1
    assert stats.tokens < 300


async def test_embeddings_pass_through_whole(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    stable = await engine(aiohttp_server)
    routes_file.write({"embed": route("embed", ("embed-v1", 1, url(stable)))})
    gateway = await start_gateway()
    await gateway.wait_weights("embed", {"embed-v1": 1})
    body = {"model": "embed", "input": ["a", "b"]}
    async with gateway.session.post(gateway.url("/v1/embeddings"), json=body) as resp:
        assert resp.status == 200
        answer = json.loads(await resp.read())
    assert [d["index"] for d in answer["data"]] == [0, 1]


async def test_a_full_versions_429_reaches_the_client_with_its_retry_after(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    """A sidecar whose in-flight bound is full answers 429 with Retry-After; the client must get
    both, or it retries at once (OpenAI's clients honour Retry-After)."""
    app = web.Application()

    async def full(_: web.Request) -> web.Response:
        body = {"error": {"message": "full", "type": "rate_limit_error", "code": 429}}
        return web.json_response(body, status=429, headers={"Retry-After": "3"})

    app.router.add_post("/v1/chat/completions", full)
    sidecar = await aiohttp_server(app, host="127.0.0.1")
    routes_file.write({"chat": route("chat", ("chat-v1", 1, url(sidecar)))})
    gateway = await start_gateway()
    await gateway.wait_weights("chat", {"chat-v1": 1})
    async with gateway.session.post(gateway.url("/v1/chat/completions"), json=chat("chat")) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "3"
        assert resp.headers["X-Modelroll-Version"] == "chat-v1"
        assert (await resp.json())["error"]["type"] == "rate_limit_error"

"""How long the sidecar waits for an OpenAI engine, with the official openai client (whose
default is to retry a 5xx twice): an answer not streamed may take longer than
--upstream-timeout-ms, the engine's longest silence in a stream, and gets
--generation-timeout-ms; a 504 once the engine has the request says not to retry it, so the
engine generates each answer once."""

from __future__ import annotations

import openai
import pytest
from pytest_aiohttp import AiohttpServer

from modelroll_sidecar.config import SidecarConfig, parse_args
from tests.support.scripted_engines import CHAT_PATH, chat
from tests.support.sidecar import StartSidecar
from tests.support.slow_engines import serve_slow_engine


async def ask(base_url: str, *, stream: bool = False) -> str:
    """One chat completion with the client's default retries."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    try:
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": "write at length"}
        ]
        if not stream:
            answer = await client.chat.completions.create(model="demo-llm", messages=messages)
            return answer.choices[0].message.content or ""
        parts = await client.chat.completions.create(
            model="demo-llm", messages=messages, stream=True
        )
        return "".join([p.choices[0].delta.content or "" async for p in parts])
    finally:
        await client.close()


async def test_an_answer_not_streamed_may_take_longer_than_the_upstream_timeout(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=0.6)
    sidecar = await start_sidecar(engine.url, protocol="openai", upstream_timeout_ms=200)
    assert await ask(str(sidecar.client.make_url("/v1"))) == "a long answer"
    assert engine.received == [False]  # generated once
    assert sidecar.sample("modelroll_llm_requests_total", outcome="whole") == 1


async def test_past_the_generation_timeout_a_504_says_not_to_retry_and_is_not_retried(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=1.5)
    sidecar = await start_sidecar(engine.url, protocol="openai", generation_timeout_ms=300)
    with pytest.raises(openai.InternalServerError) as raised:
        await ask(str(sidecar.client.make_url("/v1")))
    error = raised.value
    assert error.status_code == 504
    assert error.response.headers["x-should-retry"] == "false"
    assert error.body == {
        "message": "the model did not answer within 0.3s (--generation-timeout-ms); it had the "
        "request and may have generated it: a retry generates it again",
        "type": "server_error",
        "param": None,
        "code": 504,
    }
    assert engine.received == [False]  # the client did not send it again
    assert sidecar.sample("modelroll_llm_requests_total", outcome="timeout") == 1


async def test_a_stream_whose_engine_is_silent_past_the_upstream_timeout_is_a_504(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=1.0)
    sidecar = await start_sidecar(engine.url, protocol="openai", upstream_timeout_ms=200)
    resp = await sidecar.client.post(CHAT_PATH, json=chat())
    assert resp.status == 504
    assert resp.headers["x-should-retry"] == "false"
    message = (await resp.json())["error"]["message"]
    assert message.startswith("the model sent nothing for 0.2s (--upstream-timeout-ms); ")
    # Within it, a stream passes as before.
    engine.delay_s = 0.05
    assert await ask(str(sidecar.client.make_url("/v1")), stream=True) == "a long answer"
    assert engine.received == [True, True]


async def test_refusals_before_the_engine_say_nothing_against_a_retry(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_slow_engine(aiohttp_server, delay_s=0.0)
    sidecar = await start_sidecar("http://127.0.0.1:9", protocol="openai")  # nothing listens
    resp = await sidecar.client.post(CHAT_PATH, json=chat(stream=False))
    assert resp.status == 503
    assert "x-should-retry" not in resp.headers  # the engine never had it: retrying is safe
    assert engine.received == []


def test_the_generation_timeout_flag() -> None:
    assert SidecarConfig().generation_timeout_ms == 600_000
    config = parse_args(["--generation-timeout-ms", "1200000"], environ={})
    assert config.generation_timeout_ms == 1_200_000
    with pytest.raises(ValueError, match=r"--generation-timeout-ms must be within 1\.\.3600000"):
        SidecarConfig(generation_timeout_ms=0)

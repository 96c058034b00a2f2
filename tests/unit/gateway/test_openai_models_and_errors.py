"""The gateway as OpenAI's official client sees it: GET /v1/models lists the models it may call
(and nothing of the versions behind them), and the gateway's own errors on OpenAI's paths are
OpenAI's, so that the client raises them as its exceptions, with their messages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.support.gateway import (
    Gateway,
    RoutesFile,
    StartEngine,
    StartGateway,
    StartStandIn,
    route,
)

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def routed(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> Gateway:
    """A gateway routing chat (one version with weight, one dark), dark (weight 0 only) and
    embed."""
    stable, canary, dark, embed = [await start_standin(v) for v in ("a", "b", "c", "d")]
    routes_file.write(
        {
            "chat": route("chat", ("chat-stable", 1, stable.url), ("chat-canary", 0, canary.url)),
            "dark": route("dark", ("dark-v1", 0, dark.url)),
            "embed": route("embed", ("embed-v1", 3, embed.url)),
        }
    )
    gw = await start_gateway()
    await gw.wait_weights("embed", {"embed-v1": 3})
    return gw


@pytest.fixture
async def client(routed: Gateway) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=routed.url("/v1"), api_key="unused", max_retries=0) as c:
        yield c


async def test_the_models_list_holds_the_models_a_client_may_call(
    routed: Gateway, client: AsyncOpenAI
) -> None:
    models = [m async for m in client.models.list()]
    assert [m.id for m in models] == ["chat", "embed"]  # not dark: it takes no traffic
    for model in models:
        assert (model.object, model.owned_by) == ("model", "modelroll")
        assert isinstance(model.created, int)
        assert model.created > 1_700_000_000
    async with routed.session.get(routed.url("/v1/models")) as resp:
        text = await resp.text()
    assert resp.status == 200
    for internal in ("chat-stable", "chat-canary", "embed-v1", "127.0.0.1", "weight"):
        assert internal not in text


async def test_a_model_is_retrieved_by_name_and_an_unknown_one_is_not_found(
    routed: Gateway, routes_file: RoutesFile, client: AsyncOpenAI
) -> None:
    chat = await client.models.retrieve("chat")
    assert (chat.id, chat.object, chat.owned_by) == ("chat", "model", "modelroll")
    with pytest.raises(openai.NotFoundError, match="unknown model 'nope'") as unknown:
        await client.models.retrieve("nope")
    body = unknown.value.body
    assert isinstance(body, dict)
    assert body["message"] == "unknown model 'nope'"
    assert {"message", "type", "code"} <= body.keys()
    with pytest.raises(openai.NotFoundError, match="no version taking traffic"):
        await client.models.retrieve("dark")
    # A weight change, a second later, leaves the model's `created` alone: it is the same model.
    await asyncio.sleep(1.1)
    endpoint = routed.url("")
    routes_file.write({"chat": route("chat", ("chat-stable", 5, endpoint))})
    await routed.wait_weights("chat", {"chat-stable": 5})
    assert (await client.models.retrieve("chat")).created == chat.created


async def test_the_gateways_own_errors_reach_the_client_as_openai_exceptions(
    routed: Gateway, client: AsyncOpenAI
) -> None:
    with pytest.raises(openai.NotFoundError, match="unknown model 'nope'"):
        await client.chat.completions.create(model="nope", messages=CHAT)
    with pytest.raises(openai.NotFoundError, match="unknown version 'v9' of model 'embed'"):
        await client.embeddings.create(
            model="embed", input="hi", extra_headers={"X-Modelroll-Version": "v9"}
        )
    with pytest.raises(openai.InternalServerError, match="no routable version") as weightless:
        await client.completions.create(model="dark", prompt="hi")
    assert weightless.value.status_code == 503
    with pytest.raises(openai.BadRequestError, match='the body needs a "model"'):
        await client.embeddings.create(model="", input="hi")


async def test_a_body_over_the_limit_is_a_413_the_client_reads(
    start_gateway: StartGateway, start_engine: StartEngine, routes_file: RoutesFile
) -> None:
    routes_file.write({"chat": route("chat", ("chat-v1", 1, await start_engine()))})
    gw = await start_gateway(max_body_bytes=2000)
    await gw.wait_weights("chat", {"chat-v1": 1})
    async with AsyncOpenAI(base_url=gw.url("/v1"), api_key="unused", max_retries=0) as client:
        answer = await client.chat.completions.create(model="chat", messages=CHAT, max_tokens=2)
        assert answer.choices
        with pytest.raises(openai.APIStatusError, match="exceeds 2000 bytes") as too_large:
            await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "x" * 5000}]
            )
    assert too_large.value.status_code == 413


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"model": "chat", "messages": ' + b"[" * 100_000],
    ids=["array", "inside-the-request"],
)
async def test_json_nested_too_deeply_is_a_400_and_no_server_error(
    routed: Gateway, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    for path in ("/v1/chat/completions", "/v1/embeddings"):
        async with routed.session.post(
            routed.url(path), data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert error["message"] == "malformed JSON: arrays and objects nested too deeply"
        assert error["code"] == 400
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert routed.sample("modelroll_gateway_requests_total", model="", version="", code="400") == 2


async def test_openai_paths_answer_openai_errors_and_the_batch_path_keeps_its_own(
    routed: Gateway,
) -> None:
    session = routed.session
    async with session.post(routed.url("/v1/models")) as resp:
        assert (resp.status, resp.headers["Allow"]) == (405, "GET")
        assert "use GET" in (await resp.json())["error"]["message"]
    async with session.get(routed.url("/v1/models/chat/versions")) as resp:
        assert resp.status == 404
        assert "no such path" in (await resp.json())["error"]["message"]
    async with session.post(routed.url("/v1/chat/completions"), data=b"{nope") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["message"].startswith("malformed JSON: ")
    async with session.post(routed.url("/v1/models/nope/infer"), json={"payload": 1}) as resp:
        assert resp.status == 404
        assert await resp.json() == {"error": "unknown model 'nope'"}
    async with session.get(routed.url("/v1/models/chat/infer")) as resp:
        assert resp.status == 405
        assert await resp.json() == {
            "error": "method GET is not allowed on /v1/models/chat/infer; use POST"
        }

"""The sidecar's OpenAI streams when a client or the engine misbehaves: a client that goes away is
still counted, clients that stop reading are cut off and free their slots, an answer too large or
of the wrong kind is a 502, and a stream the engine breaks in the middle of an event ends with one
error event that the official openai client raises as an APIError."""

from __future__ import annotations

import json

import openai
import pytest
from pytest_aiohttp import AiohttpServer

from modelroll_common.sse import EventScanner
from modelroll_sidecar.openai_proxy import OpenAIProxy
from modelroll_standins.llm import ENGINE, DemoLLMConfig, create_demo_llm_app
from tests.support.scripted_engines import (
    CHAT_PATH,
    chat,
    counted_outcomes,
    serve_engine,
    stalled_clients,
    stream_with_openai,
    until,
)
from tests.support.sidecar import RunningSidecar, StartSidecar


def proxy(sidecar: RunningSidecar) -> OpenAIProxy:
    assert sidecar.sidecar.proxy is not None
    return sidecar.sidecar.proxy


def outcomes(sidecar: RunningSidecar) -> dict[str, float]:
    return counted_outcomes(sidecar.registry, "modelroll_llm_requests_total")


async def test_a_client_that_goes_away_is_counted_once_with_what_it_got(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    llm = await aiohttp_server(
        create_demo_llm_app(DemoLLMConfig(step_ms=10.0, output_mu=7.0, output_sigma=0.01))
    )
    sidecar = await start_sidecar(str(llm.make_url("")).rstrip("/"), protocol="openai")
    resp = await sidecar.client.post(CHAT_PATH, json=chat(max_tokens=2000))
    assert resp.status == 200
    await resp.content.readline()  # a token came
    resp.close()  # the client goes away: its handler is cancelled
    engine = llm.app[ENGINE]
    await until(lambda: engine.stats.cancelled == 1, "the engine stopped generating")
    await until(lambda: bool(outcomes(sidecar)), "the stream was counted")
    assert outcomes(sidecar) == {"client_disconnect": 1}
    assert sidecar.sample("modelroll_llm_time_to_first_token_seconds_count") == 1
    assert sidecar.sample("modelroll_llm_output_tokens_total") >= 1
    assert sidecar.sample("modelroll_requests_total", code="200") == 1
    assert proxy(sidecar).in_flight == 0


async def test_clients_that_stop_reading_are_cut_off_and_free_their_slots(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_engine(aiohttp_server, "floods")
    # The engine runs in this process: a timeout short enough for the loop to be held that long
    # on a busy machine would end a stream as the engine's silence before its client's stall.
    sidecar = await start_sidecar(
        engine.url, protocol="openai", max_in_flight=8, upstream_timeout_ms=2000
    )
    port = sidecar.client.server.port
    assert port is not None
    async with stalled_clients(port, 8, chat(max_tokens=100_000)):
        await until(lambda: engine.log.opened == 8, "eight streams under way")
        await until(
            lambda: outcomes(sidecar).get("client_stalled") == 8, "the stalled clients were cut"
        )
        await until(lambda: engine.log.closed_by_client == 8, "the engine's streams were closed")
        assert proxy(sidecar).in_flight == 0
        # Every slot is free again, with the stalled clients' sockets still open.
        resp = await sidecar.client.post(CHAT_PATH, json=chat(max_tokens=2))
        assert resp.status == 200
        assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    assert outcomes(sidecar) == {"client_stalled": 8, "completed": 1}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_whole_answer_over_the_cap_is_a_502_in_openais_shape(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar, chunked: bool
) -> None:
    engine = await serve_engine(aiohttp_server, answer_bytes=64 * 1024, chunked=chunked)
    sidecar = await start_sidecar(engine.url, protocol="openai")
    proxy(sidecar).max_answer_bytes = 16 * 1024
    resp = await sidecar.client.post(CHAT_PATH, json=chat(stream=False))
    assert resp.status == 502
    error = (await resp.json())["error"]
    assert error["message"] == "the model's answer is larger than 16384 bytes"
    assert error["type"] == "server_error"
    assert outcomes(sidecar) == {"upstream_error": 1}
    proxy(sidecar).max_answer_bytes = 64 * 1024
    resp = await sidecar.client.post(CHAT_PATH, json=chat(stream=False))
    assert resp.status == 200
    assert len(await resp.read()) == 64 * 1024


async def test_a_streamed_request_answered_with_html_is_a_502(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_engine(aiohttp_server, "answers_html")
    sidecar = await start_sidecar(engine.url, protocol="openai")
    resp = await sidecar.client.post(CHAT_PATH, json=chat())
    assert resp.status == 502
    error = (await resp.json())["error"]
    assert error["message"] == (
        "the model answered a streamed request with text/html, not text/event-stream"
    )
    assert outcomes(sidecar) == {"upstream_error": 1}
    assert sidecar.sample("modelroll_requests_total", code="502") == 1
    assert sidecar.sample("modelroll_requests_total", code="200") == 0
    resp = await sidecar.client.post(CHAT_PATH, json=chat(stream=False))
    assert resp.status == 200  # not asked to stream: the answer passes whole, whatever it is
    assert resp.content_type == "text/html"


async def test_a_stream_broken_mid_event_ends_with_one_error_the_openai_client_raises(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_engine(aiohttp_server, "breaks_mid_event")
    sidecar = await start_sidecar(engine.url, protocol="openai")
    base = str(sidecar.client.make_url("/v1"))
    received: list[str | None] = []
    with pytest.raises(openai.APIError) as raised:
        await stream_with_openai(base, "demo-llm", received)
    assert not isinstance(raised.value, openai.APIConnectionError)
    assert raised.value.message == (
        "the model server's stream broke off after 1 tokens (ClientPayloadError)"
    )
    assert received == ["whole "]
    # Read raw: every event is whole JSON, and there is one error event.
    resp = await sidecar.client.post(CHAT_PATH, json=chat())
    raw = await resp.read()
    data = EventScanner().feed(raw)
    assert [json.loads(d).get("error") is not None for d in data] == [False, True]
    assert outcomes(sidecar) == {"upstream_error": 2}

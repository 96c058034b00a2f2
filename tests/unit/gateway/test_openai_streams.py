"""The gateway's OpenAI streams when a client or a version misbehaves: a client that goes away is
still counted, a client that stops reading is cut off, an answer too large or of the wrong kind is
a 502, and a stream broken in the middle of an event behind a sidecar reaches the official openai
client as one error event, an APIError."""

from __future__ import annotations

import json

import openai
import pytest
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from modelroll_common.sse import EventScanner
from modelroll_sidecar.app import create_app as create_sidecar_app
from modelroll_sidecar.config import SidecarConfig
from modelroll_standins.llm import ENGINE, DemoLLMConfig, create_demo_llm_app
from tests.support.gateway import Gateway, RoutesFile, StartGateway, forwarder, gateway_to
from tests.support.scripted_engines import (
    CHAT_PATH,
    chat,
    counted_outcomes,
    raw_events,
    serve_engine,
    stalled_clients,
    stream_with_openai,
    until,
)

LABELS = {"model": "chat", "version": "chat-v1"}


def outcomes(gateway: Gateway) -> dict[str, float]:
    return counted_outcomes(gateway.registry, "modelroll_gateway_llm_requests_total")


async def test_a_client_that_goes_away_is_counted_once_with_its_first_token(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    llm = await aiohttp_server(
        create_demo_llm_app(DemoLLMConfig(step_ms=10.0, output_mu=7.0, output_sigma=0.01)),
        host="127.0.0.1",
    )
    gateway = await gateway_to(start_gateway, routes_file, str(llm.make_url("")).rstrip("/"))
    body = chat(model="chat", max_tokens=2000)
    resp = await gateway.session.post(gateway.url(CHAT_PATH), json=body)
    assert resp.status == 200
    await resp.content.readline()  # a token came
    resp.close()
    stats = llm.app[ENGINE].stats
    await until(lambda: stats.cancelled == 1, "the engine stopped generating")
    await until(lambda: bool(outcomes(gateway)), "the stream was counted")
    assert outcomes(gateway) == {"client_disconnect": 1}
    ttft = "modelroll_gateway_llm_time_to_first_token_seconds_count"
    assert gateway.sample(ttft, **LABELS) == 1
    assert gateway.sample("modelroll_gateway_requests_total", code="200", **LABELS) == 1


async def test_a_client_that_stops_reading_is_cut_off_and_the_stream_closed(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    engine = await serve_engine(aiohttp_server, "floods")
    gateway = await gateway_to(start_gateway, routes_file, engine.url, upstream_timeout=0.3)
    port = gateway.server.port
    assert port is not None
    async with stalled_clients(port, 2, chat(model="chat", max_tokens=100_000)):
        await until(lambda: outcomes(gateway).get("client_stalled") == 2, "the clients were cut")
        await until(lambda: engine.log.closed_by_client == 2, "the version's streams were closed")
    assert outcomes(gateway) == {"client_stalled": 2}
    assert gateway.sample("modelroll_gateway_requests_total", code="200", **LABELS) == 2


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_whole_answer_over_the_cap_is_a_502_in_openais_shape(
    aiohttp_server: AiohttpServer,
    start_gateway: StartGateway,
    routes_file: RoutesFile,
    chunked: bool,
) -> None:
    engine = await serve_engine(aiohttp_server, answer_bytes=64 * 1024, chunked=chunked)
    gateway = await gateway_to(start_gateway, routes_file, engine.url)
    forwarder(gateway).max_answer_bytes = 16 * 1024
    body = chat(model="chat", stream=False)
    async with gateway.session.post(gateway.url(CHAT_PATH), json=body) as resp:
        assert resp.status == 502
        assert resp.headers["X-Modelroll-Version"] == "chat-v1"
        error = (await resp.json())["error"]
    assert error["message"] == "version 'chat-v1' answered more than 16384 bytes"
    assert outcomes(gateway) == {"upstream_error": 1}


async def test_a_streamed_request_answered_with_html_is_a_502(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    engine = await serve_engine(aiohttp_server, "answers_html")
    gateway = await gateway_to(start_gateway, routes_file, engine.url)
    async with gateway.session.post(gateway.url(CHAT_PATH), json=chat(model="chat")) as resp:
        assert resp.status == 502
        error = (await resp.json())["error"]
    assert error["message"] == (
        "version 'chat-v1' answered a streamed request with text/html, not text/event-stream"
    )
    assert outcomes(gateway) == {"upstream_error": 1}
    assert gateway.sample("modelroll_gateway_requests_total", code="502", **LABELS) == 1


async def test_a_stream_broken_mid_event_behind_a_sidecar_reaches_the_client_as_one_error(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    engine = await serve_engine(aiohttp_server, "breaks_mid_event")
    config = SidecarConfig(upstream=engine.url, protocol="openai", model="chat", version="chat-v1")
    sidecar = await aiohttp_server(
        create_sidecar_app(config, CollectorRegistry()), host="127.0.0.1"
    )
    gateway = await gateway_to(start_gateway, routes_file, str(sidecar.make_url("")).rstrip("/"))
    received: list[str | None] = []
    with pytest.raises(openai.APIError) as raised:
        await stream_with_openai(gateway.url("/v1"), "chat", received)
    assert not isinstance(raised.value, openai.APIConnectionError)
    assert raised.value.message == (
        "the model server's stream broke off after 1 tokens (ClientPayloadError)"
    )
    assert received == ["whole "]
    raw = await raw_events(gateway.session, gateway.url(CHAT_PATH), chat(model="chat"))
    data = EventScanner().feed(raw)
    assert [json.loads(d).get("error") is not None for d in data] == [False, True]
    assert outcomes(gateway) == {"error": 2}  # the sidecar's error event, passed on


async def test_a_stream_the_openai_client_closes_at_done_counts_completed_at_both_hops(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    # The official client closes its connection as soon as it reads data: [DONE], while the
    # engine (here one that holds its stream open after it) may not have ended the stream yet.
    engine = await serve_engine(aiohttp_server, "lingers_after_done")
    config = SidecarConfig(upstream=engine.url, protocol="openai", model="chat", version="chat-v1")
    sidecar_registry = CollectorRegistry()
    sidecar = await aiohttp_server(create_sidecar_app(config, sidecar_registry), host="127.0.0.1")
    gateway = await gateway_to(start_gateway, routes_file, str(sidecar.make_url("")).rstrip("/"))
    received: list[str | None] = []
    await stream_with_openai(gateway.url("/v1"), "chat", received)
    assert received == ["all ", "there"]
    await until(lambda: bool(outcomes(gateway)), "the gateway counting the stream")
    sidecar_outcomes = "modelroll_llm_requests_total"
    await until(
        lambda: bool(counted_outcomes(sidecar_registry, sidecar_outcomes)),
        "the sidecar counting the stream",
    )
    assert outcomes(gateway) == {"completed": 1}
    assert counted_outcomes(sidecar_registry, sidecar_outcomes) == {"completed": 1}

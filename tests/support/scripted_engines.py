"""OpenAI-style engines on loopback that misbehave the way a test asks, for the sidecar's and the
gateway's streams: one breaks its stream off in the middle of an event, one floods its streams
with large events for as long as its client reads them, one holds its stream open after
``data: [DONE]``, one answers 200 in HTML, one answers a body of a given size. Each counts the
streams it opened and those its client closed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from tests.support.rawclient import PATIENCE, post_bytes

CHAT_PATH = "/v1/chat/completions"
FLOOD_EVENT_BYTES = 16 * 1024
"""The text of each event a flooding engine sends: a few fill a stalled client's buffers."""

LINGER_S = 1.0
"""How long a lingering engine holds its stream open after ``data: [DONE]``."""


def chunk(content: str) -> bytes:
    """One chat completion chunk carrying ``content``, as an SSE event."""
    delta = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    return b"data: " + json.dumps(delta).encode() + b"\n\n"


@dataclass
class EngineLog:
    opened: int = 0
    """Streams (or answers) begun."""
    closed_by_client: int = 0
    """Streams whose client (the sidecar, the gateway) closed the connection before the end."""


LOG = web.AppKey("log", EngineLog)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _breaks_mid_event(request: web.Request) -> web.StreamResponse:
    """One whole chunk, then half of the next, then the connection drops (a crashed engine)."""
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk("whole ") + b'data: {"choices":[{"index":0,"delta":{"content":"par')
    await asyncio.sleep(0.05)  # the bytes leave first: an abort drops what is still unsent
    assert request.transport is not None
    request.transport.abort()
    return response


async def _floods(request: web.Request) -> web.StreamResponse:
    """``max_tokens`` events of FLOOD_EVENT_BYTES each, then ``data: [DONE]``."""
    log = request.app[LOG]
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    log.opened += 1
    try:
        for _ in range(int(body["max_tokens"])):
            await response.write(chunk("x" * FLOOD_EVENT_BYTES))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        log.closed_by_client += 1
        raise
    return response


async def _lingers_after_done(request: web.Request) -> web.StreamResponse:
    """Two chunks and ``data: [DONE]``, then the stream held open a while before it ends (an
    engine flushing late): a client that stops at [DONE], as the openai client does, has it all."""
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk("all ") + chunk("there") + b"data: [DONE]\n\n")
    await asyncio.sleep(LINGER_S)
    await response.write_eof()
    return response


async def _answers_html(request: web.Request) -> web.StreamResponse:
    await request.read()
    return web.Response(text="<html>a load balancer's page</html>", content_type="text/html")


def _answers_bytes(size: int, *, chunked: bool) -> Handler:
    """A whole JSON answer of ``size`` bytes, with a Content-Length or chunked."""

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        body = b'{"pad":"' + b"x" * (size - 10) + b'"}'
        if not chunked:
            return web.Response(body=body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for at in range(0, size, 4096):
            await response.write(body[at : at + 4096])
        await response.write_eof()
        return response

    return answer


ENGINES: dict[str, Handler] = {
    "breaks_mid_event": _breaks_mid_event,
    "floods": _floods,
    "answers_html": _answers_html,
    "lingers_after_done": _lingers_after_done,
}


@dataclass(frozen=True)
class Engine:
    url: str
    log: EngineLog


async def serve_engine(
    aiohttp_server: AiohttpServer, kind: str = "", *, answer_bytes: int = 0, chunked: bool = False
) -> Engine:
    """An engine whose chat completions behave as ``kind`` (a key of ENGINES), or, given
    ``answer_bytes``, answer a whole body that long."""
    handler = _answers_bytes(answer_bytes, chunked=chunked) if answer_bytes else ENGINES[kind]
    app = web.Application()
    log = app[LOG] = EngineLog()
    app.router.add_post(CHAT_PATH, handler)
    app.router.add_get("/health", _healthy)
    server = await aiohttp_server(app, host="127.0.0.1")
    return Engine(str(server.make_url("")).rstrip("/"), log)


async def _healthy(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def chat(*, stream: bool = True, max_tokens: int = 3, model: str = "demo-llm") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


@contextlib.asynccontextmanager
async def stalled_clients(port: int, count: int, body: dict[str, Any]) -> AsyncIterator[None]:
    """``count`` clients that send a streamed chat request to ``port`` with a tiny receive buffer
    and never read a byte of the answer, their connections held open until the block ends."""
    loop = asyncio.get_running_loop()
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.setblocking(False)
            socks.append(sock)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, post_bytes(json.dumps(body).encode(), CHAT_PATH))
        yield
    finally:
        for sock in socks:
            sock.close()


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait for ``check`` to hold (a bound on waits that should end much sooner)."""
    deadline = asyncio.get_running_loop().time() + PATIENCE
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


async def raw_events(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    """The whole body of a streamed answer, as the client received it."""
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/event-stream"
        return await resp.read()


async def stream_with_openai(base_url: str, model: str, received: list[str | None]) -> None:
    """Stream a chat completion with the official openai client, each chunk's text appended to
    ``received`` as it comes; raises what the client raises."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], stream=True
        )
        async for part in stream:
            received.append(part.choices[0].delta.content)
    finally:
        await client.close()


def counted_outcomes(registry: CollectorRegistry, counter: str) -> dict[str, float]:
    """The outcomes ``counter`` (a ``*_requests_total``) has counted so far, those at 0 left out."""
    found = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == counter and sample.value:
                found[sample.labels["outcome"]] = sample.value
    return found


SEEN = web.AppKey("seen", list)


@dataclass(frozen=True)
class RecordingEngine:
    url: str
    seen: list[Any]
    """The headers of each chat completion request, in order (names case-insensitive)."""


async def serve_recording_engine(
    aiohttp_server: AiohttpServer, key: str | None = None
) -> RecordingEngine:
    """An engine answering whole chat completions ("hi") and keeping each request's headers;
    with ``key``, one started with an API key (as `vllm --api-key`): 401 without it."""

    async def completions(request: web.Request) -> web.Response:
        request.app[SEEN].append(request.headers.copy())
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": {"message": "bad key", "type": "auth"}}, status=401)
        message = {"role": "assistant", "content": "hi"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        body = {"id": "c", "object": "chat.completion", "created": 0, "model": "demo-llm"}
        return web.json_response({**body, "choices": [choice]})

    app = web.Application()
    app[SEEN] = []
    app.router.add_post(CHAT_PATH, completions)
    app.router.add_get("/health", _healthy)
    server = await aiohttp_server(app, host="127.0.0.1")
    return RecordingEngine(str(server.make_url("")).rstrip("/"), app[SEEN])

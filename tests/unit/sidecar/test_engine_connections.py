"""An engine that closes each connection after its answer while announcing keep-alive, as
llama-server does after a streamed answer: back-to-back streams through the sidecar all succeed,
because the sidecar never sends a request on a connection the engine has already answered on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.support.scripted_engines import chunk, stream_with_openai
from tests.support.sidecar import StartSidecar

LINGER_S = 0.2
"""How long the engine keeps a connection open, unread, after its answer before closing it."""


async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read one request, answer it (a health check or a 2-token stream), linger, close."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        if head.startswith(b"GET"):
            writer.write(
                b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\n"
                b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
            )
        else:
            events = chunk("hi") + chunk(" there") + b"data: [DONE]\n\n"
            writer.write(
                b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\n"
                b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + f"{len(events):x}\r\n".encode()
                + events
                + b"\r\n0\r\n\r\n"
            )
        await writer.drain()
        await asyncio.sleep(LINGER_S)  # a request sent now on this connection is never answered
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def closing_engine() -> AsyncIterator[str]:
    server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def test_back_to_back_streams_survive_an_engine_that_closes_after_each_answer(
    start_sidecar: StartSidecar,
) -> None:
    async with closing_engine() as engine:
        sidecar = await start_sidecar(engine, protocol="openai")
        base_url = str(sidecar.client.make_url("/v1"))
        for _ in range(5):
            received: list[str | None] = []
            await stream_with_openai(base_url, "demo-llm", received)
            assert "".join(text or "" for text in received) == "hi there"

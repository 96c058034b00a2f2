"""The servers' read timeout, driven by raw clients on loopback: slow clients are cut off with a
JSON 408 and counted, and nothing a well-behaved client does is."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from modelroll_common.server import (
    BODY,
    HEAD,
    SILENT,
    ClientLimits,
    RequestTimedOut,
    read_body,
    start_server,
)
from tests.support.rawclient import closed_by_server, post_bytes, read_response

TIMEOUT = 0.4
PATIENCE = 10.0  # a bound on waits that should end much sooner; never what a test measures


class Served:
    def __init__(self, port: int, cut_offs: list[str]) -> None:
        self.port = port
        self.cut_offs = cut_offs
        self.writers: list[asyncio.StreamWriter] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers.append(writer)
        return reader, writer


async def _echo(request: web.Request) -> web.Response:
    try:
        body = await read_body(request)
    except RequestTimedOut as exc:  # as the gateway and the sidecar answer it
        response = web.json_response({"error": str(exc)}, status=408)
        response.force_close()
        return response
    delay = float(request.query.get("sleep", "0"))
    await asyncio.sleep(delay)
    return web.json_response({"got": len(body)})


async def _fail(request: web.Request) -> web.Response:
    raise RuntimeError("a bug in a handler")


def _app() -> web.Application:
    app = web.Application()
    app.router.add_post("/echo", _echo)
    app.router.add_get("/fail", _fail)
    return app


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    cut_offs: list[str] = []
    runner, site = await start_server(
        _app(), "127.0.0.1", 0, ClientLimits(TIMEOUT, cut_offs.append), shutdown_timeout=1.0
    )
    served = Served(site.port, cut_offs)
    try:
        yield served
    finally:
        for writer in served.writers:
            writer.close()
        await runner.cleanup()


async def _within(seconds: float, work: Callable[[], Awaitable[None]]) -> float:
    started = time.monotonic()
    await work()
    elapsed = time.monotonic() - started
    assert elapsed < seconds
    return elapsed


async def test_a_head_that_stops_half_way_gets_a_json_408_and_is_disconnected(
    served: Served,
) -> None:
    reader, writer = await served.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Le")
    started = time.monotonic()
    status, headers, body = await read_response(reader)
    waited = time.monotonic() - started
    assert status == 408
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert "within 0.4s" in json.loads(body)["error"]
    assert await closed_by_server(reader)
    assert TIMEOUT * 0.9 <= waited < TIMEOUT + 2.0
    assert served.cut_offs == [HEAD]


async def test_a_head_that_trickles_in_is_cut_off_although_bytes_keep_coming(
    served: Served,
) -> None:
    reader, writer = await served.connect()
    request = post_bytes(b'{"x": 1}', "/echo")
    answer = asyncio.ensure_future(read_response(reader))
    for byte in request[:40]:  # one byte every 20 ms: the head would take 0.8 s, twice the limit
        if answer.done():
            break
        writer.write(bytes([byte]))
        await asyncio.sleep(0.02)
    status, _, _ = await answer
    assert status == 408
    assert served.cut_offs == [HEAD]


async def test_a_client_still_sending_after_its_408_reads_the_408_not_a_reset(
    served: Served,
) -> None:
    """A trickling client that sends on while the server answers 408 reads the 408: the server
    does not close with the client's bytes unread, which would reset the connection and lose
    the answer (the client gets ECONNRESET instead)."""
    for _ in range(3):
        reader, writer = await served.connect()
        # A head that never ends: one long header, a byte every millisecond until the answer.
        request = b"POST /echo HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 10_000
        answer = asyncio.ensure_future(read_response(reader))
        for byte in request:
            if answer.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.001)
        status, _, body = await answer
        assert status == 408
        assert "did not arrive in full" in json.loads(body)["error"]
        writer.close()
    assert served.cut_offs == [HEAD] * 3


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer(
    served: Served,
) -> None:
    reader, _ = await served.connect()
    assert await asyncio.wait_for(reader.read(), PATIENCE) == b""
    assert served.cut_offs == [SILENT]


async def test_a_body_that_stops_half_way_gets_a_json_408_and_is_disconnected(
    served: Served,
) -> None:
    reader, writer = await served.connect()
    writer.write(post_bytes(b"x" * 100, "/echo")[:-60])  # the whole head, 40 bytes of the body
    status, headers, body = await read_response(reader)
    assert status == 408
    assert headers["content-type"].startswith("application/json")
    assert headers["connection"] == "close"
    assert "did not arrive in full" in json.loads(body)["error"]
    assert await closed_by_server(reader, within=2.0)  # at once: not after reading on for a while
    assert served.cut_offs == [BODY]


async def test_the_body_deadline_counts_from_the_first_byte_of_the_head(served: Served) -> None:
    """A head that takes most of the time leaves the body only the rest."""
    reader, writer = await served.connect()
    request = post_bytes(b"x" * 100, "/echo")
    head_end = request.index(b"\r\n\r\n") + 4
    writer.write(request[:10])
    await asyncio.sleep(TIMEOUT * 0.7)
    writer.write(request[10 : head_end + 10])
    await asyncio.sleep(TIMEOUT * 0.5)  # 1.2 x the timeout since the first byte
    writer.write(request[head_end + 10 :])
    status, _, _ = await read_response(reader)
    assert status == 408
    assert served.cut_offs == [BODY]


async def test_a_request_sent_in_pieces_within_the_limit_is_answered(served: Served) -> None:
    reader, writer = await served.connect()
    request = post_bytes(b"y" * 1000, "/echo")
    for offset in range(0, len(request), 100):
        writer.write(request[offset : offset + 100])
        await asyncio.sleep(TIMEOUT / 40)
    status, _, body = await read_response(reader)
    assert (status, json.loads(body)) == (200, {"got": 1000})
    assert served.cut_offs == []


async def test_keep_alive_connections_may_idle_and_handlers_may_be_slow(served: Served) -> None:
    """The limit is on receiving a request: not on the wait between requests, and not on the
    time the server takes to answer."""
    reader, writer = await served.connect()
    writer.write(post_bytes(b"{}", f"/echo?sleep={TIMEOUT * 2}"))
    status, headers, _ = await read_response(reader)
    assert status == 200
    assert headers.get("connection") != "close"
    await asyncio.sleep(TIMEOUT * 2)  # idle on a kept-alive connection
    writer.write(post_bytes(b"{}", "/echo"))
    assert (await read_response(reader))[0] == 200
    assert served.cut_offs == []


async def test_pipelined_requests_behind_a_slow_answer_are_answered_in_order(
    served: Served,
) -> None:
    reader, writer = await served.connect()
    writer.write(
        post_bytes(b"1", f"/echo?sleep={TIMEOUT * 1.5}")
        + post_bytes(b"22", "/echo")
        + post_bytes(b"333", "/echo")
    )
    answers = [await read_response(reader) for _ in range(3)]
    assert [(status, json.loads(body)) for status, _, body in answers] == [
        (200, {"got": 1}),
        (200, {"got": 2}),
        (200, {"got": 3}),
    ]
    assert served.cut_offs == []


async def test_a_slow_client_does_not_hold_up_others(served: Served) -> None:
    slow_reader, slow_writer = await served.connect()
    slow_writer.write(b"POST /echo HTTP/1.1\r\n")
    reader, writer = await served.connect()

    async def quick_requests() -> None:
        for _ in range(20):
            writer.write(post_bytes(b"{}", "/echo"))
            assert (await read_response(reader))[0] == 200

    await _within(TIMEOUT, quick_requests)
    assert (await read_response(slow_reader))[0] == 408


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (b"NOT-HTTP\r\n\r\n", 400, "method"),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n", 400, "8190 bytes"),
        (
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            400,
            "duplicate content-length",
        ),
        (b"GET /fail HTTP/1.1\r\nHost: t\r\n\r\n", 500, "internal server error (logged)"),
    ],
    ids=["not HTTP", "header too long", "two lengths", "handler raised"],
)
async def test_errors_aiohttp_answers_by_itself_are_json(
    served: Served, request_bytes: bytes, status: int, message: str
) -> None:
    reader, writer = await served.connect()
    writer.write(request_bytes)
    got, headers, body = await read_response(reader)
    assert got == status
    assert headers["content-type"] == "application/json"
    assert message in json.loads(body)["error"].lower()
    assert await closed_by_server(reader)

"""A broken or hostile upstream: ambiguous framing, cut answers, endless lines, header tricks.

Every class gets a 502 that names the fault, the connection is closed (never reused, so no
client can receive bytes meant for another), and the next client gets its own correct answer.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.support.gateway import RoutesFile, StartGateway, route
from tests.support.rawupstream import Reply, answer, raw_upstream

OK = json.dumps({"output": "ok", "model": "m", "version": "v1"}).encode()
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
CHUNKED_OK = b"%x\r\n%s\r\n0\r\n\r\n" % (len(OK), OK)

AMBIGUOUS = [
    (
        "duplicate length",
        HEAD + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s" % (len(OK), len(OK), OK),
        "Duplicate Content-Length",
    ),
    (
        "conflicting lengths",
        HEAD + b"Content-Length: 2\r\nContent-Length: %d\r\n\r\n%s" % (len(OK), OK),
        "Duplicate Content-Length",
    ),
    (
        "length and chunked",
        HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n" + CHUNKED_OK,
        "Content-Length can't be present with Transfer-Encoding",
    ),
    (
        "signed length",
        HEAD + b"Content-Length: +%d\r\n\r\n%s" % (len(OK), OK),
        "Invalid character in Content-Length",
    ),
    (
        "underscored length",
        HEAD + b"Content-Length: 0_%d\r\n\r\n%s" % (len(OK), OK),
        "Invalid character in Content-Length",
    ),
    (
        "coding ending in chunked",
        HEAD + b"Transfer-Encoding: xchunked\r\n\r\n" + CHUNKED_OK,
        "Transfer-Encoding is not exactly 'chunked'",
    ),
    (
        "gzip then chunked",
        HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + CHUNKED_OK,
        "Transfer-Encoding is not exactly 'chunked'",
    ),
    (
        "status 999",
        b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nok",
        "status 999 is not in 100-599",
    ),
    (
        "status 099",
        b"HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok",
        "status 99 is not in 100-599",
    ),
    (
        "bare LF in a value",
        HEAD.replace(b"json\r\n", b"json\nX-Evil: 1\r\n") + b"Content-Length: 2\r\n\r\nok",
        "Missing expected CR",
    ),
    (
        "control byte in a value",
        b"HTTP/1.1 200 OK\r\nContent-Type: a\x01b\r\nContent-Length: 2\r\n\r\nok",
        "Invalid header value char",
    ),
    (
        "non-ASCII passed-back value",
        b"HTTP/1.1 200 OK\r\nContent-Type: caf\xe9\r\nContent-Length: 2\r\n\r\nok",
        "content-type header has characters that are not allowed",
    ),
    (
        "two content types",
        HEAD + b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nok",
        "two content-type headers",
    ),
    (
        "switching protocols",
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: evil\r\n\r\n",
        "switch protocols",
    ),
    (
        "eleven interim answers",
        b"HTTP/1.1 100 Continue\r\n\r\n" * 11 + answer(OK),
        "more than 10 interim (1xx) answers",
    ),
    (
        "obsolete line folding",
        HEAD + b"X-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
        "not valid HTTP/1.1",
    ),
]


@pytest.mark.parametrize(
    ("reply", "reason"), [pytest.param(r, why, id=name) for name, r, why in AMBIGUOUS]
)
async def test_an_ambiguous_or_invalid_answer_is_a_502_on_a_connection_never_reused(
    start_gateway: StartGateway, routes_file: RoutesFile, reply: bytes, reason: str
) -> None:
    async with raw_upstream(lambda c, n: reply if c == 0 else answer(OK)) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        status, version, body = await gw.infer("m")
        assert (status, version) == (502, "v1")
        assert reason in body["error"]
        assert await gw.infer("m") == (200, "v1", json.loads(OK))
        assert up.connections == 2  # the first connection was dropped
    labels = {"model": "m", "version": "v1"}
    assert gw.sample("modelroll_gateway_upstream_errors_total", reason="protocol", **labels) == 1
    assert gw.sample("modelroll_gateway_requests_total", code="502", **labels) == 1
    assert gw.sample("modelroll_gateway_requests_total", code="200", **labels) == 1


async def test_a_few_interim_answers_before_the_real_one_are_fine(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    async with raw_upstream(lambda c, n: interim * 3 + answer(OK)) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        for _ in range(3):
            assert await gw.infer("m") == (200, "v1", json.loads(OK))
        assert up.connections == 1  # and the connection stays in step


async def test_bytes_after_the_answer_are_never_handed_to_the_next_client(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    """An upstream that answers twice: the second answer would reach the next client if the
    connection were reused."""
    smuggled = answer(json.dumps({"output": "for someone else"}).encode())
    async with raw_upstream(lambda c, n: answer(OK) + smuggled) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        for _ in range(3):
            assert await gw.infer("m") == (200, "v1", json.loads(OK))
        assert up.connections == 3


async def test_a_reset_in_the_middle_of_a_body_without_length_is_a_502(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    cut = Reply(HEAD + b"\r\n" + OK[:10], then="reset")  # no length: it would end at close
    async with raw_upstream(lambda c, n: cut if c == 0 else answer(OK)) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        status, _, body = await gw.infer("m")
        assert status == 502
        assert "reset before the end of the answer" in body["error"]
        assert await gw.infer("m") == (200, "v1", json.loads(OK))
    labels = {"model": "m", "version": "v1"}
    assert gw.sample("modelroll_gateway_upstream_errors_total", reason="closed", **labels) == 1


async def test_an_endless_chunk_line_is_cut_off_without_stalling_other_clients(
    start_gateway: StartGateway, routes_file: RoutesFile, aiohttp_server: AiohttpServer
) -> None:
    """A chunk-size line that never ends is cut off with a 502 naming the fault, again and
    again, while another model's client is answered all along."""
    endless = 0

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal endless
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n1;ext=")
        try:
            while True:  # until the gateway hangs up
                writer.write(b"a" * 16384)
                await writer.drain()
                endless += 16384
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"output": (await request.json())["payload"]})

    app = web.Application()
    app.router.add_post("/v1/infer", echo)
    good = await aiohttp_server(app, host="127.0.0.1")
    server = await asyncio.start_server(stream, "127.0.0.1", 0)
    hostile = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    routes_file.write(
        {
            "good": route("good", ("v1", 1, str(good.make_url("")).rstrip("/"))),
            "evil": route("evil", ("v1", 1, hostile)),
        }
    )
    gw = await start_gateway()

    stop = asyncio.Event()
    statuses: list[int] = []

    async def attack() -> None:
        while not stop.is_set():
            status, _, body = await gw.infer("evil")
            statuses.append(status)
            assert "too many bytes without progress" in body["error"]

    attackers = [asyncio.create_task(attack()) for _ in range(2)]
    cut_off_by_then = []
    for _ in range(100):
        assert (await gw.infer("good"))[0] == 200
        cut_off_by_then.append(len(statuses))
    stop.set()
    await asyncio.gather(*attackers)
    server.close()
    await server.wait_closed()

    assert set(statuses) == {502}
    assert endless > 0
    # Both kinds of client made progress at the same time: attacks were cut off (and new ones
    # started) while the good client's requests were answered one after another.
    assert cut_off_by_then[-1] - cut_off_by_then[0] >= 2, cut_off_by_then

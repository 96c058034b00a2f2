"""Forwarding over kept-alive connections: answer framings, closed connections, broken answers.

The upstreams here are raw asyncio servers on loopback that answer exactly the bytes a test
scripts, so the gateway meets the HTTP/1.1 framings and failures a sidecar (or its proxy) can show.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from modelroll_gateway.upstream import UpstreamPool
from tests.support.gateway import RoutesFile, StartGateway, route
from tests.support.rawupstream import Reply, answer, raw_upstream

OK = json.dumps({"output": "ok", "model": "m", "version": "v1"}).encode()


async def test_connections_are_kept_alive_between_requests(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    async with raw_upstream(lambda c, n: answer(OK)) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        for _ in range(20):
            assert (await gw.infer("m"))[:2] == (200, "v1")
        assert up.connections == 1


async def test_chunked_and_read_to_close_answers_pass_through_intact(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    big = json.dumps({"output": "x" * 300_000}).encode()
    chunked = b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in (big[:1000], big[1000:])
    )

    def script(conn: int, n: int) -> bytes:
        if conn == 0:
            return answer(chunked + b"0\r\nX-Trailer: 1\r\n\r\n", "Transfer-Encoding: chunked")
        return answer(big, "Connection: close")  # no length: the body ends when the socket does

    async with raw_upstream(script) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        for _ in range(3):
            status, _, body = await gw.infer("m")
            assert status == 200
            assert body == {"output": "x" * 300_000}


async def test_an_idle_connection_the_sidecar_closed_is_not_used_again(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    """A sidecar closes each connection once it has answered (an idle timeout, a restart): the
    gateway notices before it writes the next request, and opens a new connection."""
    async with raw_upstream(lambda c, n: Reply(answer(OK), then="close")) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        for _ in range(3):
            assert (await gw.infer("m"))[:2] == (200, "v1")
            await asyncio.sleep(0.05)  # the close reaches the gateway
        assert (up.connections, up.requests) == (3, 3)


async def test_a_request_the_upstream_received_is_never_sent_again(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    """The second request on a kept-alive connection is read in full and the connection closes
    without an answer: the model may have run it, so it is a 502, not a second inference."""
    async with raw_upstream(lambda c, n: answer(OK) if n == 0 else None) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        assert (await gw.infer("m"))[:2] == (200, "v1")
        status, version, body = await gw.infer("m")
        assert (status, version) == (502, "v1")
        assert "closed before the answer was complete" in body["error"]
        assert (up.connections, up.requests) == (1, 2)
        assert (await gw.infer("m"))[:2] == (200, "v1")  # a new connection for the next one
    labels = {"model": "m", "version": "v1"}
    assert gw.sample("modelroll_gateway_upstream_errors_total", reason="closed", **labels) == 1


async def test_a_refused_connection_is_retried_until_the_upstream_listens(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    """A new version's Service refuses connections until kube-proxy has programmed it: nothing
    was sent, so the gateway connects again (for up to 1.5 s) instead of answering 502."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    routes_file.write({"m": route("m", ("v1", 1, f"http://127.0.0.1:{port}"))})
    gw = await start_gateway()
    request = asyncio.ensure_future(gw.infer("m"))
    await asyncio.sleep(0.25)  # a few refusals
    requests = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        requests += 1
        writer.write(answer(OK))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        assert (await request)[:2] == (200, "v1")
    assert requests == 1  # sent once, once it could be


async def test_a_connection_is_replaced_once_it_is_older_than_its_max_age(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    """Behind a Service every connection is pinned to one pod: replacing old connections is what
    lets the pods of a scale-up take their share."""
    async with raw_upstream(lambda c, n: answer(OK)) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway(upstream_connection_max_age=0.3)
        for _ in range(3):
            assert (await gw.infer("m"))[:2] == (200, "v1")
        assert up.connections == 1  # reused while young
        await asyncio.sleep(0.35)
        assert (await gw.infer("m"))[:2] == (200, "v1")  # retired after this answer
        assert (await gw.infer("m"))[:2] == (200, "v1")
        assert (up.connections, up.requests) == (2, 5)


async def test_a_fresh_connection_closed_without_an_answer_is_a_502(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    async with raw_upstream(lambda c, n: None) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        status, version, body = await gw.infer("m")
        assert (status, version) == (502, "v1")
        assert "closed before the answer was complete" in body["error"]
        assert up.requests == 1  # not sent again: it may have been processed


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "Expected HTTP/"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "Invalid status code"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Invalid character in Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "Invalid character in chunk size",
        ),
    ],
)
async def test_a_broken_answer_is_a_502_naming_the_fault(
    start_gateway: StartGateway, routes_file: RoutesFile, reply: bytes, reason: str
) -> None:
    async with raw_upstream(lambda c, n: reply) as up:
        routes_file.write({"m": route("m", ("v1", 1, up.url))})
        gw = await start_gateway()
        status, version, body = await gw.infer("m")
        assert (status, version) == (502, "v1")
        assert reason in body["error"]
        listed = (await gw.routes())["models"][0]["versions"][0]["responses"]
        assert listed == {"502": 1}


async def test_an_aiohttp_streamed_answer_passes_through(
    start_gateway: StartGateway, routes_file: RoutesFile, aiohttp_server: AiohttpServer
) -> None:
    async def streamed(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b'{"output": ', b'"streamed", ', b'"version": "v1"}'):
            await resp.write(part)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/infer", streamed)
    server = await aiohttp_server(app, host="127.0.0.1")
    routes_file.write({"m": route("m", ("v1", 1, str(server.make_url("")).rstrip("/")))})
    gw = await start_gateway()
    for _ in range(3):
        assert await gw.infer("m") == (200, "v1", {"output": "streamed", "version": "v1"})


async def test_connections_per_version_are_capped_and_requests_wait_in_line(
    start_gateway: StartGateway, routes_file: RoutesFile, aiohttp_server: AiohttpServer
) -> None:
    in_flight, most = 0, 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.1)
        in_flight -= 1
        return web.json_response({"output": (await request.json())["payload"]})

    app = web.Application()
    app.router.add_post("/v1/infer", slow)
    server = await aiohttp_server(app, host="127.0.0.1")
    routes_file.write({"m": route("m", ("v1", 1, str(server.make_url("")).rstrip("/")))})
    gw = await start_gateway(upstream_max_connections=2)
    answers = await asyncio.gather(*(gw.infer("m", payload=i) for i in range(6)))
    assert [a[:2] for a in answers] == [(200, "v1")] * 6
    assert [a[2]["output"] for a in answers] == list(range(6))  # each its own answer
    assert most == 2
    labels = {"model": "m", "version": "v1"}
    assert gw.sample("modelroll_gateway_upstream_queued_total", **labels) == 4
    assert gw.sample("modelroll_gateway_upstream_waiting", **labels) == 0
    assert gw.sample("modelroll_gateway_upstream_connections", **labels) == 2


async def test_requests_up_to_the_cap_all_reach_a_version_that_holds_them(
    aiohttp_server: AiohttpServer,
) -> None:
    """Eight requests sent together, a cap of eight connections, a version that answers none
    until it has all eight: none may wait in line while a place is free (a connection just made
    must not count twice), or the version waits until every request's deadline."""
    arrived = 0
    everyone = asyncio.Event()

    async def held(request: web.Request) -> web.Response:
        nonlocal arrived
        arrived += 1
        if arrived == 8:
            everyone.set()
        await everyone.wait()
        return web.json_response({"output": (await request.json())["payload"]})

    app = web.Application()
    app.router.add_post("/v1/infer", held)
    server = await aiohttp_server(app, host="127.0.0.1")
    pool = UpstreamPool(connect_timeout=2.0, max_connections=8)
    endpoint = pool.endpoint(str(server.make_url("/v1/infer")))
    headers = b"Content-Type: application/json\r\n"
    try:
        deadline = pool.loop.time() + 5
        sent = []
        for i in range(8):  # one a loop iteration apart: each finds the others connecting
            body = b'{"payload": %d}' % i
            sent.append(asyncio.ensure_future(endpoint.post(body, headers, deadline)))
            await asyncio.sleep(0)
        answers = await asyncio.gather(*sent)
    finally:
        await pool.close()
    assert [a.status for a in answers] == [200] * 8
    assert [json.loads(a.body)["output"] for a in answers] == list(range(8))


async def test_a_request_waiting_for_a_connection_keeps_its_deadline(
    start_gateway: StartGateway, routes_file: RoutesFile, aiohttp_server: AiohttpServer
) -> None:
    async def stuck(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"output": "late"})

    app = web.Application()
    app.router.add_post("/v1/infer", stuck)
    server = await aiohttp_server(app, host="127.0.0.1")
    routes_file.write({"m": route("m", ("v1", 1, str(server.make_url("")).rstrip("/")))})
    gw = await start_gateway(upstream_max_connections=1, upstream_timeout=0.3)
    started = asyncio.get_running_loop().time()
    first, second = await asyncio.gather(gw.infer("m"), gw.infer("m"))
    took = asyncio.get_running_loop().time() - started
    assert (first[0], second[0]) == (504, 504)
    assert took < 2.0  # neither waited for the stuck answer; the one in line left at its deadline
    labels = {"model": "m", "version": "v1"}
    assert gw.sample("modelroll_gateway_upstream_queued_total", **labels) == 1
    assert gw.sample("modelroll_gateway_upstream_errors_total", reason="timeout", **labels) == 2


async def test_connections_are_reused_when_their_descriptors_are_above_1023(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    """A busy gateway holds more than 1024 sockets; the check that a kept-alive connection is
    still open must work for every descriptor (select() does not, above 1023)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.fail(f"the hard limit on open files is {hard}; this test needs 2048")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    fillers = [socket.socket() for _ in range(1100)]
    try:
        async with raw_upstream(lambda c, n: answer(OK)) as up:
            routes_file.write({"m": route("m", ("v1", 1, up.url))})
            gw = await start_gateway()
            for _ in range(5):
                assert (await gw.infer("m"))[:2] == (200, "v1")
            assert up.connections == 1
    finally:
        for filler in fillers:
            filler.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

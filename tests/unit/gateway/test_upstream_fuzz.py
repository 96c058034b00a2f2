"""Random answer framings thrown at the gateway's upstream client, through a real gateway.

Each example is an answer built from valid and broken pieces (status lines, lengths, codings,
chunkings with extensions and trailers, header values, bytes after the end) and sent in random
pieces. Properties: the gateway answers 200 or 502 (never 500: no exception escapes), within the
deadline (the loop never stalls); a 200 happens only for an unambiguous answer, and carries
exactly the body that answer framed; every unambiguous answer gets its 200.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway import Gateway, RoutesFile, StartGateway, route


@dataclass(frozen=True)
class Framing:
    """One answer: its bytes, and the body a correct client reads from it (None: ambiguous or
    invalid, so it must be refused)."""

    data: bytes
    body: bytes | None
    pieces: tuple[int, ...]


BODY = st.builds(lambda s: json.dumps({"output": s}).encode(), st.text(max_size=40))


@st.composite
def framings(draw: st.DrawFn) -> Framing:
    body = draw(BODY)
    valid = True
    status = draw(
        st.sampled_from(
            [
                b"HTTP/1.1 200 OK",
                b"HTTP/1.1 200 OK",
                b"HTTP/1.1 999 Odd",
                b"HTTP/1.1 2000 X",
                b"HTTP/2 200 OK",
                b"HTTP/1.1 200",
                b"HTTP/1.1  200 OK",
                b"SSH-2.0-x",
            ]
        )
    )
    if status not in (b"HTTP/1.1 200 OK", b"HTTP/1.1 200"):
        valid = False
    headers = [b"Content-Type: application/json"]
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    lengths = draw(
        st.sampled_from(["right", "right", "twice", "other", "plus", "space-inside", "none"])
    )
    codings = draw(st.sampled_from(["chunked", "chunked", "Chunked", "xchunked", "gzip, chunked"]))
    if framing == "length":
        if lengths == "right":
            headers.append(b"Content-Length: %d" % len(body))
        elif lengths == "twice":
            headers += [b"Content-Length: %d" % len(body)] * 2
            valid = False
        elif lengths == "other":
            headers.append(b"Content-Length: %d" % (len(body) + draw(st.integers(1, 5))))
            valid = False  # the answer never completes: the close cuts it short
        elif lengths == "plus":
            headers.append(b"Content-Length: +%d" % len(body))
            valid = False
        elif lengths == "space-inside":
            headers.append(b"Content-Length: %d %d" % (len(body), len(body)))
            valid = False
        else:
            framing = "close"
    if framing == "chunked":
        headers.append(b"Transfer-Encoding: " + codings.encode())
        if codings.lower() != "chunked":
            valid = False
        if draw(st.booleans()) and lengths != "none":
            headers.append(b"Content-Length: %d" % len(body))
            valid = False
        sizes = draw(st.lists(st.integers(1, 16), max_size=6))
        chunks, at = [], 0
        for size in [*sizes, len(body)]:
            part = body[at : at + size]
            at += len(part)
            if part:
                ext = draw(st.sampled_from([b"", b";a=1", b";x"]))
                chunks.append(b"%x%s\r\n%s\r\n" % (len(part), ext, part))
        trailer = draw(st.sampled_from([b"", b"X-Checksum: 1\r\n"]))
        payload = b"".join(chunks) + b"0\r\n" + trailer + b"\r\n"
    else:
        payload = body
    if draw(st.booleans()):
        value = draw(st.sampled_from([b"1", b"a\x01b", b"caf\xe9", b"a\nb", b"ok"]))
        headers.append(b"Retry-After: " + value)
        if value != b"1" and value != b"ok":
            valid = False
    data = status + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + payload
    complete = framing == "chunked" or (framing == "length" and lengths != "other")
    if complete and draw(st.booleans()):
        # After an answer that ended by its own framing, extra bytes only end the connection.
        # (After a too-large Content-Length they would be read as the rest of the body.)
        data += draw(st.sampled_from([b"junk", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]))
    cuts = draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=4, unique=True))
    return Framing(data, body if valid else None, tuple(sorted(cuts)))


@dataclass
class Current:
    framing: Framing | None = None


@pytest.fixture
async def fuzz_target(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> AsyncIterator[tuple[Gateway, Current]]:
    """One gateway in front of one raw upstream that answers whatever ``current`` holds, in its
    pieces, then closes the connection."""
    current = Current()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            framing = current.framing
            assert framing is not None
            start = 0
            for cut in (*framing.pieces, len(framing.data)):
                writer.write(framing.data[start:cut])
                await writer.drain()
                start = cut
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    routes_file.write(
        {"m": route("m", ("v1", 1, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"))}
    )
    gateway = await start_gateway(upstream_timeout=5.0)
    yield gateway, current
    server.close()
    await server.wait_closed()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(framing=framings())
async def test_random_framings_are_answered_or_refused_never_misread(
    fuzz_target: tuple[Gateway, Current], framing: Framing
) -> None:
    gateway, current = fuzz_target
    current.framing = framing
    async with gateway.session.post(
        gateway.url("/v1/models/m/infer"), json={"payload": "x"}
    ) as resp:
        body = await asyncio.wait_for(resp.read(), 10)
        status = resp.status
    if framing.body is None:
        assert status == 502, (framing, body)
        assert "error" in json.loads(body)
    else:
        assert (status, body) == (200, framing.body), framing

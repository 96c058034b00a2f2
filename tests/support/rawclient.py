"""A raw HTTP/1.1 client for tests of how the servers treat what clients send, byte by byte."""

from __future__ import annotations

import asyncio

PATIENCE = 10.0  # a bound on waits that should end much sooner; never what a test measures


def post_bytes(body: bytes, path: str) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    )


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lower-case names), body (by Content-Length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), PATIENCE)
    return status, headers, body


async def closed_by_server(reader: asyncio.StreamReader, within: float = PATIENCE) -> bool:
    """Whether the server closed the connection (EOF, or a reset) with nothing more to read."""
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except ConnectionResetError:
        return True

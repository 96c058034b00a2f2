"""Raw asyncio upstreams on loopback that answer exactly the bytes a test scripts, so the gateway
meets the HTTP/1.1 framings and failures a sidecar, its proxy or a hostile peer can show."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Reply:
    """Bytes to send for one request, and what the connection does afterwards: stay open for
    the next request, close (FIN), or reset (RST)."""

    data: bytes
    then: Literal["keep", "close", "reset"] = "keep"


# (connection number, request number on that connection) -> the reply; None: close unanswered
Script = Callable[[int, int], bytes | Reply | None]


def answer(body: bytes, *head: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", "Content-Type: application/json", *head]
    if not any(h.lower().startswith(("transfer-encoding", "connection: close")) for h in head):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class RawUpstream:
    url: str
    connections: int = 0
    requests: int = 0
    """Requests received in full."""
    peers: set[int] = field(default_factory=set)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset instead of a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def raw_upstream(script: Script) -> AsyncIterator[RawUpstream]:
    state = RawUpstream("")
    writers: set[asyncio.StreamWriter] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        conn = state.connections
        state.connections += 1
        state.peers.add(writer.get_extra_info("peername")[1])
        try:
            for n in range(1000):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                state.requests += 1
                action = script(conn, n)
                if action is None:
                    break
                reply = action if isinstance(action, Reply) else Reply(action)
                writer.write(reply.data)
                await writer.drain()
                if reply.then == "reset":
                    reset(writer)
                    return
                if reply.then == "close" or b"Connection: close" in reply.data:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            writers.discard(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        for writer in list(writers):  # the gateway's idle connections: end their handlers
            writer.close()
        await server.wait_closed()

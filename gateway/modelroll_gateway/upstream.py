"""A lean pooled HTTP/1.1 client for forwarding to sidecars: POST a body, read the whole answer.

aiohttp's client costs more per request than the gateway's whole server side; this one writes a
preformatted request on a kept-alive connection (one request at a time, no pipelining) and parses
the answer with llhttp, Node.js's HTTP parser (through httptools), in its strict mode.

Framing, as RFC 9112 asks: duplicate or conflicting Content-Length, Content-Length together with
Transfer-Encoding, a Transfer-Encoding other than exactly ``chunked``, numbers that are not plain
digits, line ends without CR, a status outside 100-599 and a passed-back header value with
anything but visible ASCII, space or tab are refused (502), and the connection is closed, never
reused. Bytes after the end of a complete answer do not fail it, but its connection is closed
too, so they never reach the next request. Heads, chunk-size lines and trailers, and the
number of interim (1xx) answers are bounded. A body without a length ends with the connection,
and counts only if the connection ended cleanly (FIN, not a reset).

Retries: a request is sent again only when it cannot have been processed. That is when no
connection could be opened (refused, unreachable: ``CONNECT_RETRY_DELAYS``), or when a kept-alive
connection turns out, just before it is reused, to have been closed by the upstream (the loop saw
its end, or the socket is readable while no answer is due). Once a request is written it is never
sent again: a connection lost after that is a 502 (``UpstreamClosed``), because the model may
already have run it.

Connections per endpoint are capped; a request that finds them all busy waits, in order, until
one is free or its deadline passes (504).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import ssl
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import httptools

from modelroll_common.calls import CALL_SIZE_HEADER
from modelroll_common.sse import MAX_ANSWER_BYTES

MAX_HEAD_BYTES = 64 * 1024
"""Largest head (status line and headers, or trailers) accepted."""
MAX_HEADERS = 100
MAX_STALL_BYTES = 64 * 1024
"""Bytes received without a step forward (a header, body bytes): bounds chunk-size lines,
chunk extensions and trailers."""
MAX_INTERIM = 10
"""Interim (1xx) answers accepted before the final one."""
MAX_BODY_BYTES = MAX_ANSWER_BYTES
"""Largest upstream answer accepted (a larger one is a protocol error: 502)."""

_VALUE = re.compile(rb"[\x20-\x7e\t]*")
"""A header value passed back to the client: visible ASCII, space and tab."""
_KEPT_HEADERS = {
    b"content-type": "content-type",
    b"retry-after": "retry-after",
    CALL_SIZE_HEADER.lower().encode(): CALL_SIZE_HEADER.lower(),
}
_WATCHED_LENGTHS = frozenset(
    len(n) for n in (b"content-length", b"transfer-encoding", *_KEPT_HEADERS)
)
"""The lengths of the names on_header looks at: any other name is passed over at once."""


class UpstreamError(Exception):
    """Forwarding failed before a complete answer arrived."""

    reason = "error"
    """The label of ``modelroll_gateway_upstream_errors_total``."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened (refused, unresolvable, or connect timed out)."""

    reason = "connect"


class UpstreamTimeout(UpstreamError):
    """No complete answer within the request's deadline (or no free connection by then)."""

    reason = "timeout"


class UpstreamProtocolError(UpstreamError):
    """The answer was not valid, unambiguous HTTP/1.1, or broke a bound."""

    reason = "protocol"


class UpstreamClosed(UpstreamProtocolError):
    """The connection ended after the request was written and before the answer was complete:
    not retried, since the upstream may have processed it."""

    reason = "closed"


class UpstreamResponse:
    """A complete answer: status, the headers the gateway passes on (lower-case names), body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class _Connection(asyncio.Protocol):
    """One kept-alive connection; parses one answer at a time into `waiter`.

    The parser calls the ``on_*`` methods; one that raises stops it, and ``_error`` says why.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.closed = False
        self.idle_since = 0.0
        self.opened_at = endpoint.loop.time()
        self.keep_alive = False
        self._parser: httptools.HttpResponseParser | None = None
        self._poller: select.poll | None = None
        self._start_answer()

    def _start_answer(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: bytes | bytearray = b""
        self._head_bytes = 0
        self._header_count = 0
        self._interim = 0
        self._stalled = 0
        self._length_given = False
        self._chunked = False
        self._head_done = False
        self._framed = False  # the answer says where it ends (length or chunked)
        self._done = False
        self._error: UpstreamProtocolError | None = None
        self.keep_alive = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        # One parser for every answer on this connection (llhttp parses one message after
        # another); any error ends the connection, so a parser never outlives its error.
        self._parser = httptools.HttpResponseParser(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # poll(), not select(): select cannot watch a descriptor above 1023
            self._poller = select.poll()
            with contextlib.suppress(OSError, ValueError):
                self._poller.register(sock.fileno(), select.POLLIN)
        self.endpoint.adopt(self)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        waiter = self.waiter
        if parser is None or waiter is None or waiter.done():
            self.abort()  # bytes nobody asked for: this connection is no longer in step
            return
        self._stalled += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._done:  # more bytes after a complete answer
                self.keep_alive = False
                return
            self._fail(
                self._error or UpstreamProtocolError(f"the answer is not valid HTTP/1.1 ({exc})")
            )
            self.abort()
            return
        if not self._done and self._stalled > MAX_STALL_BYTES:
            self._fail(UpstreamProtocolError("the answer sent too many bytes without progress"))
            self.abort()

    def eof_received(self) -> bool | None:
        self._end_of_stream(clean=True)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.endpoint.forget(self)
        self._end_of_stream(clean=exc is None)

    # -- the parser's callbacks ---------------------------------------------------------

    def _refuse(self, message: str) -> UpstreamProtocolError:
        self._error = UpstreamProtocolError(message)
        return self._error

    def on_message_begin(self) -> None:
        if self._done:
            raise self._refuse("bytes followed the end of the answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        count = self._header_count = self._header_count + 1
        size = self._head_bytes = self._head_bytes + len(name) + len(value)
        if count > MAX_HEADERS or size > MAX_HEAD_BYTES:
            raise self._refuse("the answer's head or trailers are too large")
        self._stalled = 0
        if len(name) not in _WATCHED_LENGTHS or self._head_done:
            return  # not a header the gateway reads (most are not: Date, Server), or a trailer
        key = name.lower()
        if key == b"content-length":
            self._length_given = True  # the parser checked its digits and that it is alone
        elif key == b"transfer-encoding":
            if self._chunked or value.strip().lower() != b"chunked":
                raise self._refuse("the answer's Transfer-Encoding is not exactly 'chunked'")
            self._chunked = True
        elif (kept := _KEPT_HEADERS.get(key)) is not None:
            if kept in self._headers:
                raise self._refuse(f"the answer has two {kept} headers")
            if not _VALUE.fullmatch(value):
                raise self._refuse(
                    f"the answer's {kept} header has characters that are not allowed"
                )
            self._headers[kept] = value.decode("ascii").strip()

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        status = parser.get_status_code()
        if not 100 <= status <= 599:
            raise self._refuse(f"the answer's status {status} is not in 100-599")
        if status == 101 or parser.should_upgrade():
            raise self._refuse("the upstream tried to switch protocols")
        if status < 200:  # an interim answer: the real one follows
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise self._refuse(f"more than {MAX_INTERIM} interim (1xx) answers")
            self._headers.clear()
            self._length_given = self._chunked = False
            return
        self._status = status
        self._head_done = True
        self._stalled = 0
        self._framed = self._length_given or self._chunked or status in (204, 304)
        self.keep_alive = self._framed and parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._stalled = 0
        if len(self._body) + len(body) > MAX_BODY_BYTES:
            raise self._refuse("the answer is too large")
        if not self._body:  # the usual answer comes in one piece: kept as it is, not copied
            self._body = body
        elif isinstance(self._body, bytearray):
            self._body += body
        else:
            self._body = bytearray(self._body) + body

    def on_message_complete(self) -> None:
        if self._head_done:  # else an interim answer ended
            self._done = True
            self._complete()

    # -- requests -----------------------------------------------------------------------

    def send(self, data: bytes) -> asyncio.Future[UpstreamResponse]:
        assert self.transport is not None
        self._start_answer()
        self.waiter = self.endpoint.loop.create_future()
        self.transport.write(data)
        return self.waiter

    def ended_while_idle(self) -> bool:
        """Whether this idle connection can no longer carry a request: closed, closing, or its
        socket readable (an end, a reset or stray bytes the loop has not handled yet)."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            return True
        if self._poller is None:
            return False
        try:
            return bool(self._poller.poll(0))
        except OSError:
            return True

    def _end_of_stream(self, *, clean: bool) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self._head_done and not self._framed:
            if clean:
                self._done = True
                self._complete()  # a body without a length ends here
                return
            message = "the connection was reset before the end of the answer"
        else:
            message = "the connection closed before the answer was complete"
        waiter.set_exception(UpstreamClosed(message))

    def _fail(self, exc: UpstreamError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _complete(self) -> None:
        waiter = self.waiter
        assert waiter is not None
        if not waiter.done():
            body = self._body
            waiter.set_result(
                UpstreamResponse(self._status, self._headers, bytes(body) if body else b"")
            )


#: Seconds between attempts to connect to an endpoint that refuses: 1.5 s in all.
CONNECT_RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8)


class Usage(Protocol):
    """Where an endpoint reports its connections (the gateway's per-version gauges)."""

    def connections(self, count: int) -> None:
        """Connections open or opening now."""

    def waiting(self, count: int, *, queued: bool = False) -> None:
        """Requests waiting for a free connection now; ``queued``: one more began to wait."""


class _Unobserved:
    def connections(self, count: int) -> None:
        pass

    def waiting(self, count: int, *, queued: bool = False) -> None:
        pass


class Endpoint:
    """Connections to one sidecar (scheme, host, port), and the request line prefix for it.

    At most ``pool.max_connections`` are open or opening at once; a request that finds them all
    busy waits in line (first come, first served) for one to be handed over or to close, until
    its deadline."""

    def __init__(self, pool: UpstreamPool, url: str, usage: Usage | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.pool = pool
        self.loop = pool.loop
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = pool.ssl_context if parts.scheme == "https" else None
        host_header = parts.netloc.rsplit("@", 1)[-1]
        path = parts.path or "/"
        self._target = f"{path} HTTP/1.1\r\nHost: {host_header}\r\n".encode()
        """The request line after its method, and the Host header."""
        self.idle: deque[_Connection] = deque()
        self.usage: Usage = usage or _Unobserved()
        self._live: set[_Connection] = set()
        self._connecting = 0
        self._line: deque[asyncio.Future[_Connection | None]] = deque()

    @property
    def open(self) -> int:
        """Connections open or being opened."""
        return self._connecting + len(self._live)

    def adopt(self, conn: _Connection) -> None:
        """A connection was made: it holds one of the places until it is lost."""
        self._live.add(conn)
        self.usage.connections(self.open)

    def forget(self, conn: _Connection) -> None:
        """A connection closed: drop it from the idle list, and free its place."""
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        if conn in self._live:
            self._live.discard(conn)
            self.usage.connections(self.open)
            self._hand_over(None)  # the first in line may open a connection now

    def _hand_over(self, conn: _Connection | None) -> bool:
        """Give ``conn`` (or, with None, the right to connect) to the first one waiting."""
        line = self._line
        while line:
            waiter = line.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                self.usage.waiting(len(line))
                return True
        return False

    async def _acquire_new(self, deadline: float) -> _Connection:
        """A new connection while under the cap, else the next one freed (no idle one was)."""
        while self.open >= self.pool.max_connections:
            handed = await self._wait_in_line(deadline)
            if handed is not None:
                return handed
        self._connecting += 1
        try:
            conn = await self._connect_retrying(deadline)
        finally:
            self._connecting -= 1
            self.usage.connections(self.open)
            # Until here a connection made counts twice (connection_made adopted it while it
            # still counted as opening): a request that came meanwhile may have joined the line
            # at the cap. Below the cap, the first in line may connect.
            if self.open < self.pool.max_connections:
                self._hand_over(None)
        return conn

    async def _wait_in_line(self, deadline: float) -> _Connection | None:
        waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
        self._line.append(waiter)
        self.usage.waiting(len(self._line), queued=True)
        timer = self.loop.call_at(deadline, _expire, waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                handed = waiter.result()  # handed over just as this request gave up
                if handed is not None:
                    self._release(handed, reusable=True)
                else:
                    self._hand_over(None)
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._line.remove(waiter)
            self.usage.waiting(len(self._line))

    async def _connect_retrying(self, deadline: float) -> _Connection:
        """Connect, and when refused or unreachable, try again after CONNECT_RETRY_DELAYS (while
        the deadline allows): nothing was sent, so nothing can run twice. A Service created a
        moment ago refuses connections until kube-proxy has programmed it (about a second)."""
        for delay in (*CONNECT_RETRY_DELAYS, None):
            try:
                return await self._connect()
            except UpstreamConnectError:
                if delay is None or self.loop.time() + delay >= deadline:
                    raise
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connect(self) -> _Connection:
        try:
            _, protocol = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self.ssl
                ),
                self.pool.connect_timeout,
            )
        except TimeoutError:
            raise UpstreamConnectError(f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise UpstreamConnectError(
                f"cannot connect to {self.host}:{self.port}: {reason}"
            ) from None
        return protocol

    def _acquire_idle(self) -> _Connection | None:
        idle = self.idle
        cutoff = self.loop.time() - self.pool.idle_timeout
        while idle:
            conn = idle.pop()
            if conn.idle_since >= cutoff and not conn.ended_while_idle():
                return conn
            conn.abort()
        return None

    def _release(self, conn: _Connection, reusable: bool) -> None:
        if reusable and self.loop.time() - conn.opened_at >= self.pool.max_age:
            conn.close()  # retired: the next request connects anew, maybe to another pod
        elif reusable and not conn.closed and not self.pool.closed:
            if self._line and self._hand_over(conn):
                return
            now = conn.idle_since = self.loop.time()
            idle = self.idle
            idle.append(conn)
            cutoff = now - self.pool.idle_timeout
            while idle[0].idle_since < cutoff:  # the oldest, left over from a burst
                idle.popleft().close()
        else:
            conn.abort()

    async def post(self, body: bytes, headers: bytes, deadline: float) -> UpstreamResponse:
        """Send one POST and return the whole answer; raises an UpstreamError subclass.

        Sent once: only a connection that could not be opened is tried again (see the module)."""
        head = b"POST %s%sContent-Length: %d\r\n\r\n" % (self._target, headers, len(body))
        return await self._exchange(head + body, deadline)

    async def get(self, headers: bytes, deadline: float) -> UpstreamResponse:
        """Send one GET (a question, such as a model's metadata) and return the whole answer;
        raises an UpstreamError subclass."""
        return await self._exchange(b"GET %s%s\r\n" % (self._target, headers), deadline)

    async def _exchange(self, data: bytes, deadline: float) -> UpstreamResponse:
        conn = self._acquire_idle() or await self._acquire_new(deadline)
        waiter = conn.send(data)
        timer = self.loop.call_at(deadline, _expire, waiter)
        ok = False
        try:
            response = await waiter
            ok = True
        finally:
            timer.cancel()
            self._release(conn, ok and conn.keep_alive)
        return response


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout("no complete answer in time"))


class UpstreamPool:
    """Endpoints by base URL, sharing timeouts; `close()` closes every idle connection."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        idle_timeout: float = 2.0,
        max_age: float = 10.0,
        max_connections: int = 100,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        """Seconds a kept-alive connection may idle and still be reused; older ones are closed
        by the gateway, which races with nobody. Below the sidecar's --prestop-delay-ms (3 s):
        a terminating sidecar closes its idle connections at the end of that delay, and only a
        connection idle for all of it can still be open then, so the gateway never writes a
        request on a connection at the moment the sidecar closes it."""
        self.max_age = max_age
        """Seconds a connection is reused for: a sidecar behind a Service is one of its pods,
        chosen when the connection opens, so only new connections reach new pods."""
        self.max_connections = max_connections
        """Connections per endpoint, open or opening; more requests wait for one."""
        self.ssl_context = ssl_context or ssl.create_default_context()
        self.closed = False
        self._endpoints: dict[str, Endpoint] = {}

    def endpoint(self, url: str, usage: Usage | None = None) -> Endpoint:
        """The endpoint for a full URL (scheme, host, port and path); made on first use, and
        reporting to the last ``usage`` given (a version whose series were forgotten, and that
        came back, reports to its new ones)."""
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            endpoint = self._endpoints[url] = Endpoint(self, url, usage)
        elif usage is not None:
            endpoint.usage = usage
        return endpoint

    @staticmethod
    def encode_headers(headers: Mapping[str, str]) -> bytes:
        """Request header lines (already validated by the server that parsed them)."""
        return b"".join(
            f"{k}: {v}\r\n".encode("utf-8", "surrogateescape") for k, v in headers.items()
        )

    async def close(self) -> None:
        self.closed = True
        for endpoint in self._endpoints.values():
            while endpoint.idle:
                endpoint.idle.pop().close()

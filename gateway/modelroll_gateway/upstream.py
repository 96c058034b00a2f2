"""A lean pooled HTTP/1.1 client for forwarding to sidecars: POST a body, read the whole answer.

aiohttp's client costs more per request than the gateway's whole server side; this one writes a
preformatted request on a kept-alive connection and parses the answer in `data_received`. One
request per connection at a time (no pipelining); Content-Length, chunked and read-to-close
bodies. Idle connections are reused newest first and dropped after `idle_timeout`, well before
aiohttp servers close them (75 s), so a request rarely meets a connection the sidecar is closing;
when one does (it is lost before any byte of the answer), the request is sent once more on a new
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest upstream answer accepted (a larger one is a protocol error: 502)."""


class UpstreamError(Exception):
    """Forwarding failed before a complete answer arrived."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened (refused, unresolvable, or connect timed out)."""


class UpstreamTimeout(UpstreamError):
    """No complete answer within the request timeout."""


class UpstreamProtocolError(UpstreamError):
    """The connection broke, or the answer was not valid HTTP/1.1."""


class _ConnectionLost(UpstreamProtocolError):
    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


class UpstreamResponse:
    """A complete answer: status, the headers the gateway passes on (lower-case names), body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


_KEPT_HEADERS = frozenset({"content-type", "retry-after"})


class _Connection(asyncio.Protocol):
    """One kept-alive connection; parses one answer at a time into `waiter`."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.closed = False
        self.idle_since = 0.0
        self.opened_at = endpoint.loop.time()
        self.used = False
        self._reset()

    def _reset(self) -> None:
        self._buffer = bytearray()
        self._reset_head()

    def _reset_head(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._head_done = False
        self._length = -1  # Content-Length; -1: chunked or read to close
        self._chunked = False
        self.keep_alive = True
        self._body = bytearray()
        self._chunk_left = -1  # bytes left in the current chunk (+CRLF); -1: at a size line

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for: this connection is no longer in step
            return
        self._buffer += data
        try:
            self._parse()
        except UpstreamProtocolError as exc:
            self._fail(exc)
            self.abort()

    def eof_received(self) -> bool | None:
        self._finish_at_close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.endpoint.forget(self)
        self._finish_at_close()

    # -- requests -----------------------------------------------------------------------

    def send(self, data: bytes) -> asyncio.Future[UpstreamResponse]:
        assert self.transport is not None
        self._reset()
        self.waiter = self.endpoint.loop.create_future()
        self.transport.write(data)
        return self.waiter

    def _finish_at_close(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self._head_done and self._length < 0 and not self._chunked:
            self._complete(bytes(self._buffer))  # a read-to-close body ends here
            return
        answered = self._head_done or bool(self._buffer)
        waiter.set_exception(
            _ConnectionLost(
                "the connection closed before the answer was complete", answered=answered
            )
        )

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

    # -- parsing ------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buffer
        if not self._head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise UpstreamProtocolError("the answer's head is too large")
                return
            self._parse_head(bytes(buf[:end]))
            del buf[: end + 4]
            if 100 <= self._status < 200:
                self._reset_head()  # an interim answer: the real one follows
                self._parse()
                return
            if self._status in (204, 304):
                self._length = 0
        if self._length >= 0:
            if len(buf) >= self._length:
                if len(buf) > self._length:
                    self.keep_alive = False  # more bytes than announced: do not reuse
                self._complete(bytes(buf[: self._length]))
            return
        if self._chunked:
            self._parse_chunks()
        elif len(buf) > MAX_BODY_BYTES:
            raise UpstreamProtocolError("the answer is too large")

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise UpstreamProtocolError("the answer is not HTTP/1.x")
        try:
            self._status = int(parts[1])
        except ValueError:
            raise UpstreamProtocolError("the answer has no valid status") from None
        if not 100 <= self._status <= 999:
            raise UpstreamProtocolError("the answer has no valid status")
        self.keep_alive = parts[0] == "HTTP/1.1"
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise UpstreamProtocolError("the answer has a malformed header line")
            key = name.lower()
            text = value.strip()
            if key == "content-length":
                try:
                    self._length = int(text)
                except ValueError:
                    raise UpstreamProtocolError("the answer has a bad Content-Length") from None
                if not 0 <= self._length <= MAX_BODY_BYTES:
                    raise UpstreamProtocolError("the answer is too large")
            elif key == "transfer-encoding":
                self._chunked = text.lower().endswith("chunked")
            elif key == "connection":
                token = text.lower()
                if "close" in token:
                    self.keep_alive = False
                elif "keep-alive" in token:
                    self.keep_alive = True
            elif key in _KEPT_HEADERS:
                headers[key] = text
        if self._chunked:
            self._length = -1
        self._headers = headers
        self._head_done = True

    def _parse_chunks(self) -> None:
        buf = self._buffer
        while True:
            if self._chunk_left == -1:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise UpstreamProtocolError("the answer has a bad chunk size") from None
                del buf[: end + 2]
                if size == 0:
                    self._chunk_left = -2  # trailers until an empty line
                else:
                    self._chunk_left = size + 2
                    if len(self._body) + size > MAX_BODY_BYTES:
                        raise UpstreamProtocolError("the answer is too large")
            if self._chunk_left == -2:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[: end + 2]
                if end == 0:
                    self._complete(bytes(self._body))
                    return
                continue
            if len(buf) < self._chunk_left:
                return
            self._body += buf[: self._chunk_left - 2]
            del buf[: self._chunk_left]
            self._chunk_left = -1

    def _complete(self, body: bytes) -> None:
        waiter = self.waiter
        assert waiter is not None
        if not waiter.done():
            waiter.set_result(UpstreamResponse(self._status, self._headers, body))


#: Seconds between attempts to connect to an endpoint that refuses: 1.5 s in all.
CONNECT_RETRY_DELAYS = (0.1, 0.2, 0.4, 0.8)


class Endpoint:
    """Connections to one sidecar (scheme, host, port), and the request line prefix for it."""

    def __init__(self, pool: UpstreamPool, url: str) -> None:
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
        self.prefix = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode()
        self.idle: deque[_Connection] = deque()

    def forget(self, conn: _Connection) -> None:
        """Drop a closed connection from the idle list (if it is there)."""
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

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
            if not conn.closed and conn.idle_since >= cutoff:
                return conn
            conn.close()
        return None

    def _release(self, conn: _Connection, reusable: bool) -> None:
        if reusable and self.loop.time() - conn.opened_at >= self.pool.max_age:
            conn.close()  # retired: the next request connects anew, maybe to another pod
        elif reusable and not conn.closed and not self.pool.closed:
            now = conn.idle_since = self.loop.time()
            idle = self.idle
            idle.append(conn)
            cutoff = now - self.pool.idle_timeout
            while idle[0].idle_since < cutoff:  # the oldest, left over from a burst
                idle.popleft().close()
        else:
            conn.abort()

    async def post(self, body: bytes, headers: bytes, deadline: float) -> UpstreamResponse:
        """Send one POST and return the whole answer; raises an UpstreamError subclass."""
        data = b"%s%sContent-Length: %d\r\n\r\n%s" % (self.prefix, headers, len(body), body)
        for attempt in (0, 1):
            conn = self._acquire_idle()
            reused = conn is not None
            if conn is None:
                conn = await self._connect_retrying(deadline)
            waiter = conn.send(data)
            timer = self.loop.call_at(deadline, _expire, waiter)
            ok = False
            try:
                response = await waiter
                ok = True
            except _ConnectionLost as exc:
                if reused and not exc.answered and attempt == 0:
                    continue  # the sidecar closed this idle connection as we sent: once more
                raise
            finally:
                timer.cancel()
                self._release(conn, ok and conn.keep_alive)
            return response
        raise AssertionError("unreachable")  # pragma: no cover


def _expire(waiter: asyncio.Future[UpstreamResponse]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout("no complete answer in time"))


class UpstreamPool:
    """Endpoints by base URL, sharing timeouts; `close()` closes every idle connection."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        idle_timeout: float = 30.0,
        max_age: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.max_age = max_age
        """Seconds a connection is reused for: a sidecar behind a Service is one of its pods,
        chosen when the connection opens, so only new connections reach new pods."""
        self.ssl_context = ssl_context or ssl.create_default_context()
        self.closed = False
        self._endpoints: dict[str, Endpoint] = {}

    def endpoint(self, url: str) -> Endpoint:
        """The endpoint for a full URL (scheme, host, port and path); made on first use."""
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            endpoint = self._endpoints[url] = Endpoint(self, url)
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

"""The HTTP server the gateway and the sidecar run: aiohttp's, with slow clients cut off, and
JSON for the errors aiohttp answers by itself.

aiohttp closes a keep-alive connection that stays idle (``keepalive_timeout``), but nothing bounds
a client that sends its request slowly: a head that trickles in a byte at a time, or a body that
never ends, holds its connection and its buffers for as long as the client likes. Here every
request must arrive whole within the read timeout (``ClientLimits.read_timeout``), counted from
its first byte, or from the moment the connection opened for a connection's first request:

* a head still incomplete at that time gets ``408`` (JSON) and the connection closes once the
  client stops sending, or ``LINGER_S`` later (what it sends meanwhile is dropped: closing on
  unread bytes would reset the connection and lose the 408); a new connection that sent nothing
  at all is closed without an answer (phase ``silent``);
* a body still incomplete gets ``408`` from the handler that reads it (:func:`read_body`), and the
  connection closes.

Every cut-off is reported to ``ClientLimits.on_cut_off`` with its phase (``silent``, ``head``,
``body``), which the servers count in a metric. Idle keep-alive connections between requests are
left to aiohttp's own ``keepalive_timeout``.

aiohttp has no hook for "the first byte of a request" or "a head is complete", so
:class:`ServerConnection` watches them in ``data_received``, using two attributes of aiohttp's
``RequestHandler`` (``_waiter``, pending while the connection waits for a request, the test its
own keep-alive expiry uses; ``_request_count``, the requests parsed so far). aiohttp is pinned in
``constraints.txt``; ``tests/unit/common/test_server.py`` fails if either changes meaning.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import web

from .errors import error_body

log = logging.getLogger(__name__)

LINGER_S = 2.0
"""How long a connection cut off mid-head stays open after its 408, dropping what arrives."""
SILENT = "silent"
HEAD = "head"
BODY = "body"
PHASES = (SILENT, HEAD, BODY)
"""How far a client that was cut off had got: nothing sent, part of the head, part of the body."""


def _ignore(phase: str) -> None:
    pass


@dataclass(frozen=True)
class ClientLimits:
    """How long a client may take to send one request, and who hears about cut-offs."""

    read_timeout: float
    """Seconds from a request's first byte (a new connection: from its opening) to its last."""
    on_cut_off: Callable[[str], None] = field(default=_ignore)
    """Called with the phase (one of :data:`PHASES`) of every client cut off."""

    def __post_init__(self) -> None:
        if not self.read_timeout > 0:
            raise ValueError(f"the read timeout must be positive, got {self.read_timeout}")


class RequestTimedOut(Exception):
    """The client did not send its whole body within the read timeout."""

    def __init__(self, read_timeout: float) -> None:
        super().__init__(f"the request did not arrive in full within {read_timeout:g}s")


_handler_data_received = web.RequestHandler.data_received
"""aiohttp's own, called directly: this is on the path of every request."""


class ServerConnection(web.RequestHandler):
    """aiohttp's handler for one client connection, plus the read-timeout clock (module doc)."""

    __slots__ = (
        "_clock",
        "_clock_bytes",
        "_clock_loop",
        "_clock_started",
        "_limits",
        "_lingering",
        "request_started",
    )

    def __init__(self, manager: web.Server, *, limits: ClientLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._clock_loop = asyncio.get_running_loop()
        self._limits = limits
        self._clock: asyncio.TimerHandle | None = None
        self._clock_started: float | None = None
        self._clock_bytes = False
        self._lingering = False
        self.request_started = 0.0
        """When the last request whose head is complete started (its clock), in loop time."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_clock(self._clock_loop.time(), got_bytes=False)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_clock()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # On the path of every request: a few attribute reads, and the time only when needed.
        if self._lingering:  # answered 408 already: what still comes is dropped
            return
        started = self._clock_started
        if started is None:
            waiter = self._waiter
            if waiter is not None and not waiter.done():  # waiting: a request's first bytes
                started = self._clock_loop.time()
        count = self._request_count
        _handler_data_received(self, data)
        if self._request_count != count:  # a head is complete; its body is read_body's
            self.request_started = started if started is not None else self._clock_loop.time()
            if self._clock is not None:
                self._stop_clock()
        elif started is not None:
            if self._clock_started is None:
                self._start_clock(started, got_bytes=True)
            else:
                self._clock_bytes = True

    def _start_clock(self, started: float, *, got_bytes: bool) -> None:
        self._clock_started = started
        self._clock_bytes = got_bytes
        self._clock = self._clock_loop.call_at(started + self._limits.read_timeout, self._cut_off)

    def _stop_clock(self) -> None:
        self._clock_started = None
        if self._clock is not None:
            self._clock.cancel()
            self._clock = None

    def _cut_off(self) -> None:
        """The clock ran out with the head incomplete. No request is being answered then (the
        clock runs only while the connection waits for one), so the 408 cannot interleave."""
        self._clock = None
        self._clock_started = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._clock_bytes:
            self._limits.on_cut_off(HEAD)
            body = error_body(self._timed_out_message())
            transport.write(
                b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            self._linger(transport)
            return
        self._limits.on_cut_off(SILENT)
        self.force_close()  # the transport sends what it holds, then closes

    def _linger(self, transport: asyncio.Transport) -> None:
        """End our side after the 408 but read on, dropping what the client still sends, for up
        to LINGER_S: closing with its bytes unread would reset the connection, and the reset can
        destroy the 408 before the client has read it (Apache's and nginx's lingering close)."""
        self._lingering = True
        if transport.can_write_eof():
            transport.write_eof()
        self._clock_loop.call_later(LINGER_S, self.force_close)

    def _timed_out_message(self) -> str:
        return str(RequestTimedOut(self._limits.read_timeout))

    async def read_body(self, request: web.BaseRequest) -> bytes:
        limits = self._limits
        try:
            async with asyncio.timeout_at(self.request_started + limits.read_timeout):
                return await request.read()
        except TimeoutError:
            limits.on_cut_off(BODY)
            # Take nothing more from this client, and end its body here, so that aiohttp sends
            # the answer and closes instead of reading on ("lingering") for up to 10 s.
            self.close()
            request.content.feed_eof()
            raise RequestTimedOut(limits.read_timeout) from None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The answer aiohttp gives by itself (a request it cannot parse, a handler that
        raised), as JSON like every other error. Server errors are logged with their traceback;
        a client's malformed request only at debug level."""
        if status >= 500:
            self.log_exception("Error handling %s %s", request.method, request.path, exc_info=exc)
        else:
            self.log_debug("Refused a request with %d: %s", status, message or exc)
        if request.writer.output_size > 0:  # the answer was under way: the connection is lost
            raise ConnectionError("the response had started; it cannot become an error")
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            text = "internal server error (logged)"
        elif message:
            text = message
        else:
            text = HTTPStatus(status).phrase
        response = web.Response(status=status, body=error_body(text))
        response.content_type = "application/json"
        response.force_close()
        return response


async def read_body(request: web.BaseRequest) -> bytes:
    """The request's body, read within the read timeout that started with its first byte.
    Raises :class:`RequestTimedOut` (the caller answers 408 and closes the connection), or
    aiohttp's ``HTTPRequestEntityTooLarge`` past the app's ``client_max_size``."""
    protocol = request.protocol
    if request.content.is_eof() or not isinstance(protocol, ServerConnection):
        return await request.read()  # all here already, or served without limits (tests)
    return await protocol.read_body(request)


class ServerSite(web.BaseSite):
    """A TCP site whose connections are :class:`ServerConnection`."""

    __slots__ = ("_handler_args", "_host", "_limits", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: ClientLimits,
        **handler_args: Any,
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._limits = limits
        self._handler_args = handler_args

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The port listened on (the one the system chose, for port 0)."""
        if self._server is not None:
            sockets = getattr(self._server, "sockets", None) or ()
            for sock in sockets:
                return int(sock.getsockname()[1])
        return self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None, "runner.setup() comes first"
        loop = asyncio.get_running_loop()
        limits = self._limits
        handler_args = self._handler_args

        def connection() -> ServerConnection:
            return ServerConnection(server, loop=loop, limits=limits, **handler_args)

        self._server = await loop.create_server(
            connection, self._host, self._port, backlog=self._backlog, reuse_address=True
        )


async def start_server(
    app: web.Application,
    host: str,
    port: int,
    limits: ClientLimits,
    *,
    shutdown_timeout: float,
    handler_cancellation: bool = False,
) -> tuple[web.AppRunner, ServerSite]:
    """Run `app`'s startup and listen on host:port; ``runner.cleanup()`` stops it all."""
    runner = web.AppRunner(
        app, handler_cancellation=handler_cancellation, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    site = ServerSite(runner, host, port, limits, access_log=None)
    await site.start()
    return runner, site


async def stop_signal() -> None:
    """Return at the first SIGTERM or SIGINT. Later ones are ignored, so that a second signal
    cannot kill the process in the middle of its shutdown."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def new_event_loop(kind: str, program: str) -> asyncio.AbstractEventLoop:
    """uvloop's loop when `kind` asks for it, or by default ("auto") when it is installed; else
    asyncio's. (The benchmarks run their ceilings on the loop of the server they compare.)"""
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise SystemExit(
                    f"{program}: --event-loop uvloop, but uvloop is not installed"
                ) from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()

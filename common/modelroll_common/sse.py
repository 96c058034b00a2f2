"""OpenAI answers passing through the sidecar and the gateway. :func:`relay` streams a server-sent
event stream from an upstream to a client event by event, bytes untouched, while reading the
events' ``data`` (whatever pieces the bytes arrive in) for what an OpenAI-style generation stream
says about itself: its first and last tokens, how many, its usage, whether it ended with
``data: [DONE]``. :func:`read_whole` reads an answer that is not streamed, within a cap.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

MAX_EVENT_BYTES = 1 << 20
"""An event longer than this (no blank line in 1 MiB) is not an SSE stream worth watching."""
MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The largest model answer the sidecar and the gateway read whole (a larger one is a 502)."""
EVENT_STREAM = "text/event-stream"

_LINE_END = re.compile(rb"[\r\n]")
_CR, _LF = 0x0D, 0x0A


class EventTooLong(ValueError):
    pass


class EventScanner:
    """Splits an event stream into events as its bytes arrive, in whatever pieces: :meth:`take`
    gives the bytes of the events a piece completes, exactly as they came, and their ``data``
    fields (multi-line data joined by newlines); the bytes of an event not yet complete are held
    until it is. Lines other than ``data:`` (comments, ``event:``, ``id:``) are skipped. Lines
    end with CRLF, LF or a lone CR, as the SSE format allows, a CRLF split between pieces too."""

    def __init__(self) -> None:
        self._pending = bytearray()
        """The bytes of the event not yet complete."""
        self._line = 0
        """Where in ``_pending`` the line being read starts."""
        self._data: list[bytes] = []
        """The ``data`` lines of the event not yet complete."""
        self._after_cr = False
        """``_pending`` ends with a CR that ended a line: an LF next belongs to it."""

    def feed(self, chunk: bytes) -> list[str]:
        """The ``data`` of each event ``chunk`` completes."""
        return self.take(chunk)[1]

    def take(self, chunk: bytes) -> tuple[bytes, list[str]]:
        """The bytes of the events ``chunk`` completes (from where the bytes held back begin),
        and their data; EventTooLong when an event grows past MAX_EVENT_BYTES."""
        buffer = self._pending
        at = len(buffer)
        buffer += chunk
        complete = 0
        if self._after_cr and at < len(buffer):
            self._after_cr = False
            if buffer[at] == _LF:
                at += 1
                self._line = at
                if at == 1:  # the CR before it ended an event: the LF goes with that event
                    complete = 1
        found: list[str] = []
        while (match := _LINE_END.search(buffer, at)) is not None:
            end = match.start()
            line = bytes(buffer[self._line : end])
            at = end + 1
            if buffer[end] == _CR:
                if at == len(buffer):
                    self._after_cr = True
                elif buffer[at] == _LF:
                    at += 1
            self._line = at
            if line:
                if line.startswith(b"data:"):
                    self._data.append(line[5:].removeprefix(b" "))
            else:  # a blank line: the event is complete
                complete = at
                if self._data:
                    found.append(b"\n".join(self._data).decode(errors="replace"))
                    self._data = []
        whole = bytes(buffer[:complete])
        del buffer[:complete]
        self._line -= complete
        if len(buffer) > MAX_EVENT_BYTES:
            raise EventTooLong(f"an event is longer than {MAX_EVENT_BYTES} bytes")
        return whole, found


@dataclass
class GenerationWatch:
    """What an OpenAI chat or text completion stream has said so far."""

    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: int = 0
    """Chunks that carried generated text (one token each, as engines stream them)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    """From the stream's ``usage``, when it sends one."""
    done: bool = False
    """``data: [DONE]`` arrived: the stream is complete."""
    error: str | None = None
    """An ``error`` event's message."""

    def saw(self, data: str, now: float) -> None:
        if data == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if isinstance(event.get("error"), dict | str):
            failure = event["error"]
            self.error = str(failure.get("message") if isinstance(failure, dict) else failure)
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = _count(usage.get("prompt_tokens"))
            self.completion_tokens = _count(usage.get("completion_tokens"))
        for choice in event.get("choices") or []:
            if isinstance(choice, dict) and _text(choice):
                self.tokens += 1
                if self.first_token_at is None:
                    self.first_token_at = now
                self.last_token_at = now

    @property
    def time_per_output_token(self) -> float | None:
        """Seconds from the first token to the last over the tokens after the first: the
        decode speed a reader of the stream saw (None before a second token)."""
        if self.first_token_at is None or self.last_token_at is None or self.tokens < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (self.tokens - 1)

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.tokens


def _text(choice: dict[str, object]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content"))
    return bool(choice.get("text"))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


RELAY_OUTCOMES = (
    "completed",
    "error",
    "upstream_error",
    "client_disconnect",
    "client_stalled",
    "cut",
)


@dataclass
class Relayed:
    """One answer passing through, filled in as it goes, so that a handler cancelled midway still
    knows what happened: what its stream said, the response begun for the client (None until
    then), and how it ended (one of RELAY_OUTCOMES or the caller's own; None while it goes on)."""

    watch: GenerationWatch = field(default_factory=GenerationWatch)
    response: web.StreamResponse | None = None
    outcome: str | None = None

    @property
    def delivered(self) -> str | None:
        """The outcome the client already has, whatever happens to the connection after: the
        upstream's error event (``error``) or ``data: [DONE]`` (``completed``) was handed to it.
        The official openai client closes its connection as soon as it reads [DONE]."""
        if self.watch.error is not None:
            return "error"
        return "completed" if self.watch.done else None

    @property
    def sent_status(self) -> int | None:
        """The status of the client's answer once it has begun (was sent), else None."""
        response = self.response
        return response.status if response is not None and response.prepared else None


async def recorded(
    answer: Callable[[Relayed], Awaitable[web.StreamResponse]],
    record: Callable[[str, Relayed, bool], None],
) -> web.StreamResponse:
    """``answer(relayed)``, then ``record(outcome, relayed, False)``; or, when the client going
    away cancels the handler, ``record(outcome, relayed, True)`` (the outcome
    ``client_disconnect``, unless the answer had ended otherwise or the client already had its
    end) before the cancellation goes on. Either way an answer is recorded once, with what was
    seen of it."""
    relayed = Relayed()
    try:
        response = await answer(relayed)
    except asyncio.CancelledError:
        record(relayed.outcome or relayed.delivered or "client_disconnect", relayed, True)
        raise
    assert relayed.outcome is not None, "every answer says how it ended"
    record(relayed.outcome, relayed, False)
    return response


def error_event(message: str) -> bytes:
    """An OpenAI-style SSE error event, which OpenAI's clients raise as an APIError."""
    body = {"error": {"message": message, "type": "server_error", "code": 502}}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class AnswerTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is larger than {limit} bytes")
        self.limit = limit


async def read_whole(upstream: aiohttp.ClientResponse, limit: int) -> bytes:
    """``upstream``'s whole body, or AnswerTooLarge past ``limit`` bytes (at once when its
    Content-Length says so); the connection is then closed, the rest never read."""
    if upstream.content_length is not None and upstream.content_length > limit:
        upstream.close()
        raise AnswerTooLarge(limit)
    body = bytearray()
    async for piece in upstream.content.iter_any():
        body += piece
        if len(body) > limit:
            upstream.close()
            raise AnswerTooLarge(limit)
    return bytes(body)


def asks_stream(request_body: bytes) -> bool:
    """Whether an OpenAI request asks for its answer streamed (``"stream": true``)."""
    try:
        body = json.loads(request_body)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("stream") is True


def unstreamed(upstream: aiohttp.ClientResponse, request_body: bytes) -> bool:
    """A 200 that is not an event stream, to a request that asked for one (``"stream": true``):
    nothing an OpenAI client can read as the stream it asked for."""
    if upstream.status != 200 or upstream.content_type == EVENT_STREAM:
        return False
    return asks_stream(request_body)


class OpenStreams:
    """The upstream streams a proxy is relaying now, so that a proxy whose drain is running out
    can end them itself: :meth:`cut` closes each, and its relay then ends the client's stream
    with an SSE error event giving the reason, rather than an answer that merely stops."""

    def __init__(self) -> None:
        self._open: set[aiohttp.ClientResponse] = set()
        self.reason: str | None = None

    async def relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        relayed: Relayed,
        *,
        stall_timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> web.StreamResponse:
        """:func:`relay`, the stream counted as open meanwhile."""
        self._open.add(upstream)
        try:
            return await relay(
                request,
                upstream,
                relayed,
                stall_timeout=stall_timeout,
                headers=headers,
                cut_reason=lambda: self.reason,
            )
        finally:
            self._open.discard(upstream)

    def cut(self, reason: str) -> int:
        """End every stream still open; how many there were."""
        self.reason = reason
        for upstream in list(self._open):
            upstream.close()
        return len(self._open)


class _ClientLost(Exception):
    """The client went away, or took nothing for the stall timeout: ``outcome`` says which."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


async def _to_client(step: Awaitable[object], stall_timeout: float) -> None:
    """Write to the client, who must take the bytes within ``stall_timeout``."""
    try:
        async with asyncio.timeout(stall_timeout):
            await step
    except TimeoutError:
        raise _ClientLost("client_stalled") from None
    except ConnectionError:
        raise _ClientLost("client_disconnect") from None


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    relayed: Relayed,
    *,
    stall_timeout: float,
    headers: Mapping[str, str] | None = None,
    cut_reason: Callable[[], str | None] = lambda: None,
) -> web.StreamResponse:
    """Stream ``upstream``'s event stream to the client as it arrives, each event as soon as it
    is complete, while watching it (in ``relayed``). A client that goes away ends the relay at
    once (the caller then closes the upstream connection, so the engine stops generating); so
    does one that takes nothing for ``stall_timeout`` seconds (its connection is cut, and the
    upstream's closed). An upstream stream that breaks off, or ends without ``data: [DONE]``,
    ends with one SSE ``error`` event for the client, never a silent truncation, unless the
    upstream sent an error event itself."""
    loop = asyncio.get_running_loop()
    response = relayed.response = web.StreamResponse(
        status=upstream.status,
        headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache", **(headers or {})},
    )
    scanner, watch = EventScanner(), relayed.watch
    broke: str | None = None
    try:
        await _to_client(response.prepare(request), stall_timeout)
        try:
            async for chunk in upstream.content.iter_any():
                events, found = scanner.take(chunk)
                if events:
                    await _to_client(response.write(events), stall_timeout)
                for data in found:
                    watch.saw(data, loop.time())
        except (aiohttp.ClientError, TimeoutError, EventTooLong) as exc:
            broke = type(exc).__name__
    except _ClientLost as lost:
        relayed.outcome = relayed.delivered or lost.outcome
        if lost.outcome == "client_stalled":
            _cut_off(request, upstream)
        return response
    failure: str | None = None
    if watch.error is not None:
        relayed.outcome = "error"  # the upstream's own error event ended it: the client has it
    elif watch.done:
        relayed.outcome = "completed"
    elif (reason := cut_reason()) is not None:  # we cut it, the model server did not
        relayed.outcome = "cut"
        failure = f"the stream was cut off after {watch.tokens} tokens: {reason}"
    else:
        relayed.outcome = "upstream_error"
        broke = broke or "the stream ended without data: [DONE]"
        failure = f"the model server's stream broke off after {watch.tokens} tokens ({broke})"
    try:
        if failure is not None:
            await _to_client(response.write(error_event(failure)), stall_timeout)
        await _to_client(response.write_eof(), stall_timeout)
    except _ClientLost as lost:  # the upstream's part is over: its outcome stands
        if lost.outcome == "client_stalled":
            _cut_off(request, upstream)
    return response


def _cut_off(request: web.Request, upstream: aiohttp.ClientResponse) -> None:
    """Drop a client that takes nothing (what it has not taken with it: a close would wait for
    it to read), and the upstream connection, so the engine stops generating."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    upstream.close()

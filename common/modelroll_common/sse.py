"""Server-sent event streams passing through the sidecar and the gateway: :func:`relay` streams
one from an upstream to a client, bytes untouched and unbuffered, while reading the events'
``data`` (whatever pieces the bytes arrive in) for what an OpenAI-style generation stream says
about itself: its first and last tokens, how many, its usage, whether it ended with
``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

MAX_EVENT_BYTES = 1 << 20
"""An event longer than this (no blank line in 1 MiB) is not an SSE stream worth watching."""


class EventTooLong(ValueError):
    pass


class EventScanner:
    """Splits an event stream into its events' ``data`` fields (multi-line data joined by
    newlines), as chunks arrive; lines other than ``data:`` (comments, ``event:``, ``id:``) are
    skipped. CRLF and LF line ends are both accepted."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._pending += chunk.replace(b"\r\n", b"\n")
        *events, self._pending = self._pending.split(b"\n\n")
        if len(self._pending) > MAX_EVENT_BYTES:
            raise EventTooLong(f"an event is longer than {MAX_EVENT_BYTES} bytes")
        found: list[str] = []
        for event in events:
            lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                found.append(b"\n".join(line[5:].removeprefix(b" ") for line in lines).decode())
        return found


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
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.tokens


def _text(choice: dict[str, object]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content"))
    return bool(choice.get("text"))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


RELAY_OUTCOMES = ("completed", "error", "upstream_error", "client_disconnect", "cut")


@dataclass
class Relayed:
    """How a relayed stream ended: ``outcome`` one of RELAY_OUTCOMES, and what it said."""

    response: web.StreamResponse
    watch: GenerationWatch
    outcome: str


def error_event(message: str) -> bytes:
    """An OpenAI-style SSE error event, which OpenAI's clients raise as an APIError."""
    body = {"error": {"message": message, "type": "server_error", "code": 502}}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


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
        headers: Mapping[str, str] | None = None,
    ) -> Relayed:
        """:func:`relay`, the stream counted as open meanwhile."""
        self._open.add(upstream)
        try:
            return await relay(request, upstream, headers, lambda: self.reason)
        finally:
            self._open.discard(upstream)

    def cut(self, reason: str) -> int:
        """End every stream still open; how many there were."""
        self.reason = reason
        for upstream in list(self._open):
            upstream.close()
        return len(self._open)


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    headers: Mapping[str, str] | None = None,
    cut_reason: Callable[[], str | None] = lambda: None,
) -> Relayed:
    """Stream ``upstream``'s event stream to the client as it arrives, nothing buffered, while
    watching it. A client that goes away ends the relay at once (the caller then closes the
    upstream connection, so the engine stops generating); an upstream stream that breaks off,
    or ends without ``data: [DONE]``, ends with an SSE ``error`` event for the client, never a
    silent truncation."""
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(
        status=upstream.status,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **(headers or {}),
        },
    )
    scanner, watch = EventScanner(), GenerationWatch()
    try:
        await response.prepare(request)
    except ConnectionError:
        return Relayed(response, watch, "client_disconnect")
    broke: str | None = None
    try:
        async for chunk in upstream.content.iter_any():
            try:
                await response.write(chunk)
            except ConnectionError:
                return Relayed(response, watch, "client_disconnect")
            for data in scanner.feed(chunk):
                watch.saw(data, loop.time())
    except (aiohttp.ClientError, TimeoutError, EventTooLong) as exc:
        broke = type(exc).__name__
    if not watch.done and watch.error is None:
        broke = broke or "the stream ended without data: [DONE]"
    outcome = "completed" if watch.error is None else "error"
    with contextlib.suppress(ConnectionError):
        if broke is not None:
            outcome = "upstream_error"
            message = f"the model server's stream broke off after {watch.tokens} tokens ({broke})"
            if (reason := cut_reason()) is not None:  # we cut it, the model server did not
                outcome = "cut"
                message = f"the stream was cut off after {watch.tokens} tokens: {reason}"
            await response.write(error_event(message))
        await response.write_eof()
    return Relayed(response, watch, outcome)

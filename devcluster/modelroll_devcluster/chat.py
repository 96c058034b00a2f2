"""Streaming chat completions, as an OpenAI client sends them, with what each stream did: which
version answered, when its first token came, whether it ended with ``data: [DONE]`` or an error
event. The stream is read with the same event parser the sidecar and gateway relay with
(modelroll_common.sse), so a test reads exactly the events they counted.

:func:`stream_chat` sends one; :class:`ChatLoad` keeps ``concurrency`` streams open from a
background thread, for the e2e and node stories.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from modelroll_common.routes import VERSION_HEADER
from modelroll_common.sse import EventScanner, GenerationWatch

from .traffic import BackgroundLoad, percentile

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class ChatStream:
    """One chat completion. Times are ``time.monotonic()`` seconds."""

    sent: float
    ended: float
    status: int
    """HTTP status; 0 when no HTTP answer came (refused, reset, timed out before headers)."""
    version: str
    """The ``X-Modelroll-Version`` it was answered with ('' when none)."""
    first_token: float | None = None
    tokens: int = 0
    """Chunks that carried text."""
    done: bool = False
    """It ended with ``data: [DONE]``."""
    error: str = ""
    """An SSE error event's message, an error answer's body, or the client's exception."""
    retry_after: str = ""

    @property
    def complete(self) -> bool:
        """Answered 200 and streamed to ``data: [DONE]`` with no error event."""
        return self.status == 200 and self.done and not self.error

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_chat(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    *,
    prompt: str = "tell me about the weather",
    max_tokens: int = 32,
    pin: str | None = None,
    on_first_token: Callable[[], object] | None = None,
    stop_after_tokens: int | None = None,
) -> ChatStream:
    """POST a streaming chat completion to ``base_url`` and read it to its end. ``pin`` sends the
    version pin header; ``on_first_token`` is called when the first token arrives (while the
    stream goes on); ``stop_after_tokens`` closes the connection after that many tokens, as a
    client that goes away does."""
    headers = {VERSION_HEADER: pin} if pin else {}
    sent = time.monotonic()
    watch, scanner = GenerationWatch(), EventScanner()
    try:
        async with session.post(
            base_url.rstrip("/") + CHAT_PATH,
            json=chat_body(model, prompt, max_tokens),
            headers=headers,
        ) as resp:
            version = resp.headers.get(VERSION_HEADER, "")
            if resp.content_type != "text/event-stream":
                return ChatStream(
                    sent,
                    time.monotonic(),
                    resp.status,
                    version,
                    error=await resp.text(),
                    retry_after=resp.headers.get("Retry-After", ""),
                )
            async for chunk in resp.content.iter_any():
                for data in scanner.feed(chunk):
                    before = watch.tokens
                    watch.saw(data, time.monotonic())
                    if before == 0 and watch.tokens and on_first_token is not None:
                        on_first_token()
                if stop_after_tokens is not None and watch.tokens >= stop_after_tokens:
                    break
            return ChatStream(
                sent,
                time.monotonic(),
                resp.status,
                version,
                watch.first_token_at,
                watch.tokens,
                watch.done,
                watch.error or "",
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        return ChatStream(
            sent,
            time.monotonic(),
            0,
            "",
            watch.first_token_at,
            watch.tokens,
            error=f"{type(exc).__name__}: {exc}",
        )


def ttft_percentile(streams: list[ChatStream], q: float) -> float:
    """The ``q`` percentile of the streams' times to first token (those that had one), in s."""
    return percentile([s.ttft for s in streams if s.ttft is not None], q)


class ChatLoad(BackgroundLoad[ChatStream]):
    """``concurrency`` chat streams through ``url`` at all times, from a background thread: each
    client sends its next as soon as its last ended. ``with ChatLoad(...) as load:``;
    ``load.records`` grows as streams end (read it with :meth:`since`)."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        concurrency: int = 8,
        max_tokens: int = 24,
        timeout: float = 30.0,
    ) -> None:
        super().__init__(timeout)
        self.url = url
        self.model = model
        self.concurrency = concurrency
        self.max_tokens = max_tokens

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self._client(session, i) for i in range(self.concurrency)))

    async def _client(self, session: aiohttp.ClientSession, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            prompt = " ".join(["word"] * (4 + (i * 7 + n) % 40))
            stream = await stream_chat(
                session, self.url, self.model, prompt=prompt, max_tokens=self.max_tokens
            )
            self.records.append(stream)
            n += 1

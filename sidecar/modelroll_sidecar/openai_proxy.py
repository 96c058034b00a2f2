"""The sidecar in ``--protocol openai`` mode: in front of an OpenAI-compatible engine (vLLM, TGI,
SGLang, llama.cpp's server) that batches generation itself, iteration by iteration.

- ``POST /v1/chat/completions`` and ``/v1/completions`` pass through to the engine, answers
  streamed back as they come (server-sent events, each passed on once complete). At most
  ``--max-in-flight`` at once: more get 429 with Retry-After. Per stream the sidecar records the
  time to the first token, the time per output token after it, and the prompt and output tokens
  (from ``usage`` when the engine sends it, else one per streamed chunk), however the stream
  ends. A stream the engine breaks off (the connection drops, or it ends without
  ``data: [DONE]``) ends with an SSE ``error`` event for the client, never a silent truncation.
  A client that goes away, or takes nothing for ``--upstream-timeout-ms``, closes the engine
  connection, so the engine stops generating for it. A streamed request answered 200 with
  anything but an event stream, and a whole answer over MAX_ANSWER_BYTES, are 502s.
- ``POST /v1/embeddings`` is where request-level batching still pays: the inputs of concurrent
  requests go to the engine in one call (the sidecar's batcher, with its size, max-wait, queue
  and deadline rules) and each request gets exactly its own vectors back.
- Draining on SIGTERM refuses new requests (503) and lets the streams in progress finish.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from aiohttp import web

from modelroll_common.openai_errors import openai_error
from modelroll_common.server import RequestTimedOut, read_body
from modelroll_common.sse import (
    EVENT_STREAM,
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    OpenStreams,
    Relayed,
    read_whole,
    recorded,
    unstreamed,
)
from modelroll_common.tracing import passed_on

from .metrics import LLMMetrics
from .protocol import (
    BatchResult,
    ModelClient,
    ModelFailed,
    decode,
    encode,
)

log = logging.getLogger(__name__)

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
EMBEDDINGS_PATH = "/v1/embeddings"


class OpenAIProxy:
    """Streams generations between clients and the engine, within the in-flight bound."""

    def __init__(
        self,
        upstream: str,
        session: aiohttp.ClientSession,
        metrics: LLMMetrics,
        *,
        max_in_flight: int,
        upstream_timeout_s: float,
        max_body_bytes: int,
    ) -> None:
        self._base = upstream.rstrip("/")
        self._session = session
        self.metrics = metrics
        self.max_in_flight = max_in_flight
        self._read_timeout = upstream_timeout_s
        self._max_body = max_body_bytes
        self.max_answer_bytes = MAX_ANSWER_BYTES
        """The largest whole (not streamed) answer passed on; a larger one is a 502."""
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._streams = OpenStreams()

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests; wait (at most ``timeout_s``) for the streams in progress."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("Cut %d streams still open after %.1fs of draining", self.in_flight,
                        timeout_s)  # fmt: skip
            self._streams.cut("the sidecar is shutting down")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if self.draining:
            return openai_error(503, "the sidecar is shutting down")
        if self.in_flight >= self.max_in_flight:
            self.metrics.rejected_full.inc()
            busy = f"{self.in_flight} requests are in flight, the most this version takes"
            return openai_error(429, busy, {"Retry-After": "1"})
        raw = await self._body(request)
        if isinstance(raw, web.Response):
            return raw
        self.in_flight += 1
        self._idle.clear()
        self.metrics.in_flight.inc()
        try:
            return await self._forward(request, raw)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            if self.in_flight == 0:
                self._idle.set()

    async def _body(self, request: web.Request) -> bytes | web.Response:
        if request.content_length is not None and request.content_length > self._max_body:
            return openai_error(413, f"body is larger than {self._max_body} bytes")
        try:
            raw = await read_body(request)
        except web.HTTPRequestEntityTooLarge:
            return openai_error(413, f"body is larger than {self._max_body} bytes")
        except RequestTimedOut as exc:
            response = openai_error(408, str(exc))
            response.force_close()
            return response
        try:
            body = decode(raw)
        except ValueError as exc:
            return openai_error(400, f"malformed JSON: {exc}")
        if not isinstance(body, dict):
            return openai_error(400, "the body must be a JSON object")
        return raw

    async def _forward(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        started = loop.time()

        def record(outcome: str, relayed: Relayed, abandoned: bool) -> None:
            self.metrics.count(outcome)
            self.metrics.observe(relayed.watch, started)
            if abandoned and (status := relayed.sent_status) is not None:
                self.metrics.count_abandoned(status, loop.time() - started)

        return await recorded(lambda relayed: self._exchange(request, raw, relayed), record)

    async def _exchange(
        self, request: web.Request, raw: bytes, relayed: Relayed
    ) -> web.StreamResponse:
        """The engine's answer to ``raw``, passed on; how it went in ``relayed``."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=self._read_timeout)
        url = self._base + request.path
        headers = {**passed_on(request.headers), "Content-Type": "application/json"}
        try:
            post = self._session.post(url, data=raw, timeout=timeout, headers=headers)
            async with post as upstream:
                kind = upstream.content_type
                if kind == EVENT_STREAM:
                    return await self._stream(request, upstream, relayed)
                if unstreamed(upstream, raw):
                    relayed.outcome = "upstream_error"
                    message = (
                        f"the model answered a streamed request with {kind}, not {EVENT_STREAM}"
                    )
                    return openai_error(502, message)
                body = await read_whole(upstream, self.max_answer_bytes)
                relayed.outcome = "whole"
                return web.Response(status=upstream.status, body=body, content_type=kind)
        except AnswerTooLarge as exc:
            relayed.outcome = "upstream_error"
            message = f"the model's answer is larger than {exc.limit} bytes"
            return openai_error(502, message)
        except aiohttp.ClientConnectorError as exc:
            relayed.outcome = "unreachable"
            message = f"model unreachable at {self._base}: {exc.os_error}"
            return openai_error(503, message)
        except TimeoutError:
            relayed.outcome = "timeout"
            message = f"the model sent nothing for {self._read_timeout:g}s"
            return openai_error(504, message)
        except aiohttp.ClientError as exc:
            relayed.outcome = "upstream_error"
            message = f"the model's answer failed: {type(exc).__name__}"
            return openai_error(502, message)

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, relayed: Relayed
    ) -> web.StreamResponse:
        # A client that takes nothing is given as long as a silent engine.
        response = await self._streams.relay(
            request, upstream, relayed, stall_timeout=self._read_timeout
        )
        if relayed.outcome == "upstream_error":
            log.warning("The model server broke off a stream after %d tokens", relayed.watch.tokens)
        elif relayed.outcome == "client_stalled":
            log.warning("Cut off a client that took nothing for %gs", self._read_timeout)
        return response


class EmbeddingsModel:
    """The batcher's model for ``/v1/embeddings``: each queued request is its list of inputs; a
    batch is one engine call with all of them, and each request gets back its own vectors,
    indexed from 0 as if it had called alone."""

    def __init__(self, client: ModelClient) -> None:
        self._client = client

    async def infer(self, inputs: list[Any]) -> BatchResult:
        model = inputs[0]["model"]
        flat = [text for request in inputs for text in request["input"]]
        raw = await self._client.post(EMBEDDINGS_PATH, encode({"model": model, "input": flat}))
        try:
            body = decode(raw)
            data = sorted(body["data"], key=lambda item: item["index"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelFailed("the engine's embeddings answer is not usable") from exc
        if len(data) != len(flat):
            raise ModelFailed(f"the engine returned {len(data)} embeddings for {len(flat)} inputs")
        outputs: list[Any] = []
        at = 0
        for request in inputs:
            mine = data[at : at + len(request["input"])]
            at += len(request["input"])
            outputs.append(
                {
                    "object": "list",
                    "model": body.get("model", model),
                    "data": [{**item, "index": i} for i, item in enumerate(mine)],
                }
            )
        return BatchResult(outputs, [None] * len(inputs))

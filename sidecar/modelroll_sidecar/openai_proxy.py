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
- Timeouts: a stream's engine may be silent (before its headers, between events) for
  ``--upstream-timeout-ms``; a request not streamed gets its whole answer within
  ``--generation-timeout-ms``, since the engine sends nothing until it has generated all of it.
  Past either, 504. Every 502 and 504 the sidecar gives once the engine has the request carries
  ``x-should-retry: false``, which OpenAI's clients obey: a retry would generate it again.
- ``POST /v1/embeddings`` is where request-level batching still pays: the inputs of concurrent
  requests with the same options (model, dimensions, encoding_format) go to the engine in one
  call with those options (the sidecar's batcher, with its size, max-wait, token budget, queue
  and deadline rules) and each request gets exactly its own vectors back.
- Draining on SIGTERM refuses new requests (503) and lets the streams in progress finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from modelroll_common.errors import openai_error
from modelroll_common.server import RequestTimedOut, read_body
from modelroll_common.sse import (
    EVENT_STREAM,
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    OpenStreams,
    Relayed,
    asks_stream,
    read_whole,
    recorded,
)
from modelroll_common.tracing import passed_on

from .metrics import LLMMetrics
from .protocol import (
    BatchResult,
    ModelClient,
    ModelFailed,
    NotText,
    decode,
    decode_request,
    encode,
)

log = logging.getLogger(__name__)

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
EMBEDDINGS_PATH = "/v1/embeddings"
CONNECT_S = 5.0
MAY_HAVE_GENERATED = "it had the request and may have generated it: a retry generates it again"
RECEIVED = {"x-should-retry": "false"}
"""On an error given once the engine has the request: it may have generated the answer, so
OpenAI's clients, which obey this header, do not send it again (they retry 5xx by default)."""


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
        generation_timeout_s: float,
        max_body_bytes: int,
    ) -> None:
        self._base = upstream.rstrip("/")
        self._session = session
        self.metrics = metrics
        self.max_in_flight = max_in_flight
        self._read_timeout = upstream_timeout_s
        self._generation_timeout = generation_timeout_s
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
            log.warning(
                "Cut %d streams still open after %.1fs of draining", self.in_flight, timeout_s
            )
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
            body = decode_request(raw)
        except NotText as exc:
            return openai_error(400, str(exc))
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
        streamed = asks_stream(raw)
        if streamed:  # the engine's silence is bounded, however long the stream goes on
            timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_S, sock_read=self._read_timeout)
        else:  # nothing comes until the whole answer is generated
            timeout = aiohttp.ClientTimeout(total=self._generation_timeout, sock_connect=CONNECT_S)
        url = self._base + request.path
        headers = {**passed_on(request.headers), "Content-Type": "application/json"}
        try:
            post = self._session.post(url, data=raw, timeout=timeout, headers=headers)
            async with post as upstream:
                kind = upstream.content_type
                if kind == EVENT_STREAM:
                    return await self._stream(request, upstream, relayed)
                if streamed and upstream.status == 200:
                    relayed.outcome = "upstream_error"
                    message = (
                        f"the model answered a streamed request with {kind}, not {EVENT_STREAM}"
                    )
                    return openai_error(502, message, RECEIVED)
                body = await read_whole(upstream, self.max_answer_bytes)
                relayed.outcome = "whole"
                return web.Response(status=upstream.status, body=body, content_type=kind)
        except AnswerTooLarge as exc:
            relayed.outcome = "upstream_error"
            message = f"the model's answer is larger than {exc.limit} bytes"
            return openai_error(502, message, RECEIVED)
        except aiohttp.ClientConnectorError as exc:
            relayed.outcome = "unreachable"
            message = f"model unreachable at {self._base}: {exc.os_error}"
            return openai_error(503, message)
        except aiohttp.ConnectionTimeoutError:
            relayed.outcome = "unreachable"
            message = f"model unreachable at {self._base}: no connection within {CONNECT_S:g}s"
            return openai_error(503, message)
        except TimeoutError:
            relayed.outcome = "timeout"
            if streamed:
                waited = f"sent nothing for {self._read_timeout:g}s (--upstream-timeout-ms)"
            else:
                waited = (
                    f"did not answer within {self._generation_timeout:g}s (--generation-timeout-ms)"
                )
            message = f"the model {waited}; {MAY_HAVE_GENERATED}"
            return openai_error(504, message, RECEIVED)
        except aiohttp.ClientError as exc:
            relayed.outcome = "upstream_error"
            message = f"the model's answer failed: {type(exc).__name__}; {MAY_HAVE_GENERATED}"
            return openai_error(502, message, RECEIVED)

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


EMBEDDING_OPTIONS = ("model", "dimensions", "encoding_format")
"""The fields of an embeddings request passed to the engine besides its input: only requests
that agree on all three share an engine call."""
EMBEDDING_FIELDS = ("input", *EMBEDDING_OPTIONS, "user")
ENCODINGS = ("float", "base64")


class BadEmbeddings(ValueError):
    """An embeddings request the sidecar does not batch (400); the message says why."""


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One client's embeddings request as the batcher queues it: its texts, and the options
    passed with them to the engine (``key``: requests with equal keys may share a call)."""

    texts: list[str]
    key: tuple[tuple[str, Any], ...]

    @property
    def tokens(self) -> int:
        """Its inputs' lengths added up, each counted as the batch path counts a string (its
        whitespace tokens, at least 1): what it adds to a batch's token budget and its usage."""
        return sum(max(1, len(text.split())) for text in self.texts)


def embeddings_request(body: Any) -> Embeddings:
    """The request in ``body``, or BadEmbeddings for what the sidecar cannot pass on faithfully.
    ``user`` (an end-user id for a hosted API's abuse monitoring, which engines ignore) is
    accepted and dropped, so that requests of different users still share engine calls."""
    if not isinstance(body, dict):
        raise BadEmbeddings("the body must be a JSON object")
    unknown = sorted(set(body) - set(EMBEDDING_FIELDS))
    if unknown:
        raise BadEmbeddings(
            f"the sidecar batches embeddings with only {', '.join(EMBEDDING_FIELDS)}; "
            f"it cannot pass on {', '.join(map(repr, unknown))}"
        )
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if isinstance(texts, list) and texts and all(_token_ids(t) for t in texts):
        raise BadEmbeddings('"input" as token ids is not batched by the sidecar; send the text')
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadEmbeddings('"input" must be a string or a non-empty list of strings')
    model, dimensions, encoding = (body.get(name) for name in EMBEDDING_OPTIONS)
    if model is not None and not isinstance(model, str):
        raise BadEmbeddings('"model" must be a string')
    if dimensions is not None and (not _integer(dimensions) or dimensions < 1):
        raise BadEmbeddings(f'"dimensions" must be a positive integer, got {dimensions!r}')
    if encoding is not None and encoding not in ENCODINGS:
        raise BadEmbeddings(f'"encoding_format" must be float or base64, got {encoding!r}')
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise BadEmbeddings('"user" must be a string')
    options = ((name, body[name]) for name in EMBEDDING_OPTIONS if body.get(name) is not None)
    return Embeddings(texts, tuple(options))


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: object) -> bool:
    """An integer, or a list of integers: OpenAI's input as token ids."""
    return _integer(value) or (isinstance(value, list) and all(_integer(v) for v in value))


class EmbeddingsModel:
    """The batcher's model for ``/v1/embeddings``: each queued request is an :class:`Embeddings`;
    a batch (requests of one options key) is one engine call with all their texts and those
    options, and each request gets back its own vectors, indexed from 0 as if it had called
    alone."""

    def __init__(self, client: ModelClient) -> None:
        self._client = client

    async def infer(self, inputs: list[Any]) -> BatchResult:
        requests: list[Embeddings] = inputs
        options: Mapping[str, Any] = dict(requests[0].key)
        if any(request.key != requests[0].key for request in requests):
            raise ModelFailed("a batch mixed embeddings requests with different options")
        flat = [text for request in requests for text in request.texts]
        raw = await self._client.post(EMBEDDINGS_PATH, encode({**options, "input": flat}))
        try:
            body = decode(raw)
            data = sorted(body["data"], key=lambda item: item["index"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelFailed("the engine's embeddings answer is not usable") from exc
        if len(data) != len(flat):
            raise ModelFailed(f"the engine returned {len(data)} embeddings for {len(flat)} inputs")
        outputs: list[Any] = []
        at = 0
        for request in requests:
            mine = data[at : at + len(request.texts)]
            at += len(request.texts)
            outputs.append(
                {
                    "object": "list",
                    "model": body.get("model", options.get("model")),
                    "data": [{**item, "index": i} for i, item in enumerate(mine)],
                }
            )
        return BatchResult(outputs, [None] * len(requests))

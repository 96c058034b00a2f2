"""The sidecar in ``--protocol openai`` mode: in front of an OpenAI-compatible engine (vLLM, TGI,
SGLang, llama.cpp's server) that batches generation itself, iteration by iteration.

- ``POST /v1/chat/completions`` and ``/v1/completions`` pass through to the engine, answers
  streamed back as they come (server-sent events, nothing buffered). At most ``--max-in-flight``
  at once: more get 429 with Retry-After. Per stream the sidecar records the time to the first
  token, the time per output token after it, and the prompt and output tokens (from ``usage``
  when the engine sends it, else one per streamed chunk). A stream the engine breaks off (the
  connection drops, or it ends without ``data: [DONE]``) ends with an SSE ``error`` event for
  the client, never a silent truncation. A client that goes away closes the engine connection,
  so the engine stops generating for it.
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

from modelroll_common.server import RequestTimedOut, read_body
from modelroll_common.sse import OpenStreams

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


def openai_error(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> web.Response:
    """An error in OpenAI's shape, which its clients parse: {"error": {message, type, code}}."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(
        status=status, body=encode(body), content_type="application/json", headers=headers
    )


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
            return openai_error(503, "the sidecar is shutting down", "server_error")
        if self.in_flight >= self.max_in_flight:
            self.metrics.rejected_full.inc()
            return openai_error(
                429, f"{self.in_flight} requests are in flight, the most this version takes",
                "rate_limit_error", {"Retry-After": "1"},
            )  # fmt: skip
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
            return openai_error(413, f"body is larger than {self._max_body} bytes",
                                "invalid_request_error")  # fmt: skip
        try:
            raw = await read_body(request)
        except web.HTTPRequestEntityTooLarge:
            return openai_error(413, f"body is larger than {self._max_body} bytes",
                                "invalid_request_error")  # fmt: skip
        except RequestTimedOut as exc:
            response = openai_error(408, str(exc), "invalid_request_error")
            response.force_close()
            return response
        try:
            body = decode(raw)
        except ValueError as exc:
            return openai_error(400, f"malformed JSON: {exc}", "invalid_request_error")
        if not isinstance(body, dict):
            return openai_error(400, "the body must be a JSON object", "invalid_request_error")
        return raw

    async def _forward(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=self._read_timeout)
        try:
            async with self._session.post(
                self._base + request.path, data=raw, timeout=timeout,
                headers={"Content-Type": "application/json"},
            ) as upstream:  # fmt: skip
                if upstream.content_type != "text/event-stream":
                    body = await upstream.read()
                    self.metrics.count(upstream.status, "whole")
                    return web.Response(status=upstream.status, body=body,
                                        content_type=upstream.content_type)  # fmt: skip
                return await self._stream(request, upstream, started)
        except aiohttp.ClientConnectorError as exc:
            self.metrics.count(503, "unreachable")
            return openai_error(503, f"model unreachable at {self._base}: {exc.os_error}",
                                "server_error")  # fmt: skip
        except TimeoutError:
            self.metrics.count(504, "timeout")
            return openai_error(504, f"the model sent nothing for {self._read_timeout:g}s",
                                "server_error")  # fmt: skip
        except aiohttp.ClientError as exc:
            self.metrics.count(502, "upstream_error")
            return openai_error(502, f"the model's answer failed: {type(exc).__name__}",
                                "server_error")  # fmt: skip

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, started: float
    ) -> web.StreamResponse:
        relayed = await self._streams.relay(request, upstream)
        if relayed.outcome == "upstream_error":
            log.warning("The model server broke off a stream after %d tokens",
                        relayed.watch.tokens)  # fmt: skip
        self.metrics.count(upstream.status, relayed.outcome)
        self.metrics.observe(relayed.watch, started)
        return relayed.response


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

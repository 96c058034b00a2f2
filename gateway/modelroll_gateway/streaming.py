"""The gateway's OpenAI paths (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``): forwarded to the picked version's sidecar through aiohttp's client, whose
answers can be streamed. The batch path keeps its own pooled client (upstream.py), which reads
whole answers; a generation streams for seconds, so what matters here is passing each event on
the moment it arrives.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from modelroll_common.sse import OpenStreams

from .metrics import GatewayMetrics
from .table import Target

log = logging.getLogger(__name__)

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
CONNECT_S = 5.0


def _openai_error(status: int, message: str, headers: dict[str, str]) -> web.Response:
    body = {"error": {"message": message, "type": "server_error", "code": status}}
    return web.json_response(body, status=status, headers=headers)


def _whole_headers(upstream: aiohttp.ClientResponse, ours: dict[str, str]) -> dict[str, str]:
    """A whole (not streamed) answer's headers: ours, its Content-Type, and a Retry-After (a
    version whose in-flight bound is full says when to come back)."""
    headers = {**ours, "Content-Type": upstream.headers.get("Content-Type", "application/json")}
    if "Retry-After" in upstream.headers:
        headers["Retry-After"] = upstream.headers["Retry-After"]
    return headers


class StreamingForwarder:
    """Forwards one OpenAI request to a version and streams its answer back."""

    def __init__(self, metrics: GatewayMetrics, read_timeout_s: float, version_header: str):
        self._metrics = metrics
        self._read_timeout = read_timeout_s
        self._header = version_header
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        self.streams = OpenStreams()
        """Cut at the end of the gateway's drain (cli.serve)."""

    async def close(self) -> None:
        await self._session.close()

    async def forward(
        self, request: web.Request, target: Target, body: bytes
    ) -> web.StreamResponse:
        started = asyncio.get_running_loop().time()
        version = target.name
        labels = (target.stats.model, version)
        headers = {self._header: version}
        # sock_read: the longest silence allowed while the version is generating, not a cap on
        # the whole answer (a long generation streams for longer than any request timeout).
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_S, sock_read=self._read_timeout
        )
        url = target.route.endpoint.rstrip("/") + request.path
        try:
            async with self._session.post(
                url, data=body, timeout=timeout, headers={"Content-Type": "application/json"}
            ) as upstream:
                if upstream.content_type != "text/event-stream":
                    answer = await upstream.read()
                    self._count(labels, "whole")
                    return web.Response(
                        status=upstream.status,
                        body=answer,
                        headers=_whole_headers(upstream, headers),
                    )
                relayed = await self.streams.relay(request, upstream, headers)
        except aiohttp.ClientConnectorError:
            self._count(labels, "unreachable")
            return _openai_error(502, f"version {version!r} could not be reached", headers)
        except TimeoutError:
            self._count(labels, "timeout")
            return _openai_error(
                504, f"version {version!r} sent nothing for {self._read_timeout:g}s", headers
            )
        except aiohttp.ClientError as exc:
            self._count(labels, "upstream_error")
            return _openai_error(502, f"version {version!r} failed: {type(exc).__name__}", headers)
        watch = relayed.watch
        if watch.first_token_at is not None:
            self._metrics.llm_ttft.labels(*labels).observe(watch.first_token_at - started)
        self._count(labels, relayed.outcome)
        return relayed.response

    def _count(self, labels: tuple[str, str], outcome: str) -> None:
        self._metrics.llm_requests.labels(*labels, outcome).inc()

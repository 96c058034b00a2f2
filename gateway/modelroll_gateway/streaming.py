"""The gateway's OpenAI paths (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``): forwarded to the picked version's sidecar through aiohttp's client, whose
answers can be streamed. The batch path keeps its own pooled client (upstream.py), which reads
whole answers; a generation streams for seconds, so what matters here is passing each event on
the moment it arrives (modelroll_common.sse, as the sidecar does), and counting every stream
however it ends, its client's going away included. A stream's version may be silent for
``--upstream-timeout``; an answer not streamed comes whole within ``--generation-timeout``.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from modelroll_common import sse
from modelroll_common.calls import CALL_SIZE_HEADER
from modelroll_common.errors import openai_error
from modelroll_common.tracing import passed_on

from .metrics import GatewayMetrics
from .table import Target

log = logging.getLogger(__name__)

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
CONNECT_S = 5.0
SHOULD_RETRY = "x-should-retry"
RECEIVED = "it had the request and may have run it: a retry runs it again"
"""What an error given once the version has the request says; it carries
``x-should-retry: false``, which OpenAI's clients obey (they retry 5xx by default)."""


def _whole_headers(upstream: aiohttp.ClientResponse, ours: dict[str, str]) -> dict[str, str]:
    """A whole (not streamed) answer's headers: ours, its Content-Type, a Retry-After (a
    version whose in-flight bound is full says when to come back), and an x-should-retry (a
    sidecar says whether the engine may have generated the answer already) and the size of
    the model call that answered it."""
    headers = {**ours, "Content-Type": upstream.headers.get("Content-Type", "application/json")}
    for name in ("Retry-After", SHOULD_RETRY, CALL_SIZE_HEADER):
        if name in upstream.headers:
            headers[name] = upstream.headers[name]
    return headers


class StreamingForwarder:
    """Forwards one OpenAI request to a version and streams its answer back."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        read_timeout_s: float,
        version_header: str,
        generation_timeout_s: float,
    ):
        self._metrics = metrics
        self._read_timeout = read_timeout_s
        self.generation_timeout_s = generation_timeout_s
        """How long an answer not streamed may take, whole (--generation-timeout)."""
        self._header = version_header
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        self.streams = sse.OpenStreams()
        """Cut at the end of the gateway's drain (cli.serve)."""
        self.max_answer_bytes = sse.MAX_ANSWER_BYTES
        """The largest whole (not streamed) answer passed on, as on the batch path; a larger
        one is a 502."""

    async def close(self) -> None:
        await self._session.close()

    async def forward(
        self, request: web.Request, target: Target, body: bytes
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        started = loop.time()
        labels = (target.stats.model, target.name)

        def record(outcome: str, relayed: sse.Relayed, abandoned: bool) -> None:
            watch, stats = relayed.watch, target.stats
            if watch.first_token_at is not None:
                stats.time_to_first_token.observe(watch.first_token_at - started)
            if (tpot := watch.time_per_output_token) is not None:
                stats.time_per_output_token.observe(tpot)
            self._metrics.llm_requests.labels(*labels, outcome).inc()
            if abandoned and (status := relayed.sent_status) is not None:
                # Proxy.openai counts every other answer; a cancelled forward never returns.
                target.stats.record(status, loop.time() - started)

        return await sse.recorded(
            lambda relayed: self._exchange(request, target, body, relayed), record
        )

    async def _exchange(
        self, request: web.Request, target: Target, body: bytes, relayed: sse.Relayed
    ) -> web.StreamResponse:
        """The version's answer to ``body``, passed on; how it went in ``relayed``."""
        version = target.name
        headers = {self._header: version}
        received = {**headers, SHOULD_RETRY: "false"}
        streamed = sse.asks_stream(body)
        if streamed:
            # sock_read: the longest silence allowed while the version is generating, not a cap
            # on the whole answer (a long generation streams for longer than any timeout).
            timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_S, sock_read=self._read_timeout)
        else:  # nothing comes until the whole answer is generated
            timeout = aiohttp.ClientTimeout(total=self.generation_timeout_s, sock_connect=CONNECT_S)
        url = target.route.endpoint.rstrip("/") + request.path
        try:
            passed = {**passed_on(request.headers), "Content-Type": "application/json"}
            async with self._session.post(
                url, data=body, timeout=timeout, headers=passed
            ) as upstream:
                if upstream.content_type == sse.EVENT_STREAM:
                    # A client that takes nothing is given as long as a silent version.
                    return await self.streams.relay(
                        request,
                        upstream,
                        relayed,
                        stall_timeout=self._read_timeout,
                        headers=headers,
                    )
                if streamed and upstream.status == 200:
                    relayed.outcome = "upstream_error"
                    kind = upstream.content_type
                    return openai_error(
                        502,
                        f"version {version!r} answered a streamed request with {kind}, "
                        f"not {sse.EVENT_STREAM}",
                        received,
                    )
                answer = await sse.read_whole(upstream, self.max_answer_bytes)
                relayed.outcome = "whole"
                return web.Response(
                    status=upstream.status, body=answer, headers=_whole_headers(upstream, headers)
                )
        except sse.AnswerTooLarge as exc:
            relayed.outcome = "upstream_error"
            return openai_error(
                502, f"version {version!r} answered more than {exc.limit} bytes", received
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            relayed.outcome = "unreachable"
            return openai_error(502, f"version {version!r} could not be reached", headers)
        except TimeoutError:
            relayed.outcome = "timeout"
            if streamed:
                waited = f"sent nothing for {self._read_timeout:g}s (--upstream-timeout)"
            else:
                waited = (
                    f"did not answer within {self.generation_timeout_s:g}s (--generation-timeout)"
                )
            return openai_error(504, f"version {version!r} {waited}; {RECEIVED}", received)
        except aiohttp.ClientError as exc:
            relayed.outcome = "upstream_error"
            message = f"version {version!r} failed: {type(exc).__name__}; {RECEIVED}"
            return openai_error(502, message, received)

"""The sidecar's aiohttp apps: the inference app, built by :func:`create_app`, and the control
app of the same sidecar (GET /prestop), built by :func:`create_control_app`.

The batcher, the model client and the readiness probe start and stop in the inference app's
cleanup_ctx, so every test that serves the app (aiohttp's TestServer, AppRunner) runs them for
real, and an app whose lifespan never started answers 503 at once instead of hanging. The control
app is served apart, on 127.0.0.1 only: whoever reaches the inference port cannot stop the pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import metadata
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from modelroll_common.calls import CALL_SIZE_HEADER, call_share
from modelroll_common.errors import json_errors, openai_error
from modelroll_common.open_inference import BINARY_DATA_HEADER, BINARY_DATA_REFUSED
from modelroll_common.routes import VERSION_HEADER
from modelroll_common.server import RequestTimedOut, read_body

from .batching import (
    Batcher,
    BatcherNotRunning,
    BatchModel,
    Outcome,
    Pending,
    QueueFull,
    ShuttingDown,
)
from .config import SidecarConfig
from .lengths import Lengths, NoTokenizer, TokenizerPool, WordLengths, fetch_tokenizer
from .metrics import LLMMetrics, SidecarMetrics
from .open_inference import OpenInferenceModel
from .openai_proxy import (
    GENERATION_PATHS,
    BadEmbeddings,
    EmbeddingsModel,
    OpenAIProxy,
    embeddings_request,
)
from .protocol import ModelClient, NotText, decode_request, encode
from .tensors import BadTensor, infer_request

log = logging.getLogger(__name__)

VERSION = metadata.version("modelroll-sidecar")
RETRY_AFTER_S = "1"
STARTUP_PROBE_S = 0.1


class Sidecar:
    """One model version's sidecar: the batcher in front of a model client, plus its state."""

    def __init__(self, config: SidecarConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.metrics = SidecarMetrics(config.model, config.version, registry)
        self.openai = config.protocol == "openai"
        self.model = ModelClient(
            config.upstream,
            config.upstream_timeout_ms / 1000,
            config.max_concurrent_batches + (config.max_in_flight if self.openai else 0),
            ready_path="/health" if self.openai else "/readyz",
            api_key=config.engine_api_key(),
            reuse_connections=not self.openai,
        )
        self.oip: OpenInferenceModel | None = None
        """--protocol openinference: the model server's adapter and readiness probe."""
        batch_model: BatchModel = self.model
        if self.openai:
            batch_model = EmbeddingsModel(self.model)
        elif config.protocol == "openinference":
            self.oip = batch_model = OpenInferenceModel(
                self.model, config.served_name, config.model, config.version
            )
        self.proxy: OpenAIProxy | None = None
        self.batcher = Batcher(
            batch_model,
            self.metrics,
            max_batch_size=config.max_batch_size,
            max_wait_s=config.max_wait_s,
            max_queue_size=config.max_queue_size,
            max_batch_tokens=config.max_batch_tokens,
            timeout_s=config.timeout_s,
            max_concurrent_batches=config.max_concurrent_batches,
            batch_by=config.batch_by,
            wait_policy=config.wait_policy,
        )
        self.model_ready = False
        self.lengths: Lengths | None = None
        """How long a request is; None until the sidecar knows what to count (with
        --length-from tokenizer and auto: until the model has answered for its tokenizer)."""
        self.length_unit = ""
        """What ``lengths`` counts: words or tokens (metrics.LENGTH_UNITS); empty while None."""
        self.lengths_problem = "not asked for yet"
        """Why there is no tokenizer yet (for /readyz)."""
        if not config.asks_for_tokenizer:
            self._count_in(WordLengths(), "words")
        self.closing = False
        """Set by the control app's GET /prestop: still serving, but unready and closing every
        connection."""
        self.close_idle_connections: Callable[[], int] = lambda: 0
        """Closes the server's idle keep-alive connections (set by whoever runs the server)."""
        self.draining = False
        self._probe: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[list[None]] | None = None

    async def start(self) -> None:
        await self.model.start()
        if self.openai:
            config = self.config
            self.proxy = OpenAIProxy(
                config.upstream,
                self.model.session,
                LLMMetrics(self.metrics, config.model, config.version),
                max_in_flight=config.max_in_flight,
                upstream_timeout_s=config.upstream_timeout_ms / 1000,
                generation_timeout_s=config.generation_timeout_ms / 1000,
                max_body_bytes=config.max_body_bytes,
            )
        self.batcher.start()
        self._probe = asyncio.create_task(self._probe_model(), name="modelroll-readiness")

    async def _probe_model(self) -> None:
        """Probe the model's readiness path every --readiness-interval-ms (every 0.1 s while
        unready), each probe waiting --readiness-timeout-ms for its answer."""
        interval = self.config.readiness_interval_ms / 1000
        timeout = self.config.readiness_timeout_ms / 1000
        problem = ""
        while True:
            if self.oip is None:
                ready = await self.model.ready(timeout)
            else:
                ready = await self.oip.ready(timeout)
                if self.oip.problem != problem:  # each new reason, once
                    problem = self.oip.problem
                    if problem:
                        log.warning("Model at %s is not ready: %s", self.config.upstream, problem)
            if ready and self.lengths is None:
                await self._load_tokenizer()
            if ready != self.model_ready:
                log.info("Model at %s became %s", self.config.upstream, _readiness(ready))
                self.model_ready = ready
            await asyncio.sleep(interval if ready else min(interval, STARTUP_PROBE_S))

    async def _load_tokenizer(self) -> None:
        """--length-from tokenizer and auto: ask the model for its tokenizer, and count tokens
        once it serves one; under auto, count words once it answers that it serves none. Until
        then the sidecar is unready and asks again at each probe (a model may be starting), and
        each new reason it gives is logged once."""
        try:
            tokens = await fetch_tokenizer(self.model, self.config.upstream_timeout_ms / 1000)
        except NoTokenizer as exc:
            if self.config.length_from == "auto":
                log.info(
                    "Counting lengths in whitespace words: the model serves no tokenizer (%s)", exc
                )
                self._count_in(WordLengths(), "words")
            else:
                self._not_yet(
                    f"{exc}; --length-from tokenizer needs a model that serves its "
                    "tokenizer.json there"
                )
            return
        except ValueError as exc:  # no answer to judge: the next probe asks again
            self._not_yet(str(exc))
            return
        self._count_in(TokenizerPool(tokens, self.metrics, self.config.max_queue_size), "tokens")
        log.info("Counting lengths in the tokens of the model's tokenizer")

    def _not_yet(self, problem: str) -> None:
        if problem != self.lengths_problem:
            log.warning("No tokenizer from the model at %s: %s", self.config.upstream, problem)
            self.lengths_problem = problem

    def _count_in(self, lengths: Lengths, unit: str) -> None:
        self.lengths, self.length_unit = lengths, unit
        self.metrics.count_lengths_in(unit)

    async def prestop(self) -> None:
        """The pod is terminating: while Kubernetes takes the pod out of its Services' endpoints,
        keep serving, but turn unready and close every connection after its next answer, so that
        clients reconnect, and reach other pods, before SIGTERM drains.

        Idle keep-alive connections are closed only at the end of the delay: a client may be
        writing a request on one at the very moment it is closed, and then cannot know whether
        it was processed (the gateway answers that 502 and never resends). A client that used
        the connection during the delay had "Connection: close" with its answer; the gateway
        never reuses a connection idle for longer than the delay (UpstreamPool.idle_timeout),
        so what is closed at the end is what nobody will write to."""
        if not self.closing:
            self.closing = True
            log.info(
                "Closing %s/%s: unready, connections closed after their next answer, serving "
                "for %g ms more",
                self.config.model,
                self.config.version,
                self.config.prestop_delay_ms,
            )
            await asyncio.sleep(self.config.prestop_delay_ms / 1000)
            closed = self.close_idle_connections()
            log.info(
                "Closed %d idle connections of %s/%s",
                closed,
                self.config.model,
                self.config.version,
            )
        else:
            await asyncio.sleep(self.config.prestop_delay_ms / 1000)

    async def shutdown(self) -> None:
        """Turn unready, refuse new requests, flush the queue, finish in-flight batches.
        Safe to call more than once; later calls wait for the first."""
        if self._drained is None:
            self.draining = True
            log.info(
                "Draining %s/%s: %d queued", self.config.model, self.config.version, self.depth
            )
            timeout = self.config.drain_timeout_s
            drains = [self.batcher.drain(timeout)]
            if self.proxy is not None:
                drains.append(self.proxy.drain(timeout))  # streams in progress finish
            self._drained = asyncio.ensure_future(asyncio.gather(*drains))
        await asyncio.shield(self._drained)

    async def close(self) -> None:
        await self.shutdown()
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self.lengths is not None:
            self.lengths.close()
        await self.model.close()

    @property
    def depth(self) -> int:
        return self.batcher.depth


def _readiness(ready: bool) -> str:
    return "ready" if ready else "unready"


SIDECAR = web.AppKey("sidecar", Sidecar)


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=encode(body),
        content_type="application/json",
        headers=headers,
    )


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return json_response(status, {"error": message}, headers)


def is_json(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


async def read_payload(request: web.Request, max_bytes: int) -> Any | web.Response:
    """The request's ``payload``, or the 400/408/413/415 response explaining why there is none."""
    if request.content_length is not None and request.content_length > max_bytes:
        return error_response(413, f"request body is larger than {max_bytes} bytes")
    if not is_json(request.content_type):
        return error_response(415, "Content-Type must be application/json")
    body = await read_json(request, max_bytes)
    if isinstance(body, web.Response):
        return body
    if not isinstance(body, dict) or "payload" not in body:
        return error_response(400, 'body must be a JSON object with a "payload" field')
    return body["payload"]


async def read_json(request: web.Request, max_bytes: int) -> Any | web.Response:
    """The request's body, decoded, or the 400/408/413 response explaining why there is none."""
    if request.content_length is not None and request.content_length > max_bytes:
        return error_response(413, f"request body is larger than {max_bytes} bytes")
    try:
        raw = await read_body(request)
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"request body is larger than {max_bytes} bytes")
    except RequestTimedOut as exc:
        response = error_response(408, str(exc))
        response.force_close()  # the rest of the body may still come: no next request follows
        return response
    try:
        return decode_request(raw)
    except NotText as exc:
        return error_response(400, str(exc))
    except ValueError as exc:  # JSON and UTF-8 errors; messages give a position, never the payload
        return error_response(400, f"malformed JSON: {exc}")


def _count(sidecar: Sidecar, response: web.StreamResponse, seconds: float) -> None:
    """Count an answer, and the share of a model call it stands for (its call size header)."""
    share = call_share(response.headers.get(CALL_SIZE_HEADER))
    sidecar.metrics.count_request(response.status, seconds, share)


Answer = Callable[[web.Request, Sidecar], Awaitable[web.Response]]


def counted(answer: Answer) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler that answers with ``answer`` and counts the answer and its time."""

    async def handler(request: web.Request) -> web.Response:
        sidecar = request.app[SIDECAR]
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await answer(request, sidecar)
        _count(sidecar, response, loop.time() - started)
        return response

    return handler


async def _infer(request: web.Request, sidecar: Sidecar) -> web.Response:
    if sidecar.draining:
        sidecar.metrics.rejected["shutting_down"].inc()
        return error_response(503, "the sidecar is shutting down")
    payload = await read_payload(request, sidecar.config.max_body_bytes)
    if isinstance(payload, web.Response):
        return payload
    lengths = sidecar.lengths
    if lengths is None:
        return error_response(503, "the model's tokenizer is not loaded yet")
    with sidecar.metrics.in_flight.track_inprogress():
        return await _answer(sidecar, lengths, payload)


ErrorResponse = Callable[..., web.Response]
"""Makes an error answer from its status, message and headers: error_response, openai_error."""


async def _outcome(
    sidecar: Sidecar, submit: Callable[[], Awaitable[Pending]], error: ErrorResponse
) -> Outcome | web.Response:
    """How the request that ``submit`` queues ends, or the 429 or 503 that kept it out."""
    try:
        pending = await submit()
    except QueueFull as exc:
        return error(429, str(exc), {"Retry-After": RETRY_AFTER_S})
    except (ShuttingDown, BatcherNotRunning) as exc:
        return error(503, str(exc))
    try:
        return await pending.future
    except asyncio.CancelledError:
        sidecar.batcher.abandon(pending)
        raise


def _respond(sidecar: Sidecar, outcome: Outcome, body: Callable[[Any], Any]) -> web.Response:
    """The answer for ``outcome``: ``body`` of the model's output, or the error."""
    headers = {CALL_SIZE_HEADER: str(outcome.call_size)}
    if outcome.status == 200:
        response = json_response(200, body(outcome.output), headers)
    else:
        response = error_response(outcome.status, outcome.error or "request failed", headers)
    if sidecar.closing:
        response.force_close()  # "Connection: close": the client's next request goes elsewhere
    return response


async def _answer(sidecar: Sidecar, lengths: Lengths, payload: Any) -> web.Response:
    """The answer to an accepted request: its length counted, queued, batched, run."""

    async def submit() -> Pending:
        return sidecar.batcher.submit(payload, length=await lengths(payload))

    outcome = await _outcome(sidecar, submit, error_response)
    if isinstance(outcome, web.Response):
        return outcome
    config = sidecar.config
    return _respond(
        sidecar,
        outcome,
        lambda output: {"output": output, "model": config.model, "version": config.version},
    )


async def handle_generate(request: web.Request) -> web.StreamResponse:
    """--protocol openai: a chat or text completion, streamed through to the engine."""
    sidecar = request.app[SIDECAR]
    loop = asyncio.get_running_loop()
    started = loop.time()
    if sidecar.proxy is None:
        return openai_error(503, "the sidecar is not running")
    response = await sidecar.proxy.generate(request)
    _count(sidecar, response, loop.time() - started)
    if sidecar.closing:
        response.force_close()
    return response


async def _embeddings(request: web.Request, sidecar: Sidecar) -> web.Response:
    """--protocol openai: embeddings, batched with concurrent requests into one engine call."""
    if sidecar.draining:
        return openai_error(503, "the sidecar is shutting down")
    try:
        raw = await read_body(request)
        body = decode_request(raw)
    except web.HTTPRequestEntityTooLarge:
        return openai_error(413, f"body is larger than {sidecar.config.max_body_bytes} bytes")
    except RequestTimedOut as exc:
        return openai_error(408, str(exc))
    except NotText as exc:
        return openai_error(400, str(exc))
    except ValueError as exc:
        return openai_error(400, f"malformed JSON: {exc}")
    try:
        embeddings = embeddings_request(body)
    except BadEmbeddings as exc:
        return openai_error(400, str(exc))

    async def submit() -> Pending:
        # a batch is one engine call with one set of options, within the token budget
        return sidecar.batcher.submit(embeddings, length=embeddings.tokens, key=embeddings.key)

    outcome = await _outcome(sidecar, submit, openai_error)
    if isinstance(outcome, web.Response):
        return outcome
    headers = {CALL_SIZE_HEADER: str(outcome.call_size)}
    if outcome.status != 200:
        return openai_error(outcome.status, outcome.error or "request failed", headers)
    tokens = embeddings.tokens
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}  # words: the engine's are per batch
    return json_response(200, {**outcome.output, "usage": usage}, headers)


async def handle_models(request: web.Request) -> web.Response:
    """--protocol openai: the engine's GET /v1/models, passed on."""
    sidecar = request.app[SIDECAR]
    try:
        async with sidecar.model.session.get(
            sidecar.config.upstream.rstrip("/") + "/v1/models"
        ) as up:
            return web.Response(
                status=up.status, body=await up.read(), content_type=up.content_type
            )
    except aiohttp.ClientError as exc:
        return openai_error(502, f"the engine's model list failed: {type(exc).__name__}")


handle_infer = counted(_infer)
handle_embeddings = counted(_embeddings)


async def handle_metrics(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR]
    body = generate_latest(sidecar.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_livez(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR]
    if not sidecar.batcher.alive:
        return error_response(503, "the batcher is not running")
    return json_response(200, {"status": "alive"})


def unready(sidecar: Sidecar) -> str | None:
    """Why the sidecar is not ready, or None when it is."""
    if sidecar.draining:
        return "shutting down"
    if sidecar.closing:
        return "the pod is terminating"
    if not sidecar.batcher.alive:
        return "the batcher is not running"
    if not sidecar.model_ready:
        why = f": {sidecar.oip.problem}" if sidecar.oip is not None else ""
        return f"model at {sidecar.config.upstream} is not ready{why}"
    if sidecar.lengths is None:
        return f"no tokenizer from the model: {sidecar.lengths_problem}"
    return None


async def handle_readyz(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR]
    problem = unready(sidecar)
    if problem is not None:
        return error_response(503, problem)
    return json_response(200, {"status": "ready", "length_unit": sidecar.length_unit})


# -- --protocol openinference: the Open Inference Protocol's paths ------------------------------

V2_MODEL = "/v2/models/{model}"
V2_VERSION = V2_MODEL + "/versions/{version}"


def _not_this_model(request: web.Request, config: SidecarConfig) -> web.Response | None:
    """404 for a path naming a model (or a version) this sidecar does not serve."""
    model = request.match_info["model"]
    if model != config.model:
        return error_response(404, f"unknown model {model[:64]!r}: this is {config.model!r}")
    version = request.match_info.get("version")
    if version is not None and version != config.version:
        return error_response(
            404, f"unknown version {version[:64]!r} of {config.model!r}: this is {config.version!r}"
        )
    return None


async def _v2_infer(request: web.Request, sidecar: Sidecar) -> web.Response:
    """POST /v2/models/{model}/infer (and .../versions/{version}/infer): batched by rows with
    concurrent requests of the same key into the model server's infer calls."""
    wrong = _not_this_model(request, sidecar.config)
    if wrong is not None:
        return wrong
    if sidecar.draining:
        sidecar.metrics.rejected["shutting_down"].inc()
        return error_response(503, "the sidecar is shutting down")
    if BINARY_DATA_HEADER in request.headers:
        return error_response(400, BINARY_DATA_REFUSED)
    body = await read_json(request, sidecar.config.max_body_bytes)
    if isinstance(body, web.Response):
        return body
    try:
        infer = infer_request(body)
    except BadTensor as exc:
        return error_response(400, str(exc))
    lengths = sidecar.lengths
    if lengths is None:
        return error_response(503, "the model's tokenizer is not loaded yet")

    async def submit() -> Pending:
        text = infer.longest_text()
        length = 1 if text is None else await lengths(text)
        return sidecar.batcher.submit(infer, length=length, key=infer.key, rows=infer.rows)

    with sidecar.metrics.in_flight.track_inprogress():
        outcome = await _outcome(sidecar, submit, error_response)
    if isinstance(outcome, web.Response):
        return outcome
    return _respond(sidecar, outcome, lambda output: output)


async def handle_v2_metadata(request: web.Request) -> web.Response:
    """GET /v2/models/{model}: the model server's metadata, under this version's names."""
    sidecar = request.app[SIDECAR]
    wrong = _not_this_model(request, sidecar.config)
    if wrong is not None:
        return wrong
    assert sidecar.oip is not None  # the route exists only then
    metadata = sidecar.oip.client_metadata()
    if metadata is None:
        return error_response(503, f"the model's metadata is not read yet: {sidecar.oip.problem}")
    return json_response(200, metadata)


async def handle_v2_model_ready(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR]
    wrong = _not_this_model(request, sidecar.config)
    if wrong is not None:
        return wrong
    problem = unready(sidecar)
    if problem is not None:
        return error_response(503, problem)
    return json_response(200, {"name": sidecar.config.model, "ready": True})


async def handle_v2_ready(request: web.Request) -> web.Response:
    problem = unready(request.app[SIDECAR])
    if problem is not None:
        return error_response(503, problem)
    return json_response(200, {"ready": True})


async def handle_v2_live(request: web.Request) -> web.Response:
    if not request.app[SIDECAR].batcher.alive:
        return error_response(503, "the batcher is not running")
    return json_response(200, {"live": True})


async def handle_v2_server(request: web.Request) -> web.Response:
    return json_response(200, {"name": "modelroll-sidecar", "version": VERSION, "extensions": []})


handle_v2_infer = counted(_v2_infer)


def _add_v2_routes(app: web.Application) -> None:
    for path in (V2_MODEL, V2_VERSION):
        app.router.add_post(path + "/infer", handle_v2_infer)
        app.router.add_get(path, handle_v2_metadata)
        app.router.add_get(path + "/ready", handle_v2_model_ready)
    app.router.add_get("/v2/health/ready", handle_v2_ready)
    app.router.add_get("/v2/health/live", handle_v2_live)
    app.router.add_get("/v2", handle_v2_server)


async def handle_prestop(request: web.Request) -> web.Response:
    """The pod's preStop hook: the kubelet runs ``python3 -m modelroll_sidecar.prestop`` in the
    sidecar container before SIGTERM, which sends this GET to the control listener."""
    sidecar = request.app[SIDECAR]
    await sidecar.prestop()
    response = json_response(200, {"status": "closing", "queued": sidecar.depth})
    response.force_close()
    return response


def create_app(config: SidecarConfig, registry: CollectorRegistry | None = None) -> web.Application:
    """A new sidecar app. Each call builds a fresh batcher and metrics: apps are never shared."""
    app = web.Application(
        client_max_size=config.max_body_bytes, middlewares=[json_errors("sidecar")]
    )
    sidecar = Sidecar(config, registry if registry is not None else CollectorRegistry())
    app[SIDECAR] = sidecar

    async def lifespan(_: web.Application) -> AsyncIterator[None]:
        await sidecar.start()
        yield
        await sidecar.close()

    async def drain(_: web.Application) -> None:
        # on_shutdown runs before aiohttp waits for open handlers, so they get their answers.
        await sidecar.shutdown()

    async def stamp(_: web.Request, response: web.StreamResponse) -> None:
        # Every answer names the version that gave it, as the gateway's do: behind a data plane
        # that is not modelroll's gateway (a Gateway API HTTPRoute), the client still knows.
        response.headers[VERSION_HEADER] = config.version

    app.cleanup_ctx.append(lifespan)
    app.on_shutdown.append(drain)
    app.on_response_prepare.append(stamp)
    if sidecar.openai:
        for path in GENERATION_PATHS:
            app.router.add_post(path, handle_generate)
        app.router.add_post("/v1/embeddings", handle_embeddings)
        app.router.add_get("/v1/models", handle_models)
    elif sidecar.oip is not None:
        _add_v2_routes(app)
    else:
        app.router.add_post("/v1/infer", handle_infer)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/livez", handle_livez)
    app.router.add_get("/readyz", handle_readyz)
    return app


def create_control_app(sidecar: Sidecar) -> web.Application:
    """The control app of a sidecar that ``create_app`` built: GET /prestop only. It shares the
    sidecar (started and stopped by the inference app) and is served on 127.0.0.1 only."""
    app = web.Application(middlewares=[json_errors("sidecar")])
    app[SIDECAR] = sidecar
    app.router.add_get("/prestop", handle_prestop)
    return app

"""modelroll's model protocol (``POST /v1/batch``, ``GET /readyz``, ``GET /livez``,
``GET /v1/stats``, ``GET /v1/tokenizer`` for a model with one) over any batch function: what a
model team subclasses to sit behind the sidecar.

The model loads in the background after the server starts, so probes are answered while it loads
(``/readyz`` 503, then 200). Batches run one at a time on one worker thread, which keeps the event
loop free for probes and lets the model use the cores it was given.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from aiohttp import web

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_BODY_BYTES = 4 << 20


class BatchModel(ABC):
    """A model as the core serves it. ``load`` and ``predict`` run on the worker thread, never at
    the same time; ``item_error``, ``info`` and ``stats`` on the event loop."""

    name = "the model"
    """What log lines call it."""

    def load(self) -> None:
        """Runs once, before any batch; ``/readyz`` answers 503 until it returns."""
        return None

    def item_error(self, payload: Any) -> str | None:
        """Why one input cannot be served (it gets ``null`` and this message), or None."""
        return None

    @abstractmethod
    def predict(self, inputs: list[Any]) -> list[Any]:
        """One output per input, in order (JSON values, numpy arrays or numpy scalars)."""

    def tokenizer(self) -> str | None:
        """The model's tokenizer as a Hugging Face tokenizer.json, configured as ``predict``
        uses it (truncation included), for a sidecar that counts lengths in its tokens
        (``--length-from tokenizer``); None: the model has none (``/v1/tokenizer`` is 404)."""
        return None

    def info(self) -> dict[str, Any]:
        """Fields that ``/readyz`` and ``/v1/stats`` add about the model (a variant, a version)."""
        return {}

    def stats(self) -> dict[str, Any]:
        """The model's own counters in ``/v1/stats``, after the core's batches and items."""
        return {}


class BatchService:
    """The model, whether it has loaded, its worker thread and the core's counters."""

    def __init__(self, model: BatchModel, max_batch_size: int) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.loaded = False
        self.load_failed = False
        self.load_finished = asyncio.Event()
        """Set once loading has ended, in success or in failure."""
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelroll-model")
        self.batches = 0
        self.items = 0
        self.batch_sizes: deque[int] = deque(maxlen=10_000)

    async def load_in_background(self) -> None:
        started = time.perf_counter()
        try:
            await asyncio.get_running_loop().run_in_executor(self.worker, self.model.load)
        except Exception:
            self.load_failed = True
            log.exception("Failed to load %s", self.model.name)
            return
        finally:
            self.load_finished.set()
        self.loaded = True
        log.info("Loaded %s in %.1f s", self.model.name, time.perf_counter() - started)

    async def predict(self, inputs: list[Any]) -> list[Any]:
        """The model's outputs for a batch it accepted; raises if it failed or broke the count."""
        outputs = await asyncio.get_running_loop().run_in_executor(
            self.worker, self.model.predict, inputs
        )
        if len(outputs) != len(inputs):
            counts = len(outputs), len(inputs)
            log.error("Got from %s %d outputs for %d inputs", self.model.name, *counts)
            raise ValueError("wrong number of outputs")
        self.batches += 1
        self.items += len(inputs)
        self.batch_sizes.append(len(inputs))
        return outputs

    def unready(self) -> web.Response | None:
        """The 503 to answer before the model has loaded, or None once it has."""
        if self.loaded:
            return None
        return error(503, "the model failed to load" if self.load_failed else "loading")


BATCH_SERVICE = web.AppKey("batch_service", BatchService)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def handle_batch(request: web.Request) -> web.Response:
    service = request.app[BATCH_SERVICE]
    if (refusal := service.unready()) is not None:
        return refusal
    try:
        body = json.loads(await request.read())
    except ValueError:
        return error(400, "malformed JSON")
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(inputs, list) or not inputs:
        return error(400, 'body must be {"inputs": [...]} with at least one input')
    if len(inputs) > service.max_batch_size:
        limit = service.max_batch_size
        return error(400, f"{len(inputs)} inputs exceed the batch limit of {limit}")
    try:
        errors = [service.model.item_error(payload) for payload in inputs]
        accepted = [payload for payload, e in zip(inputs, errors, strict=True) if e is None]
        rows = iter(await service.predict(accepted) if accepted else [])
        outputs = [None if e is not None else next(rows) for e in errors]
        answer: dict[str, Any] = {"outputs": outputs}
        if any(e is not None for e in errors):
            answer["errors"] = errors
        encoded = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    except Exception as exc:  # its message may quote an input: the log gets only its type
        name, kind = service.model.name, type(exc).__name__
        log.error("Failed to serve a batch of %d with %s: %s", len(inputs), name, kind)
        return error(500, "the model failed on this batch")
    return web.Response(body=encoded, content_type="application/json")


async def handle_readyz(request: web.Request) -> web.Response:
    service = request.app[BATCH_SERVICE]
    if (refusal := service.unready()) is not None:
        return refusal
    return web.json_response({"status": "ready", **service.model.info()})


async def handle_tokenizer(request: web.Request) -> web.Response:
    service = request.app[BATCH_SERVICE]
    if (refusal := service.unready()) is not None:
        return refusal
    tokenizer = service.model.tokenizer()
    if tokenizer is None:
        return error(404, f"{service.model.name} has no tokenizer")
    return web.Response(text=tokenizer, content_type="application/json")


async def handle_livez(request: web.Request) -> web.Response:
    """Alive while loading or serving; 500 once loading has failed, so the pod restarts."""
    if request.app[BATCH_SERVICE].load_failed:
        return error(500, "the model failed to load")
    return web.json_response({"status": "alive"})


async def handle_stats(request: web.Request) -> web.Response:
    """Counters since start: batches and items served, the model's own, recent batch sizes."""
    service = request.app[BATCH_SERVICE]
    return web.json_response(
        {
            **service.model.info(),
            "batches": service.batches,
            "items": service.items,
            **service.model.stats(),
            "batch_sizes": list(service.batch_sizes),
        }
    )


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own refusals (413 past the body limit, 404, 405) as JSON, like every other."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, exc.reason)


def create_app(
    model: BatchModel,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> web.Application:
    """The app: a batch of more than ``max_batch_size`` inputs gets 400, a larger body 413."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[json_errors])
    service = BatchService(model, max_batch_size)
    app[BATCH_SERVICE] = service

    async def lifespan(_: web.Application) -> AsyncIterator[None]:
        loading = asyncio.create_task(service.load_in_background(), name="modelroll-load")
        yield
        loading.cancel()
        service.worker.shutdown(wait=False, cancel_futures=True)

    app.cleanup_ctx.append(lifespan)
    app.router.add_post("/v1/batch", handle_batch)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/livez", handle_livez)
    app.router.add_get("/v1/stats", handle_stats)
    app.router.add_get("/v1/tokenizer", handle_tokenizer)
    return app


def serve(
    model: BatchModel,
    host: str = "127.0.0.1",
    port: int = 8080,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Serve ``model`` until SIGTERM or SIGINT, logging to stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(model, max_batch_size, max_body_bytes)
    web.run_app(app, host=host, port=port, access_log=None, print=None)

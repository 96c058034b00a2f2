"""The encoder's aiohttp app: modelroll's model protocol (``POST /v1/batch``, ``GET /readyz``) in
front of one variant of all-MiniLM-L6-v2, plus ``GET /livez`` and ``GET /v1/stats``.

The model loads in the background after the server starts, so probes are answered while it loads
(``/readyz`` 503, then 200). Batches run one at a time on one worker thread, which keeps the event
loop free for probes and lets onnxruntime and numpy use the cores they were given.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from aiohttp import web

from .encoder import Encoder, EncoderFiles, Tokens, load_encoder

log = logging.getLogger(__name__)

JSON_TYPES = {
    dict: "an object",
    list: "an array",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """Everything the server needs; built by ``cli.parse_args`` or directly in tests."""

    host: str = "127.0.0.1"
    port: int = 8080
    variant: str = "int8"
    intra_op_threads: int = 1
    """Threads one batch's operators run on (int8: onnxruntime's; fp32: OpenBLAS's). One: on 2
    cores a second thread gains at most a tenth of a batch's time when the other core is idle, and
    loses more whenever the sidecar (or anything else) is using it (README.md, Cost)."""
    max_batch_size: int = 256
    """Inputs per batch; a larger batch is refused (400) and the sidecar splits it."""
    max_body_bytes: int = 4 << 20
    """Request bodies over this get 413 unread."""
    zip_path: Path = field(default_factory=Path)
    """The sentence-transformers ``model.zip``: tokenizer, config (both variants), fp32 weights."""
    onnx_path: Path = field(default_factory=Path)
    """The int8 ONNX file (int8 only)."""

    @property
    def files(self) -> EncoderFiles:
        return EncoderFiles(self.zip_path, self.onnx_path)


@dataclass(frozen=True, slots=True)
class Encoded:
    """One batch's answer from the worker thread."""

    vectors: npt.NDArray[np.float32]
    tokens: Tokens
    seconds: float


class EncoderService:
    """The loaded model (or whether loading failed), its worker thread and its counters."""

    def __init__(self, config: EncoderConfig, load: Callable[[], Encoder]) -> None:
        self.config = config
        self.load = load
        self.encoder: Encoder | None = None
        self.load_failed = False
        self.load_finished = asyncio.Event()
        """Set once loading has ended, in success or in failure."""
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelroll-encoder")
        self.batches = 0
        self.items = 0
        self.useful_tokens = 0
        self.padded_tokens = 0
        self.encode_seconds = 0.0
        self.batch_sizes: deque[int] = deque(maxlen=10_000)

    async def load_in_background(self) -> None:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            self.encoder = await loop.run_in_executor(self.worker, self.load)
        except Exception:
            self.load_failed = True
            log.exception("Failed to load the %s encoder", self.config.variant)
            return
        finally:
            self.load_finished.set()
        log.info(
            "Loaded the %s encoder in %.1f s", self.config.variant, time.perf_counter() - started
        )

    async def encode(self, encoder: Encoder, texts: list[str]) -> Encoded:
        def run() -> Encoded:
            started = time.perf_counter()
            tokens = encoder.tokenize(texts)
            vectors = encoder.encode_tokens(tokens)
            return Encoded(vectors, tokens, time.perf_counter() - started)

        encoded = await asyncio.get_running_loop().run_in_executor(self.worker, run)
        self.batches += 1
        self.items += len(texts)
        self.useful_tokens += encoded.tokens.useful
        self.padded_tokens += encoded.tokens.padded
        self.encode_seconds += encoded.seconds
        self.batch_sizes.append(len(texts))
        return encoded


ENCODER = web.AppKey("encoder", EncoderService)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def item_error(payload: object) -> str | None:
    """Why an input cannot be encoded, or None for a string."""
    if isinstance(payload, str):
        return None
    kind = "null" if payload is None else JSON_TYPES.get(type(payload), type(payload).__name__)
    return f"input must be a string, got {kind}"


async def handle_batch(request: web.Request) -> web.Response:
    service = request.app[ENCODER]
    encoder = service.encoder
    if encoder is None:
        return error(503, "the model failed to load" if service.load_failed else "loading")
    try:
        body = json.loads(await request.read())
    except ValueError:
        return error(400, "malformed JSON")
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(inputs, list) or not inputs:
        return error(400, 'body must be {"inputs": [...]} with at least one input')
    if len(inputs) > service.config.max_batch_size:
        limit = service.config.max_batch_size
        return error(400, f"{len(inputs)} inputs exceed the batch limit of {limit}")
    errors = [item_error(payload) for payload in inputs]
    texts = [payload for payload in inputs if isinstance(payload, str)]
    outputs: list[Any] = [None] * len(inputs)
    if texts:
        try:
            encoded = await service.encode(encoder, texts)
        except Exception as exc:
            log.error("Failed to encode a batch of %d: %s", len(texts), type(exc).__name__)
            return error(500, "the model failed on this batch")
        rows = iter(encoded.vectors)
        outputs = [None if e is not None else next(rows) for e in errors]
    answer: dict[str, Any] = {"outputs": outputs}
    if any(e is not None for e in errors):
        answer["errors"] = errors
    return web.Response(
        body=orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY),
        content_type="application/json",
    )


async def handle_readyz(request: web.Request) -> web.Response:
    service = request.app[ENCODER]
    if service.encoder is None:
        return error(503, "the model failed to load" if service.load_failed else "loading")
    return web.json_response({"status": "ready", "variant": service.config.variant})


async def handle_livez(request: web.Request) -> web.Response:
    """Alive while loading or serving; 500 once loading has failed, so the pod restarts."""
    if request.app[ENCODER].load_failed:
        return error(500, "the model failed to load")
    return web.json_response({"status": "alive"})


async def handle_stats(request: web.Request) -> web.Response:
    """Counters since start, as ``modelroll-demo-model`` has them: batches and items encoded,
    useful tokens (WordPiece tokens with [CLS] and [SEP]) and padded tokens (per batch: its size x
    its longest input), seconds spent encoding, and recent batch sizes."""
    service = request.app[ENCODER]
    return web.json_response(
        {
            "variant": service.config.variant,
            "batches": service.batches,
            "items": service.items,
            "useful_tokens": service.useful_tokens,
            "padded_tokens": service.padded_tokens,
            "encode_seconds": round(service.encode_seconds, 6),
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


def create_encoder_app(
    config: EncoderConfig, load: Callable[[], Encoder] | None = None
) -> web.Application:
    """The app; ``load`` builds the encoder (by default from ``config``'s variant and files)."""

    def load_from_config() -> Encoder:
        return load_encoder(config.variant, config.files, config.intra_op_threads)

    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[json_errors])
    service = EncoderService(config, load or load_from_config)
    app[ENCODER] = service

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
    return app

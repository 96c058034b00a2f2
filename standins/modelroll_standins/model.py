"""``modelroll-demo-model``: a stand-in model server whose cost follows padded sequence length.

A batch costs ``fixed_ms + per_token_ms x batch size x longest length``, like a GPU that pads
every row to the longest one. Like one GPU, it runs at most ``--parallel`` batches at a time; the
rest wait their turn. Outputs depend only on the input. ``--error-rate`` fails that fraction of
items with a per-item error, drawn from a generator seeded with ``--seed``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from modelroll_sidecar.protocol import padded_tokens, payload_length

SPIN_S = 0.0015


@dataclass(frozen=True, slots=True)
class DemoModelConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    fixed_ms: float = 5.0
    per_token_ms: float = 0.05
    parallel: int = 1
    error_rate: float = 0.0
    batch_error_rate: float = 0.0
    max_length: int = 0
    seed: int = 0
    ready_after_ms: float = 0.0

    def batch_cost_s(self, lengths: list[int]) -> float:
        return (self.fixed_ms + self.per_token_ms * padded_tokens(lengths)) / 1000


async def sleep_until(deadline: float) -> None:
    """Wait without blocking until the loop time ``deadline``, to within a few microseconds.
    A plain asyncio.sleep overshoots by up to a millisecond (epoll's timeout resolution), which
    would make the model slower than its configured cost; the last millisecond is spent yielding."""
    loop = asyncio.get_running_loop()
    coarse = deadline - loop.time() - SPIN_S
    if coarse > 0:
        await asyncio.sleep(coarse)
    while loop.time() < deadline:  # noqa: ASYNC110 (a deliberate, bounded spin)
        await asyncio.sleep(0)


def infer_one(payload: Any) -> dict[str, Any]:
    """A deterministic 'prediction': a label and score derived from the input's bytes."""
    digest = zlib.crc32(json.dumps(payload, sort_keys=True).encode())
    return {
        "label": "positive" if digest % 2 else "negative",
        "score": round(digest / 0xFFFFFFFF, 4),
        "length": payload_length(payload),
    }


class BatchFailed(Exception):
    """The whole batch fails: answered 500, as a model server that crashed mid-batch would."""


class DemoModel:
    """The model's state: its execution slots, failure generator and a record of its batches."""

    def __init__(self, config: DemoModelConfig) -> None:
        self.config = config
        self.slots = asyncio.Semaphore(config.parallel)
        self.rng = random.Random(config.seed)
        self.batch_sizes: deque[int] = deque(maxlen=10_000)
        self.batches = 0
        self.items = 0
        self.useful_tokens = 0
        self.padded_tokens = 0
        self.busy = 0
        self.max_busy = 0
        self.ready_at = 0.0
        self.slot_freed_at = 0.0

    async def run(self, inputs: list[Any], arrived: float) -> dict[str, Any]:
        """Execute one batch. The cost clock starts when a slot is free, but no earlier than the
        request's arrival, so reading and parsing the request is part of the cost, not extra."""
        loop = asyncio.get_running_loop()
        lengths = [payload_length(p) for p in inputs]
        cost = self.config.batch_cost_s(lengths)
        async with self.slots:
            started = max(arrived, self.slot_freed_at)
            self.busy += 1
            self.max_busy = max(self.max_busy, self.busy)
            try:
                await sleep_until(started + cost)
            finally:
                self.busy -= 1
                self.slot_freed_at = loop.time()
        self.batches += 1
        self.items += len(inputs)
        self.useful_tokens += sum(lengths)
        self.padded_tokens += padded_tokens(lengths)
        self.batch_sizes.append(len(inputs))
        if self.config.batch_error_rate and self.rng.random() < self.config.batch_error_rate:
            raise BatchFailed("injected failure of the whole batch (--batch-error-rate)")
        outputs: list[Any] = []
        errors: list[str | None] = []
        limit = self.config.max_length
        for payload, length in zip(inputs, lengths, strict=True):
            if limit and length > limit:
                outputs.append(None)
                errors.append(f"input of {length} tokens is longer than --max-length {limit}")
            elif self.config.error_rate and self.rng.random() < self.config.error_rate:
                outputs.append(None)
                errors.append("injected failure (--error-rate)")
            else:
                outputs.append(infer_one(payload))
                errors.append(None)
        body: dict[str, Any] = {"outputs": outputs}
        if any(e is not None for e in errors):
            body["errors"] = errors
        return body


DEMO_MODEL = web.AppKey("demo_model", DemoModel)


async def handle_batch(request: web.Request) -> web.Response:
    arrived = asyncio.get_running_loop().time()
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": "malformed JSON"}, status=400)
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(inputs, list) or not inputs:
        return web.json_response({"error": 'body must be {"inputs": [...]}'}, status=400)
    try:
        return web.json_response(await request.app[DEMO_MODEL].run(inputs, arrived))
    except BatchFailed as exc:
        return web.json_response({"error": str(exc)}, status=500)


async def handle_readyz(request: web.Request) -> web.Response:
    model = request.app[DEMO_MODEL]
    if asyncio.get_running_loop().time() < model.ready_at:
        return web.json_response({"error": "loading"}, status=503)
    return web.json_response({"status": "ready"})


async def handle_stats(request: web.Request) -> web.Response:
    """How the model was called, as counters since it started: batches run, items in them,
    useful tokens (the sum of the items' lengths) and padded tokens (per batch: its size x its
    longest length, what the cost is charged on); also recent batch sizes and peak parallelism.
    A batch counts once it has finished. Useful over padded tokens between two reads is the
    padding efficiency of the batches run meanwhile."""
    model = request.app[DEMO_MODEL]
    return web.json_response(
        {
            "batches": model.batches,
            "items": model.items,
            "useful_tokens": model.useful_tokens,
            "padded_tokens": model.padded_tokens,
            "batch_sizes": list(model.batch_sizes),
            "max_parallel_seen": model.max_busy,
        }
    )


def create_demo_model_app(config: DemoModelConfig) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    model = DemoModel(config)
    app[DEMO_MODEL] = model

    async def on_startup(_: web.Application) -> None:
        model.ready_at = asyncio.get_running_loop().time() + config.ready_after_ms / 1000

    app.on_startup.append(on_startup)
    app.router.add_post("/v1/batch", handle_batch)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/livez", handle_readyz)
    app.router.add_get("/v1/stats", handle_stats)
    return app


def parse_args(argv: Sequence[str] | None = None) -> DemoModelConfig:
    parser = argparse.ArgumentParser(
        prog="modelroll-demo-model",
        description="A model server whose batch cost is fixed + per-token x padded tokens.",
    )
    defaults = DemoModelConfig()
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=defaults.port, help="port to listen on")
    parser.add_argument(
        "--fixed-ms", type=float, default=defaults.fixed_ms, help="cost of every batch, in ms"
    )
    parser.add_argument(
        "--per-token-ms",
        type=float,
        default=defaults.per_token_ms,
        help="cost per padded token (batch size x longest length), in ms",
    )
    parser.add_argument(
        "--parallel", type=int, default=defaults.parallel, help="batches executed at once"
    )
    parser.add_argument(
        "--error-rate",
        type=float,
        default=defaults.error_rate,
        help="fraction of items to fail, 0..1",
    )
    parser.add_argument(
        "--batch-error-rate",
        type=float,
        default=defaults.batch_error_rate,
        help="fraction of batches to fail whole: answered 500, so the sidecar answers each of "
        "their requests 502",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=defaults.max_length,
        help="fail each input longer than this many tokens (a per-item error, 422 from the "
        "sidecar), as a model with a maximum sequence length does; 0: no limit",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed for --error-rate and --batch-error-rate",
    )
    parser.add_argument(
        "--ready-after-ms",
        type=float,
        default=defaults.ready_after_ms,
        help="answer /readyz with 503 for this many ms after start (loading weights)",
    )
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel must be at least 1, got {args.parallel}")
    for name in ("error_rate", "batch_error_rate"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} must be between 0 and 1, got {getattr(args, name)}")
    if args.max_length < 0:
        parser.error(f"--max-length must not be negative, got {args.max_length}")
    if args.fixed_ms < 0 or args.per_token_ms < 0:
        parser.error("--fixed-ms and --per-token-ms must not be negative")
    return DemoModelConfig(**vars(args))


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    web.run_app(
        create_demo_model_app(config),
        host=config.host,
        port=config.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()

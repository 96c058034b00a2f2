"""``modelroll-demo-llm``: a stand-in chat LLM server that speaks OpenAI's HTTP API, deterministic
and seeded, whose cost and batching follow :mod:`.engine`.

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: a generation of a seeded lognormal
  number of tokens (``--output-mu``, ``--output-sigma``; at most ``max_tokens``), streamed as
  server-sent events in OpenAI's chunk format with ``"stream": true`` (a ``usage`` chunk when
  ``stream_options.include_usage`` asks for it, then ``data: [DONE]``), else one JSON answer with
  ``usage``. A prompt's length is its whitespace-separated words; the output depends only on the
  prompt, ``max_tokens`` and ``--seed``.
- ``POST /v1/embeddings``: one vector per input; a call costs ``--embed-fixed-ms`` plus
  ``--embed-per-token-ms`` per input token, one call at a time, so a call with many inputs is
  cheaper than many calls.
- ``--error-rate``: that fraction of generations fails after a seeded number of tokens, and the
  server drops the connection mid-stream, as a crashed engine does.
- ``GET /v1/models``, ``GET /readyz`` (503 for ``--ready-after-ms``), ``GET /health``,
  ``GET /v1/stats`` (the engine's counters).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import time
import zlib
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from .engine import SCHEDULERS, Engine, EngineCost, Failed, Finished, Sequence, Token

EMBEDDING_DIMENSIONS = 8
MESSAGE_OVERHEAD_TOKENS = 3
"""Tokens a chat template adds around each message."""


@dataclass(frozen=True, slots=True)
class DemoLLMConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    served_model_name: str = "demo-llm"
    scheduler: str = "continuous"
    step_ms: float = 8.0
    step_ms_per_seq: float = 0.25
    prefill_ms_per_token: float = 0.02
    max_seqs: int = 64
    kv_tokens: int = 65536
    output_mu: float = 4.0
    output_sigma: float = 0.8
    max_tokens: int = 512
    embed_fixed_ms: float = 5.0
    embed_per_token_ms: float = 0.01
    error_rate: float = 0.0
    seed: int = 0
    ready_after_ms: float = 0.0

    def engine_cost(self) -> EngineCost:
        return EngineCost(
            self.step_ms,
            self.step_ms_per_seq,
            self.prefill_ms_per_token,
            self.max_seqs,
            self.kv_tokens,
        )


class BadRequest(Exception):
    """The request breaks OpenAI's API; the message says how (400)."""


def words(text: str) -> int:
    return len(text.split())


def prompt_of(path: str, body: dict[str, Any]) -> tuple[str, int]:
    """The prompt's text (what the output is derived from) and its length in tokens."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest('"messages" must be a non-empty list')
        texts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, str):
                raise BadRequest('each message needs a string "content"')
            texts.append(content)
        text = "\n".join(texts)
        return text, words(text) + MESSAGE_OVERHEAD_TOKENS * len(messages)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest('"prompt" must be a string')
    return prompt, max(1, words(prompt))


class Generator:
    """How long each generation is, and whether and where it fails: all from the seed and the
    prompt, so the same request always gets the same answer."""

    def __init__(self, config: DemoLLMConfig) -> None:
        self.config = config

    def _rng(self, text: str, max_tokens: int) -> random.Random:
        return random.Random(f"{self.config.seed}/{max_tokens}/{zlib.crc32(text.encode())}")

    def sequence(self, text: str, prompt_tokens: int, max_tokens: int) -> Sequence:
        rng = self._rng(text, max_tokens)
        drawn = max(1, round(rng.lognormvariate(self.config.output_mu, self.config.output_sigma)))
        output = min(drawn, max_tokens)
        fail_after = None
        if self.config.error_rate and rng.random() < self.config.error_rate:
            fail_after = rng.randrange(output)
        return Sequence(prompt_tokens, output, fail_after)

    @staticmethod
    def word(text: str, index: int) -> str:
        return f"w{(zlib.crc32(text.encode()) + 7919 * index) % 1000} "


ENGINE = web.AppKey("engine", Engine)
CONFIG = web.AppKey("config", DemoLLMConfig)
EMBED_SLOT = web.AppKey("embed_slot", asyncio.Lock)
READY_AT: web.AppKey[list[float]] = web.AppKey("ready_at")
"""When the model is done "loading" (a list of one, so the lifespan can set it)."""
STATS_EMBED: web.AppKey[list[int]] = web.AppKey("embed_calls")
REPLIES: web.AppKey[itertools.count[int]] = web.AppKey("replies")


def error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status
    )


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class Reply:
    """OpenAI's answer shapes for one generation, chat or text completion."""

    def __init__(self, chat: bool, model: str, counter: int) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{counter}"
        self.created = int(time.time())

    def _base(self, streaming: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if streaming else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
        return sse({**self._base(True), "choices": [choice]})

    def usage_chunk(self, usage: dict[str, int]) -> bytes:
        return sse({**self._base(True), "choices": [], "usage": usage})

    def whole(self, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        return {**self._base(False), "choices": [choice], "usage": usage}


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise BadRequest("malformed JSON") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


async def handle_generate(request: web.Request) -> web.StreamResponse:
    config, engine = request.app[CONFIG], request.app[ENGINE]
    if asyncio.get_running_loop().time() < request.app[READY_AT][0]:
        return error(503, "the model is loading", "server_error")
    try:
        body = await read_json(request)
        text, prompt_tokens = prompt_of(request.path, body)
        max_tokens = body.get("max_tokens", config.max_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest('"max_tokens" must be a positive integer')
        sequence = Generator(config).sequence(text, prompt_tokens, max_tokens)
        engine.submit(sequence)
    except (BadRequest, ValueError) as exc:
        return error(400, str(exc))
    chat = request.path.endswith("/chat/completions")
    replies = request.app[REPLIES]
    reply = Reply(chat, config.served_model_name, next(replies))
    finish = "length" if sequence.output_tokens == max_tokens else "stop"
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": sequence.output_tokens,
        "total_tokens": prompt_tokens + sequence.output_tokens,
    }
    if not body.get("stream"):
        return await _whole(request, sequence, text, reply, finish, usage)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        first = True
        while True:
            event = await sequence.events.get()
            if isinstance(event, Token):
                await response.write(reply.chunk(Generator.word(text, event.index), first=first))
                first = False
            elif isinstance(event, Failed):
                assert request.transport is not None
                request.transport.abort()  # a crashed engine: the stream just stops
                return response
            elif isinstance(event, Finished):
                await response.write(reply.chunk(None, finish))
                if include_usage:
                    await response.write(reply.usage_chunk(usage))
                await response.write(sse("[DONE]"))
                await response.write_eof()
                return response
    except (ConnectionError, asyncio.CancelledError):
        engine.cancel(sequence)  # the client went away: stop generating for it
        raise


async def _whole(
    request: web.Request,
    sequence: Sequence,
    text: str,
    reply: Reply,
    finish: str,
    usage: dict[str, int],
) -> web.StreamResponse:
    parts: list[str] = []
    try:
        while True:
            event = await sequence.events.get()
            if isinstance(event, Token):
                parts.append(Generator.word(text, event.index))
            elif isinstance(event, Failed):
                return error(500, "injected failure (--error-rate)", "server_error")
            else:
                return web.json_response(reply.whole("".join(parts), finish, usage))
    except asyncio.CancelledError:
        request.app[ENGINE].cancel(sequence)
        raise


def embedding(text: str) -> list[float]:
    rng = random.Random(zlib.crc32(text.encode()))
    vector = [rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIMENSIONS)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [round(v / norm, 6) for v in vector]


async def handle_embeddings(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    try:
        body = await read_json(request)
        given = body.get("input")
        inputs = [given] if isinstance(given, str) else given
        if (
            not isinstance(inputs, list)
            or not inputs
            or not all(isinstance(i, str) for i in inputs)
        ):
            raise BadRequest('"input" must be a string or a non-empty list of strings')
    except BadRequest as exc:
        return error(400, str(exc))
    tokens = sum(max(1, words(i)) for i in inputs)
    async with request.app[EMBED_SLOT]:  # one call at a time, like one GPU
        await asyncio.sleep((config.embed_fixed_ms + config.embed_per_token_ms * tokens) / 1000)
    request.app[STATS_EMBED].append(len(inputs))
    return web.json_response(
        {
            "object": "list",
            "model": config.served_model_name,
            "data": [
                {"object": "embedding", "index": i, "embedding": embedding(text)}
                for i, text in enumerate(inputs)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


async def handle_models(request: web.Request) -> web.Response:
    name = request.app[CONFIG].served_model_name
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "modelroll"}]}
    )


async def handle_readyz(request: web.Request) -> web.Response:
    if asyncio.get_running_loop().time() < request.app[READY_AT][0]:
        return web.json_response({"error": "loading"}, status=503)
    return web.json_response({"status": "ready"})


async def handle_stats(request: web.Request) -> web.Response:
    """The engine's counters since it started (llm_engine.EngineStats), with the sequences
    waiting and running now, and the number of inputs in each embeddings call."""
    engine = request.app[ENGINE]
    calls = request.app[STATS_EMBED]
    return web.json_response(
        {
            **asdict(engine.stats),
            "scheduler": engine.scheduler,
            "waiting": engine.waiting,
            "running": engine.running,
            "embedding_calls": calls,
        }
    )


def create_demo_llm_app(config: DemoLLMConfig) -> web.Application:
    app = web.Application(client_max_size=16 << 20)
    app[CONFIG] = config
    app[EMBED_SLOT] = asyncio.Lock()
    app[READY_AT] = [0.0]
    app[STATS_EMBED] = []
    app[REPLIES] = itertools.count(1)

    async def lifespan(app: web.Application) -> Any:
        engine = Engine(config.engine_cost(), config.scheduler)
        app[ENGINE] = engine
        app[READY_AT][0] = asyncio.get_running_loop().time() + config.ready_after_ms / 1000
        engine.start()
        yield
        await engine.stop()

    app.cleanup_ctx.append(lifespan)
    app.router.add_post("/v1/chat/completions", handle_generate)
    app.router.add_post("/v1/completions", handle_generate)
    app.router.add_post("/v1/embeddings", handle_embeddings)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/health", handle_readyz)
    app.router.add_get("/v1/stats", handle_stats)
    return app


def parse_args(argv: Seq[str] | None = None) -> DemoLLMConfig:
    parser = argparse.ArgumentParser(
        prog="modelroll-demo-llm",
        description="A deterministic OpenAI-compatible LLM server with an engine's batching cost.",
    )
    d = DemoLLMConfig()
    add = parser.add_argument
    add("--host", default=d.host, help="address to listen on")
    add("--port", type=int, default=d.port, help="port to listen on")
    add(
        "--served-model-name",
        default=d.served_model_name,
        help="the model id /v1/models lists and answers carry",
    )
    add(
        "--scheduler",
        choices=SCHEDULERS,
        default=d.scheduler,
        help="continuous: sequences join and leave at every iteration; static: a batch runs "
        "until its longest "
        "sequence ends",
    )
    add("--step-ms", type=float, default=d.step_ms, help="an iteration's fixed cost, in ms")
    add(
        "--step-ms-per-seq",
        type=float,
        default=d.step_ms_per_seq,
        help="an iteration's cost per sequence in the batch, in ms",
    )
    add(
        "--prefill-ms-per-token",
        type=float,
        default=d.prefill_ms_per_token,
        help="prompt processing per prompt token, in ms, in the iteration that admits it",
    )
    add("--max-seqs", type=int, default=d.max_seqs, help="sequences in one iteration")
    add(
        "--kv-tokens",
        type=int,
        default=d.kv_tokens,
        help="KV budget: prompt and output tokens reserved by the sequences in the batch",
    )
    add(
        "--output-mu",
        type=float,
        default=d.output_mu,
        help="output length: lognormal mu (median e^mu tokens)",
    )
    add("--output-sigma", type=float, default=d.output_sigma, help="output length: lognormal sigma")
    add("--max-tokens", type=int, default=d.max_tokens, help="max_tokens when a request gives none")
    add(
        "--embed-fixed-ms",
        type=float,
        default=d.embed_fixed_ms,
        help="cost of an embeddings call, in ms",
    )
    add(
        "--embed-per-token-ms",
        type=float,
        default=d.embed_per_token_ms,
        help="cost per input token of an embeddings call, in ms",
    )
    add(
        "--error-rate",
        type=float,
        default=d.error_rate,
        help="fraction of generations that fail mid-stream (the connection drops)",
    )
    add("--seed", type=int, default=d.seed, help="seeds output lengths and failures")
    add(
        "--ready-after-ms",
        type=float,
        default=d.ready_after_ms,
        help="answer /readyz and /health with 503 for this many ms after start (loading weights)",
    )
    args = parser.parse_args(argv)
    if not 0.0 <= args.error_rate <= 1.0:
        parser.error(f"--error-rate must be between 0 and 1, got {args.error_rate}")
    for name in ("max_seqs", "kv_tokens", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return DemoLLMConfig(**vars(args))


def main(argv: Seq[str] | None = None) -> None:
    config = parse_args(argv)
    # handler_cancellation: a client that goes away while its sequence waits to be admitted
    # cancels it there (the handler's CancelledError), as an engine drops an aborted request.
    web.run_app(
        create_demo_llm_app(config),
        host=config.host,
        port=config.port,
        access_log=None,
        print=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()

"""The sidecar's /v1/embeddings with options: requests share an engine call only when they agree
on model, dimensions and encoding_format, which go to the engine with their inputs; a batch keeps
within --max-batch-tokens, each request counting its inputs' tokens; what the sidecar cannot pass
on is a 400 in OpenAI's shape. Each client still gets exactly its own vectors, through the
official openai client too."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.support.sidecar import RunningSidecar, StartSidecar

PATH = "/v1/embeddings"


def vector(model: str, dimensions: int, text: str) -> list[float]:
    """The engine's embedding of ``text``: which model and dimensions made it can be told."""
    seed = zlib.crc32(f"{model}/{text}".encode())
    return [float((seed >> i) % 7 + dimensions) for i in range(dimensions)]


@dataclass
class EmbeddingEngine:
    url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Each call's body, as the engine received it."""


ENGINE = web.AppKey("engine", EmbeddingEngine)


async def _embeddings(request: web.Request) -> web.Response:
    body = await request.json()
    request.app[ENGINE].calls.append(body)
    model, dimensions = body.get("model", "default"), body.get("dimensions", 4)
    data = []
    for i, text in enumerate(body["input"]):
        values: Any = vector(model, dimensions, text)
        if body.get("encoding_format") == "base64":
            values = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
        data.append({"object": "embedding", "index": i, "embedding": values})
    await asyncio.sleep(0.02)
    return web.json_response({"object": "list", "model": model, "data": data})


async def _healthy(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def serve_embedding_engine(aiohttp_server: AiohttpServer) -> EmbeddingEngine:
    app = web.Application()
    engine = app[ENGINE] = EmbeddingEngine()
    app.router.add_post(PATH, _embeddings)
    app.router.add_get("/health", _healthy)
    server = await aiohttp_server(app, host="127.0.0.1")
    engine.url = str(server.make_url("")).rstrip("/")
    return engine


async def embed(sidecar: RunningSidecar, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    resp = await sidecar.client.post(PATH, json=body)
    answer: dict[str, Any] = await resp.json()
    return resp.status, answer


async def test_requests_share_a_call_only_with_the_same_options_which_reach_the_engine(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_embedding_engine(aiohttp_server)
    sidecar = await start_sidecar(engine.url, protocol="openai", max_batch_size=16, max_wait_ms=300)
    requests: list[dict[str, Any]] = [
        {"model": "base", "input": ["alpha", "beta"]},
        {"model": "adapter", "input": "gamma"},  # another client's adapter
        {"model": "base", "input": "delta", "dimensions": 8},
        {"model": "base", "input": ["epsilon"], "user": "someone"},
        {"model": "adapter", "input": ["zeta", "eta"], "user": "someone else"},
        {"model": "base", "input": "theta", "dimensions": 8},
    ]
    answers = await asyncio.gather(*(embed(sidecar, body) for body in requests))
    assert [status for status, _ in answers] == [200] * len(requests)
    for body, (_, answer) in zip(requests, answers, strict=True):
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        dims = body.get("dimensions", 4)
        assert [d["embedding"] for d in answer["data"]] == [
            vector(body["model"], dims, t) for t in texts
        ]
        assert [d["index"] for d in answer["data"]] == list(range(len(texts)))
        assert answer["model"] == body["model"]
    # One call per set of options, each with only its requests' inputs; `user` is dropped, so
    # requests of different users still share a call.
    calls = sorted(engine.calls, key=lambda call: call["input"][0])
    assert calls == [
        {"model": "base", "input": ["alpha", "beta", "epsilon"]},
        {"model": "base", "dimensions": 8, "input": ["delta", "theta"]},
        {"model": "adapter", "input": ["gamma", "zeta", "eta"]},
    ]


async def test_the_official_client_gets_its_own_vectors_in_base64_and_in_floats(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_embedding_engine(aiohttp_server)
    sidecar = await start_sidecar(engine.url, protocol="openai", max_wait_ms=50)
    client = openai.AsyncOpenAI(base_url=str(sidecar.client.make_url("/v1")), api_key="unused")
    try:
        packed, floats = await asyncio.gather(
            client.embeddings.create(model="base", input=["one", "two"], dimensions=6),
            client.embeddings.create(model="base", input="three", encoding_format="float"),
        )
    finally:
        await client.close()
    assert [d.embedding for d in packed.data] == [vector("base", 6, t) for t in ("one", "two")]
    assert [d.embedding for d in floats.data] == [vector("base", 4, "three")]
    # The client asks for base64 unless told otherwise: that request's vectors came packed.
    assert sorted((c.get("encoding_format"), c["input"]) for c in engine.calls) == [
        ("base64", ["one", "two"]),
        ("float", ["three"]),
    ]


async def test_the_token_budget_bounds_every_engine_call(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    engine = await serve_embedding_engine(aiohttp_server)
    sidecar = await start_sidecar(
        engine.url, protocol="openai", max_batch_size=64, max_wait_ms=300, max_batch_tokens=100
    )
    requests = [{"model": "base", "input": [f"w{n}"] * 30} for n in range(10)]
    requests.append({"model": "base", "input": ["one two three four"] * 40})  # 160 alone
    answers = await asyncio.gather(*(embed(sidecar, body) for body in requests))
    assert [status for status, _ in answers] == [200] * len(requests)
    sizes = [sum(len(text.split()) for text in call["input"]) for call in engine.calls]
    # Three requests of 30 tokens fit in 100 (size x longest), a fourth would not; the request
    # over the budget on its own goes alone.
    assert sizes == [90, 90, 90, 30, 160]
    assert answers[-1][1]["usage"] == {"prompt_tokens": 160, "total_tokens": 160}
    assert sidecar.sample("modelroll_batches_total", reason="tokens") == 4


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"model": "base", "input": "x", "encoding_format": "int8"},
            "\"encoding_format\" must be float or base64, got 'int8'",
        ),
        (
            {"model": "base", "input": [[1, 2], [3]]},
            '"input" as token ids is not batched by the sidecar; send the text',
        ),
        (
            {"model": "base", "input": [5, 6]},
            '"input" as token ids is not batched by the sidecar; send the text',
        ),
        (
            {"model": "base", "input": "x", "dimensions": "8"},
            "\"dimensions\" must be a positive integer, got '8'",
        ),
        (
            {"model": "base", "input": "x", "dimensions": 0},
            '"dimensions" must be a positive integer, got 0',
        ),
        ({"model": 3, "input": "x"}, '"model" must be a string'),
        ({"model": "base", "input": "x", "user": 7}, '"user" must be a string'),
        (
            {"model": "base", "input": "x", "truncate_prompt_tokens": 8},
            "the sidecar batches embeddings with only input, model, dimensions, "
            "encoding_format, user; it cannot pass on 'truncate_prompt_tokens'",
        ),
        ({"model": "base", "input": []}, '"input" must be a string or a non-empty list of strings'),
        (["x"], "the body must be a JSON object"),
    ],
)
async def test_what_the_sidecar_cannot_pass_on_is_a_400_in_openais_shape(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar, body: Any, message: str
) -> None:
    engine = await serve_embedding_engine(aiohttp_server)
    sidecar = await start_sidecar(engine.url, protocol="openai")
    resp = await sidecar.client.post(PATH, json=body)
    assert resp.status == 400
    answer = await resp.json()
    assert answer == {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": 400}
    }
    assert engine.calls == []

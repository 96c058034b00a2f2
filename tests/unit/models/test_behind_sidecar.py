"""A real modelroll sidecar in front of the encoder: concurrent requests share model calls, and
each client still gets its own sentence's vector."""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from modelroll_models.encoder import Encoder
from modelroll_sidecar.app import create_app
from modelroll_sidecar.config import SidecarConfig

from .conftest import StartEncoder

CLIENTS = 16


async def test_sixteen_clients_are_batched_and_each_gets_its_vector(
    start_encoder: StartEncoder, aiohttp_client: AiohttpClient, int8: Encoder
) -> None:
    model = await start_encoder()
    config = SidecarConfig(
        upstream=model.url,
        model="minilm",
        version="int8",
        max_batch_size=CLIENTS,
        max_wait_ms=200,
        readiness_interval_ms=100,
    )
    sidecar = await aiohttp_client(create_app(config, CollectorRegistry()))
    sentences = [f"Request number {i} asks about topic {i * 7 % 5}." for i in range(CLIENTS)]

    async def infer(sentence: str) -> list[float]:
        resp = await sidecar.post("/v1/infer", json={"payload": sentence})
        assert resp.status == 200
        body = await resp.json()
        assert (body["model"], body["version"]) == ("minilm", "int8")
        output: list[float] = body["output"]
        return output

    vectors = await asyncio.gather(*(infer(s) for s in sentences))

    assert model.service.items == CLIENTS
    assert model.service.batches < CLIENTS
    assert max(model.service.batch_sizes) > 1
    for sentence, vector in zip(sentences, vectors, strict=True):
        alone = int8.encode([sentence])[0]
        np.testing.assert_allclose(np.array(vector, dtype=np.float32), alone, atol=1e-4)

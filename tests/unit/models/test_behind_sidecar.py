"""A real modelroll sidecar in front of the encoder: concurrent requests share model calls, and
each client still gets its own sentence's vector."""

from __future__ import annotations

import asyncio

import numpy as np
from aiohttp.test_utils import TestClient
from aiohttp.web import Application, Request
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from modelroll_models.encoder import Encoder
from modelroll_sidecar.app import create_app
from modelroll_sidecar.config import SidecarConfig
from modelroll_sidecar.lengths import TokenLengths
from tests.support.encoder import StartEncoder
from tests.support.sidecar import until_ready

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
    await until_ready(sidecar)  # the sidecar has asked the encoder for its tokenizer
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


async def test_a_sidecar_counting_the_models_tokens_pads_as_the_model_does(
    start_encoder: StartEncoder, aiohttp_client: AiohttpClient
) -> None:
    """--length-from tokenizer, and auto (the default): the sidecar fetches the encoder's
    tokenizer, and its token counters (what its length-aware forming and token budget see) are
    exactly the encoder's own WordPiece counts, useful and padded; counting words undercounts
    both."""
    sentences = [
        "Hi.",
        "Photosynthesis converts 6CO2 and 6H2O into C6H12O6, releasing O2.",
        "The cat sat on the mat.",
        "Tokenizers split uncommon words like antidisestablishmentarianism into pieces.",
    ] * 4
    for length_from in ("auto", "tokenizer", "words"):
        model = await start_encoder()
        config = SidecarConfig(
            upstream=model.url,
            model="minilm",
            version="int8",
            max_batch_size=4,
            max_wait_ms=200,
            batch_by="length",
            length_from=length_from,
            readiness_interval_ms=50,
        )
        registry = CollectorRegistry()
        sidecar = await aiohttp_client(create_app(config, registry))
        await until_ready(sidecar)

        async def infer(sentence: str, client: TestClient[Request, Application] = sidecar) -> int:
            return (await client.post("/v1/infer", json={"payload": sentence})).status

        assert await asyncio.gather(*(infer(s) for s in sentences)) == [200] * len(sentences)
        labels = {"model": "minilm", "version": "int8"}
        useful = registry.get_sample_value(
            "modelroll_batch_tokens_total", {**labels, "kind": "useful"}
        )
        padded = registry.get_sample_value(
            "modelroll_batch_tokens_total", {**labels, "kind": "padded"}
        )
        assert useful is not None
        assert padded is not None
        stats = model.service.model.stats()
        if length_from != "words":
            assert (useful, padded) == (stats["useful_tokens"], stats["padded_tokens"])
        else:
            assert useful < stats["useful_tokens"]
            assert padded < stats["padded_tokens"]


def test_token_lengths_are_the_encoders_own_and_a_long_text_reaches_its_truncation(
    int8: Encoder,
) -> None:
    """A sentence's length is its row in the encoder's batch, [CLS] and [SEP] included; a text
    of 100 000 characters, of which only the head is tokenized, is as long as the encoder
    truncates to (256 tokens)."""
    lengths = TokenLengths(int8.tokenizer_json())
    for sentence in ("Hi.", "Antidisestablishmentarianism, in 1901, was debated."):
        assert lengths(sentence) == int(int8.tokenize([sentence]).attention_mask.sum())
    assert lengths("word " * 20_000) == int8.tokenize(["word " * 20_000]).input_ids.shape[1] == 256
    assert lengths([101, 2023, 102]) == 3

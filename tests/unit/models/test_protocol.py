"""The encoder server speaks modelroll's model protocol: vectors in input order, a per-item error
for an input that is not a string, readiness only once the model is loaded, and its counters."""

from __future__ import annotations

import threading

import aiohttp
import numpy as np

from modelroll_models.encoder import Encoder
from tests.support.encoder import StartEncoder, wait_loaded


async def post_batch(url: str, body: object) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/batch", json=body) as resp,
    ):
        answer: dict[str, object] = await resp.json()
        return resp.status, answer


async def get_status(url: str, path: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + path) as resp:
        return resp.status


async def test_a_batch_gets_vectors_and_per_item_errors(
    start_encoder: StartEncoder, int8: Encoder
) -> None:
    model = await start_encoder()
    inputs: list[object] = ["A man is eating food.", 42, None, "Ein Mann isst.", {"text": "x"}]
    status, answer = await post_batch(model.url, {"inputs": inputs})
    assert status == 200
    assert answer["errors"] == [
        None,
        "input must be a string, got a number",
        "input must be a string, got null",
        None,
        "input must be a string, got an object",
    ]
    outputs = answer["outputs"]
    assert isinstance(outputs, list)
    assert [o is None for o in outputs] == [False, True, True, False, True]
    expected = int8.encode(["A man is eating food.", "Ein Mann isst."])
    np.testing.assert_array_equal(np.array([outputs[0], outputs[3]], dtype=np.float32), expected)


async def test_an_all_string_batch_has_no_errors(start_encoder: StartEncoder) -> None:
    model = await start_encoder()
    status, answer = await post_batch(model.url, {"inputs": ["one", "two words"]})
    assert status == 200
    assert "errors" not in answer
    outputs = answer["outputs"]
    assert isinstance(outputs, list)
    assert [len(o) for o in outputs] == [384, 384]


async def test_readiness_waits_for_the_model(start_encoder: StartEncoder) -> None:
    gate = threading.Event()
    model = await start_encoder(gate=gate)
    try:
        assert await get_status(model.url, "/readyz") == 503
        assert await get_status(model.url, "/livez") == 200
        status, answer = await post_batch(model.url, {"inputs": ["too early"]})
        assert (status, answer) == (503, {"error": "loading"})
    finally:
        gate.set()
    await wait_loaded(model.service)
    assert await get_status(model.url, "/readyz") == 200
    status, _ = await post_batch(model.url, {"inputs": ["now"]})
    assert status == 200


async def test_a_model_that_fails_to_load_is_unready_and_not_alive(
    start_encoder: StartEncoder,
) -> None:
    def broken() -> Encoder:
        raise OSError("weights unreadable")

    model = await start_encoder(load=broken)
    assert await get_status(model.url, "/readyz") == 503
    assert await get_status(model.url, "/livez") == 500


async def test_bad_bodies_are_refused(start_encoder: StartEncoder) -> None:
    model = await start_encoder(max_batch_size=4, max_body_bytes=1024)
    bodies: list[object] = [{"inputs": []}, {"input": ["x"]}, ["x"], {"inputs": ["x"] * 5}]
    for body in bodies:
        status, _ = await post_batch(model.url, body)
        assert status == 400, body
    status, answer = await post_batch(model.url, {"inputs": ["x" * 2048]})
    assert (status, answer) == (413, {"error": "Request Entity Too Large"})
    async with (
        aiohttp.ClientSession() as http,
        http.post(model.url + "/v1/batch", data=b"{not json") as resp,
    ):
        assert resp.status == 400


async def test_stats_count_real_and_padded_tokens(start_encoder: StartEncoder) -> None:
    model = await start_encoder()
    await post_batch(model.url, {"inputs": ["short", "a somewhat longer sentence than that", 7]})
    async with aiohttp.ClientSession() as http, http.get(model.url + "/v1/stats") as resp:
        stats = await resp.json()
    # [CLS] short [SEP] is 3 tokens; the longer one 8: the batch of two pads to 2 x 8.
    assert stats["batches"] == 1
    assert stats["items"] == 2
    assert stats["batch_sizes"] == [2]
    assert stats["useful_tokens"] == 3 + 8
    assert stats["padded_tokens"] == 2 * 8
    assert stats["variant"] == "int8"

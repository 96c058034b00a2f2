"""The model protocol's core serving a model of a team's own: what ``BatchModel`` promises."""

from __future__ import annotations

import asyncio
from typing import Any

from pytest_aiohttp import AiohttpClient

from modelroll_models.batch_server import BATCH_SERVICE, BatchModel, create_app


class Lengths(BatchModel):
    """Each string's length; anything else is refused per item."""

    name = "the lengths model"

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def item_error(self, payload: Any) -> str | None:
        return None if isinstance(payload, str) else "input must be a string"

    def predict(self, inputs: list[Any]) -> list[Any]:
        self.calls.append(inputs)
        return [len(text) for text in inputs]

    def info(self) -> dict[str, Any]:
        return {"version": "v1"}

    def stats(self) -> dict[str, Any]:
        return {"calls": len(self.calls)}


class Short(Lengths):
    """Breaks the protocol: one output too few."""

    def predict(self, inputs: list[Any]) -> list[Any]:
        return super().predict(inputs)[:-1]


async def loaded(client: AiohttpClient, model: BatchModel) -> Any:
    app = create_app(model, max_batch_size=4)
    served = await client(app)
    async with asyncio.timeout(5):
        await app[BATCH_SERVICE].load_finished.wait()
    return served


async def test_a_subclass_is_served_with_refused_items_kept_out_of_its_batch(
    aiohttp_client: AiohttpClient,
) -> None:
    model = Lengths()
    client = await loaded(aiohttp_client, model)
    answer = await client.post("/v1/batch", json={"inputs": ["abc", 7, "hello"]})
    assert answer.status == 200
    assert await answer.json() == {
        "outputs": [3, None, 5],
        "errors": [None, "input must be a string", None],
    }
    assert model.calls == [["abc", "hello"]]
    ready = await (await client.get("/readyz")).json()
    assert ready == {"status": "ready", "version": "v1"}
    stats = await (await client.get("/v1/stats")).json()
    assert (stats["batches"], stats["items"], stats["calls"], stats["version"]) == (1, 2, 1, "v1")
    too_many = await client.post("/v1/batch", json={"inputs": ["a"] * 5})
    assert too_many.status == 400
    assert "batch limit of 4" in (await too_many.json())["error"]


async def test_a_model_that_miscounts_its_outputs_fails_the_batch(
    aiohttp_client: AiohttpClient,
) -> None:
    client = await loaded(aiohttp_client, Short())
    answer = await client.post("/v1/batch", json={"inputs": ["a", "b"]})
    assert answer.status == 500
    assert await answer.json() == {"error": "the model failed on this batch"}
    stats = await (await client.get("/v1/stats")).json()
    assert (stats["batches"], stats["items"]) == (0, 0)

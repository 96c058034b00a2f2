"""One client cannot fail anyone else's request: numbers a model would read as infinite and deep
nesting are refused up front, and a batch the model refuses because of one input is split until
only that input's request fails."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from modelroll_sidecar.protocol import MAX_DEPTH, decode
from tests.support.sidecar import StartModel, StartSidecar


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"payload": 1e400}', "out of range"),
        (b'{"payload": [-1e999]}', "out of range"),
        (b'{"payload": {"x": Infinity}}', "Infinity is not valid JSON"),
        (b'{"payload": -Infinity}', "-Infinity is not valid JSON"),
        (b'{"payload": NaN}', "NaN is not valid JSON"),
        (b'{"payload": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", "nested"),
        (b'{"payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
        (b'{"payload": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}", "nested"),
    ],
    ids=[
        "overflow",
        "negative overflow",
        "Infinity",
        "-Infinity",
        "NaN",
        "just too deep",
        "very deep arrays",
        "very deep objects",
    ],
)
async def test_values_a_model_cannot_read_are_refused_with_a_json_400(
    start_model: StartModel, start_sidecar: StartSidecar, body: bytes, message: str
) -> None:
    model = await start_model(fixed_ms=1)
    sidecar = await start_sidecar(model.url, max_wait_ms=5)
    resp = await sidecar.client.post(
        "/v1/infer", data=body, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert resp.content_type == "application/json"
    assert message in (await resp.json())["error"]
    assert model.model.batches == 0  # it never reached the model
    assert (await sidecar.infer("fine"))[0] == 200


async def test_nesting_up_to_the_limit_passes(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1)
    sidecar = await start_sidecar(model.url, max_wait_ms=5)
    nested: Any = 1
    for _ in range(MAX_DEPTH - 1):  # the body's own object is one level
        nested = [nested]
    assert (await sidecar.infer(nested))[0] == 200


async def test_a_batch_the_model_refuses_for_one_input_is_split_until_only_it_fails(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    """A strict model server refuses a whole batch (400) if any input is one it cannot take.
    The hostile client's request gets 422; everyone who shared its batch gets their answer."""
    batches: list[int] = []

    async def strict_model(request: web.Request) -> web.Response:
        inputs = (await request.json())["inputs"]
        batches.append(len(inputs))
        if any(isinstance(i, dict) and "exploit" in i for i in inputs):
            return web.json_response({"error": "schema violation"}, status=400)
        return web.json_response({"outputs": [f"ok {i}" for i in inputs]})

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/batch", strict_model)
    app.router.add_get("/readyz", readyz)
    model = await aiohttp_server(app)
    sidecar = await start_sidecar(
        str(model.make_url("")).rstrip("/"), max_wait_ms=50, max_batch_size=8
    )
    payloads: list[Any] = [f"r{i}" for i in range(7)]
    payloads.insert(3, {"exploit": True})
    answers = await asyncio.gather(*(sidecar.infer(p) for p in payloads))

    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 200, 422, 200, 200, 200, 200]
    assert answers[3][1]["error"] == "model refused the input: HTTP 400"
    assert [body["output"] for status, body in answers if status == 200] == [
        f"ok {p}" for p in payloads if isinstance(p, str)
    ]
    assert batches[0] == 8  # one batch first, then halves down to the input to blame
    assert sidecar.sample("modelroll_requests_total", code="200") == 7


def test_the_depth_check_needs_no_recursion() -> None:
    deep = b"[" * 500 + b"]" * 500
    with pytest.raises(ValueError, match="nested deeper"):
        decode(deep)
    assert decode(json.dumps({"a": [1, {"b": 2.5}]}).encode()) == {"a": [1, {"b": 2.5}]}

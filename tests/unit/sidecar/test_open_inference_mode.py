"""The sidecar with ``--protocol openinference`` in front of a scripted model server of the Open
Inference Protocol (tests/support/oip_models.py): concurrent requests of different rows share
one infer call and each gets exactly its own rows back; requests that cannot share a call do
not; bad requests are 400 naming the tensor; a model answer that cannot be split is 502 for
the batch, a refused one is split to find the request at fault; a model whose metadata does not
fit keeps the sidecar unready, saying why; the client-facing /v2 paths answer in the protocol's
shapes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pytest_aiohttp import AiohttpServer

from tests.support.oip_models import POISON, SERVED, OIPModel, serve_oip_model
from tests.support.sidecar import RunningSidecar, StartSidecar, until_ready

INFER = "/v2/models/sentiment/infer"


async def start_pair(
    aiohttp_server: AiohttpServer,
    start_sidecar: StartSidecar,
    answer: str = "right",
    **settings: Any,
) -> tuple[OIPModel, RunningSidecar]:
    model = await serve_oip_model(aiohttp_server, answer=answer)
    sidecar = await start_sidecar(
        model.url,
        protocol="openinference",
        served_model_name=SERVED,
        **{"max_wait_ms": 200, "max_batch_size": 16, **settings},
    )
    await until_ready(sidecar.client)
    return model, sidecar


def rows_of(
    values: list[list[float]], request_id: str | None = None, **fields: Any
) -> dict[str, Any]:
    """An infer request whose input x holds ``values``, one row of two each."""
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [len(values), 2],
                "data": [v for row in values for v in row],
            }
        ],
        **fields,
    }
    if request_id is not None:
        body["id"] = request_id
    return body


async def infer(
    sidecar: RunningSidecar, body: dict[str, Any], path: str = INFER, **headers: str
) -> tuple[int, dict[str, Any]]:
    resp = await sidecar.client.post(path, json=body, headers=headers)
    answer: dict[str, Any] = await resp.json()
    return resp.status, answer


async def test_requests_of_different_rows_share_a_call_and_each_gets_its_own_rows(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar)
    bodies = [
        rows_of([[1, 2]], "one"),
        rows_of([[10, 20], [30, 40], [50, 60]], "three"),
        rows_of([[100, 200], [300, 400]]),
    ]
    answers = await asyncio.gather(*(infer(sidecar, body) for body in bodies))
    assert model.rows_sent() == [6]  # one call of the three requests' rows
    assert [status for status, _ in answers] == [200, 200, 200]
    first, second, third = (answer for _, answer in answers)
    assert first == {
        "model_name": "sentiment",
        "model_version": "v1",
        "id": "one",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [3.0]}],
    }
    assert second["id"] == "three"
    assert second["outputs"][0]["shape"] == [3]
    assert second["outputs"][0]["data"] == [30.0, 70.0, 110.0]
    assert "id" not in third
    assert third["outputs"][0]["data"] == [300.0, 700.0]
    assert sidecar.sample("modelroll_batch_size_sum") == 3  # one batch of three requests
    assert sidecar.sample("modelroll_requests_total", code="200") == 3


async def test_requests_that_differ_in_what_the_call_is_made_with_go_in_separate_calls(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar)
    text = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a b c"]}]}
    bodies = [
        rows_of([[1, 2]]),
        rows_of([[3, 4]], outputs=[{"name": "y"}]),
        text,
        rows_of([[5, 6]]),
    ]
    answers = await asyncio.gather(*(infer(sidecar, body) for body in bodies))
    assert [status for status, _ in answers] == [200] * 4
    assert sorted(model.rows_sent()) == [1, 1, 2]  # the first and last together
    assert [answer["outputs"][0]["data"] for _, answer in answers] == [[3.0], [7.0], [3.0], [11.0]]


async def test_a_request_of_more_rows_than_a_batch_is_served_whole(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar, max_batch_size=2)
    status, answer = await infer(sidecar, rows_of([[1, 1]] * 5))
    assert status == 200
    assert answer["outputs"][0]["data"] == [2.0] * 5
    assert model.rows_sent() == [5]


@pytest.mark.parametrize(
    ("body", "headers", "words"),
    [
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]},
            {},
            "input 'x' has 3 elements of data for its shape [2, 2]",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP8", "shape": [1, 2], "data": [1, 2]}]},
            {},
            "input 'x' has an unknown datatype 'FP8'",
        ),
        (
            {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]},
                    {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
                ]
            },
            {},
            "inputs 'x' and 'text' differ in their first (batch) dimension",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 2],
                        "data": [],
                        "parameters": {"binary_data_size": 8},
                    }
                ]
            },
            {},
            "input 'x' has binary_data_size",
        ),
        (rows_of([[1, 2]]), {"Inference-Header-Content-Length": "80"}, "binary tensor data"),
    ],
)
async def test_a_bad_request_is_400_naming_the_tensor_and_never_reaches_the_model(
    aiohttp_server: AiohttpServer,
    start_sidecar: StartSidecar,
    body: dict[str, Any],
    headers: dict[str, str],
    words: str,
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar)
    status, answer = await infer(sidecar, body, **headers)
    assert status == 400
    assert words in answer["error"]
    assert model.calls == []


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ("fewer_rows", "output 'y' has 2 rows (its first dimension) for the 3 rows sent"),
        ("unsplittable", "output 'y' has 2 elements of data for its shape [3]"),
        ("no_outputs", 'the answer has no "outputs"'),
        ("strings_in_fp32", "output 'y' is FP32: each element of its data must be a number"),
        ("no_y", "the model's answer has no output 'y', which was asked for"),
    ],
)
async def test_an_answer_that_cannot_be_split_back_is_502_for_the_batch_naming_the_output(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar, answer: str, words: str
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar, answer=answer)
    asked = [{"name": "y"}]
    bodies = [rows_of([[1, 2]], outputs=asked), rows_of([[3, 4], [5, 6]], outputs=asked)]
    answers = await asyncio.gather(*(infer(sidecar, body) for body in bodies))
    assert model.rows_sent() == [3]
    for status, body in answers:
        assert status == 502
        assert words in body["error"]


async def test_a_batch_the_model_refuses_is_split_and_only_the_culprit_fails(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar)
    bodies = [rows_of([[1, 2]], "a"), rows_of([[POISON, 0]], "bad"), rows_of([[3, 4], [5, 6]], "c")]
    answers = await asyncio.gather(*(infer(sidecar, body) for body in bodies))
    assert [status for status, _ in answers] == [200, 422, 200]
    assert answers[0][1]["outputs"][0]["data"] == [3.0]
    assert answers[2][1]["id"] == "c"
    assert answers[2][1]["outputs"][0]["data"] == [7.0, 11.0]
    assert model.rows_sent()[0] == 4


async def test_a_full_queue_is_429_with_retry_after_in_the_protocols_error_shape(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    _, sidecar = await start_pair(aiohttp_server, start_sidecar, max_queue_size=1, max_wait_ms=500)
    waiting = asyncio.ensure_future(infer(sidecar, rows_of([[1, 2]])))
    await asyncio.sleep(0.1)
    resp = await sidecar.client.post(INFER, json=rows_of([[3, 4]]))
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "1"
    assert "queue is full" in (await resp.json())["error"]
    assert (await waiting)[0] == 200


async def test_a_request_the_model_does_not_start_in_time_is_504(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar, max_wait_ms=0, timeout_ms=300)
    model.seconds = 1.0
    busy = asyncio.ensure_future(infer(sidecar, rows_of([[1, 2]])))
    await asyncio.sleep(0.1)
    status, answer = await infer(sidecar, rows_of([[3, 4]]))
    assert status == 504
    assert "deadline of 300ms passed" in answer["error"]
    assert (await busy)[0] == 200
    assert model.rows_sent() == [1]


async def test_the_client_facing_paths_name_this_version(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    _, sidecar = await start_pair(aiohttp_server, start_sidecar)
    client = sidecar.client
    metadata = await (await client.get("/v2/models/sentiment")).json()
    assert metadata["name"] == "sentiment"
    assert metadata["versions"] == ["v1"]
    assert metadata["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 2]}
    for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/sentiment/ready", "/v2"):
        assert (await client.get(path)).status == 200, path
    status, _ = await infer(sidecar, rows_of([[1, 2]]), "/v2/models/sentiment/versions/v1/infer")
    assert status == 200
    for path in ("/v2/models/other/infer", "/v2/models/sentiment/versions/v9/infer"):
        resp = await client.post(path, json=rows_of([[1, 2]]))
        assert resp.status == 404
        assert "unknown" in (await resp.json())["error"]
    assert (await client.post("/v1/infer", json={"payload": "x"})).status == 404


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({"name": "another"}, "names the model 'another', not 'served' (--served-model-name)"),
        (
            {"name": SERVED, "inputs": [{"name": "x", "datatype": "FP32", "shape": [4, 2]}]},
            "gives input 'x' the shape [4, 2], whose first dimension is not -1",
        ),
    ],
)
async def test_a_model_whose_metadata_does_not_fit_keeps_the_sidecar_unready_saying_why(
    aiohttp_server: AiohttpServer,
    start_sidecar: StartSidecar,
    metadata: dict[str, Any],
    words: str,
) -> None:
    model = await serve_oip_model(aiohttp_server, metadata=metadata)
    sidecar = await start_sidecar(model.url, protocol="openinference", served_model_name=SERVED)
    for _ in range(50):
        resp = await sidecar.client.get("/readyz")
        if words in (await resp.json())["error"]:
            break
        await asyncio.sleep(0.05)
    assert resp.status == 503
    assert words in (await resp.json())["error"]
    assert (await sidecar.client.get("/v2/health/ready")).status == 503
    model.metadata = {"name": SERVED}  # the server fixed: the next probe reads it again
    await until_ready(sidecar.client)


async def test_a_model_the_server_does_not_serve_yet_keeps_the_sidecar_unready(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model = await serve_oip_model(aiohttp_server)
    sidecar = await start_sidecar(model.url, protocol="openinference", served_model_name="absent")
    await asyncio.sleep(0.3)
    resp = await sidecar.client.get("/readyz")
    assert resp.status == 503
    assert "GET /v2/models/absent/ready answered HTTP 404" in (await resp.json())["error"]


async def test_draining_answers_the_queued_request_and_refuses_new_ones_with_503(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    model, sidecar = await start_pair(aiohttp_server, start_sidecar, max_wait_ms=5000)
    queued = asyncio.ensure_future(infer(sidecar, rows_of([[1, 2]], "queued")))
    await asyncio.sleep(0.1)
    draining = asyncio.ensure_future(sidecar.sidecar.shutdown())
    await asyncio.sleep(0)
    status, answer = await infer(sidecar, rows_of([[3, 4]]))
    assert status == 503
    assert "shutting down" in answer["error"]
    assert await queued == (
        200,
        {
            "model_name": "sentiment",
            "model_version": "v1",
            "id": "queued",
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [3.0]}],
        },
    )
    await draining
    assert model.rows_sent() == [1]
    assert (await sidecar.client.get("/v2/health/ready")).status == 503

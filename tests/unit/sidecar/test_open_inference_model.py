"""The model side of ``--protocol openinference`` without HTTP: a batch of requests is one infer
call, each input concatenated along its first dimension in the batch's order, and the answer is
split back so that each request gets exactly its own rows; an answer that cannot be split fails
the batch naming the output."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from modelroll_sidecar.open_inference import OpenInferenceModel
from modelroll_sidecar.protocol import ModelClient, ModelFailed, encode
from modelroll_sidecar.tensors import InferRequest, infer_request


@dataclass
class FakeClient:
    """Answers each call with output ``row``: the index of each row sent (``rows`` of them,
    unless told otherwise)."""

    rows: int | None = None
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def post(self, path: str, data: bytes) -> bytes:
        body = json.loads(data)
        self.sent.append((path, body))
        rows = body["inputs"][0]["shape"][0] if self.rows is None else self.rows
        output = {"name": "row", "datatype": "INT64", "shape": [rows, 1], "data": list(range(rows))}
        return encode({"model_name": "served", "outputs": [output]})


def request(rows: int, request_id: str) -> InferRequest:
    tensor = {"name": "x", "datatype": "INT32", "shape": [rows], "data": [rows] * rows}
    return infer_request({"id": request_id, "inputs": [tensor]})


def adapter(client: FakeClient) -> OpenInferenceModel:
    return OpenInferenceModel(cast(ModelClient, client), "served", "sentiment", "v2")


async def test_each_request_gets_exactly_its_own_rows_of_one_call() -> None:
    client = FakeClient()
    result = await adapter(client).infer([request(2, "a"), request(1, "b"), request(3, "c")])
    [(path, sent)] = client.sent
    assert path == "/v2/models/served/infer"
    assert sent["inputs"] == [
        {"name": "x", "datatype": "INT32", "shape": [6], "data": [2, 2, 1, 3, 3, 3]}
    ]
    assert [answer["id"] for answer in result.outputs] == ["a", "b", "c"]
    assert [answer["outputs"][0]["data"] for answer in result.outputs] == [[0, 1], [2], [3, 4, 5]]
    assert [answer["outputs"][0]["shape"] for answer in result.outputs] == [[2, 1], [1, 1], [3, 1]]
    assert result.outputs[0]["model_name"] == "sentiment"
    assert result.outputs[0]["model_version"] == "v2"


@pytest.mark.parametrize("answered", [5, 7])
async def test_an_answer_of_other_rows_than_sent_fails_the_batch(answered: int) -> None:
    with pytest.raises(ModelFailed, match=f"output 'row' has {answered} rows"):
        await adapter(FakeClient(rows=answered)).infer([request(2, "a"), request(4, "b")])

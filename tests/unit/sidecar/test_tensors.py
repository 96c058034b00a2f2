"""The Open Inference Protocol's tensors as the sidecar reads them (modelroll_sidecar.tensors):
what a request may hold, what it is refused for (naming the tensor, never its data), what lets
two requests share a model call, and a model's answer that cannot be split back."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_sidecar.tensors import BadTensor, infer_request, model_outputs

SECRET = "s3cr3t-payload"


def tensor(name: str = "x", shape: Any = None, datatype: str = "FP32", data: Any = None) -> Any:
    return {
        "name": name,
        "shape": [2, 2] if shape is None else shape,
        "datatype": datatype,
        "data": [1.0, 2.0, 3.0, 4.0] if data is None else data,
    }


def request(*inputs: Any, **fields: Any) -> dict[str, Any]:
    return {"inputs": list(inputs) or [tensor()], **fields}


def test_a_request_reads_its_rows_id_and_nested_data_flat() -> None:
    nested = tensor(data=[[1.0, 2.0], [3.0, 4.0]])
    texts = tensor("text", [2], "BYTES", ["a short one", "a somewhat longer text"])
    read = infer_request(request(nested, texts, id="r-1"))
    assert read.id == "r-1"
    assert read.rows == 2
    assert read.inputs[0].data == [1.0, 2.0, 3.0, 4.0]
    assert read.longest_text() == "a somewhat longer text"
    assert infer_request(request()).longest_text() is None  # numbers only: length 1


def test_requests_share_a_key_only_when_they_agree_on_all_but_their_rows_and_id() -> None:
    base = infer_request(request(id="a")).key
    assert infer_request(request(tensor(shape=[1, 2], data=[5, 6]), id="b")).key == base
    assert infer_request(request(tensor(shape=[2, 2], datatype="FP64"))).key != base
    assert infer_request(request(tensor(shape=[1, 4], data=[1, 2, 3, 4]))).key != base
    assert infer_request(request(tensor(name="z"))).key != base
    assert infer_request(request(outputs=[{"name": "y"}])).key != base
    assert infer_request(request(parameters={"content_type": "np"})).key != base


def test_a_request_for_binary_outputs_is_answered_in_json_and_shares_calls() -> None:
    base = infer_request(request()).key
    binary_outputs = request(parameters={"binary_data_output": True})
    assert infer_request(binary_outputs).key == base
    asked = infer_request(request(outputs=[{"name": "y", "parameters": {"binary_data": True}}]))
    assert asked.outputs == ({"name": "y"},)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (request(tensor(shape=[2, 3])), "'x' has 4 elements of data for its shape [2, 3]"),
        (request(tensor(datatype="FLOAT128")), "'x' has an unknown datatype 'FLOAT128'"),
        (request(tensor(shape=[2, -1])), "'x' must have a shape"),
        (request(tensor(shape=[])), "'x' must have a shape"),
        (request(tensor(data=[1.0, 2.0, 3.0, SECRET])), "'x' is FP32: each element"),
        (request(tensor(datatype="UINT8", data=[1, 2, 3, 256])), "'x' is UINT8"),
        (request(tensor(datatype="BOOL", data=[1, 0, 1, 0])), "'x' is BOOL"),
        (request(tensor(datatype="BYTES", data=[1, 2, 3, 4])), "'x' is BYTES"),
        (
            request(tensor(), tensor("mask", [3], "BOOL", [True, False, True])),
            "inputs 'x' and 'mask' differ in their first (batch) dimension, 2 and 3",
        ),
        (
            request({**tensor(), "parameters": {"binary_data_size": 16}}),
            "'x' has binary_data_size: the binary tensor data extension is not supported",
        ),
        (request(tensor(shape=[0, 2], data=[])), "'x' has no rows"),
        (request(tensor(), tensor()), "input 'x' is given twice"),
        (request(id=7), '"id" must be a string'),
        ({"inputs": []}, '"inputs" must be a non-empty list'),
        (request(outputs=[{"name": "y"}, {"name": "y"}]), "requested output 'y' is given twice"),
    ],
)
def test_a_bad_request_is_refused_naming_the_tensor_never_the_data(
    body: dict[str, Any], words: str
) -> None:
    with pytest.raises(BadTensor) as refused:
        infer_request(body)
    assert words in str(refused.value)
    assert SECRET not in str(refused.value)


def test_an_answer_of_other_rows_than_sent_or_short_data_cannot_be_split() -> None:
    answer = {"outputs": [tensor("y", [2], "FP32", [1.0, 2.0])]}
    assert model_outputs(answer, 2)[0].rows_of(1, 1) == {
        "name": "y",
        "datatype": "FP32",
        "shape": [1],
        "data": [2.0],
    }
    with pytest.raises(BadTensor, match=r"output 'y' has 2 rows .* for the 3 rows sent"):
        model_outputs(answer, 3)
    short = {"outputs": [tensor("y", [3], "FP32", [1.0, 2.0])]}
    with pytest.raises(BadTensor, match="output 'y' has 2 elements of data for its shape"):
        model_outputs(short, 3)
    with pytest.raises(BadTensor, match='no "outputs"'):
        model_outputs({"outputs": []}, 2)

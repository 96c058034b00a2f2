"""MLServer, the real Open Inference Protocol server of the tests, answers the official Triton
client with the predictions its scikit-learn models make themselves."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton

from modelroll_devcluster.mlserver import MLServer, samples


def client(server: MLServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=server.url.removeprefix("http://"))


def predict_digits(server: MLServer, pixels: np.ndarray) -> list[int]:
    tensor = triton.InferInput("pixels", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=False)  # MLServer reads JSON tensors only
    result = client(server).infer("digits", [tensor])
    return [int(digit) for digit in result.as_numpy("predict").ravel()]


@pytest.mark.parametrize("server_fixture", ["mlserver", "mlserver_batching"])
def test_digits_answers_the_forest_own_predictions(
    server_fixture: str, request: pytest.FixtureRequest
) -> None:
    server: MLServer = request.getfixturevalue(server_fixture)
    expected = samples(server.models, "digits")
    pixels = np.asarray(expected["inputs"], dtype=np.float32)
    assert predict_digits(server, pixels) == expected["predict"]
    assert predict_digits(server, pixels[:1]) == expected["predict"][:1]


def test_sentiment_takes_and_answers_bytes_tensors(mlserver: MLServer) -> None:
    expected = samples(mlserver.models, "sentiment")
    texts = np.asarray(expected["inputs"], dtype=np.object_).reshape(-1, 1)
    tensor = triton.InferInput("text", list(texts.shape), "BYTES")
    tensor.set_data_from_numpy(texts, binary_data=False)
    result = client(mlserver).infer("sentiment", [tensor])
    labels = result.as_numpy("predict").ravel().tolist()
    assert labels == expected["predict"]
    assert set(labels) == {"positive", "negative"}


def test_metadata_names_the_tensors(mlserver: MLServer) -> None:
    metadata = client(mlserver).get_model_metadata("digits")
    assert metadata["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert metadata["outputs"] == [{"name": "predict", "datatype": "INT64", "shape": [-1, 1]}]

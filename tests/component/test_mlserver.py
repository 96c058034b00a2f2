"""MLServer, the real Open Inference Protocol server of the tests, answers the official Triton
client with the predictions its scikit-learn models make themselves."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton

from modelroll_devcluster.mlserver import MLServer, samples
from tests.support.triton_clients import OpenClient, digits


def client(open_client: OpenClient, server: MLServer) -> triton.InferenceServerClient:
    return open_client(server.url.removeprefix("http://"))


def predict_digits(server: MLServer, pixels: np.ndarray) -> list[int]:
    return digits(server.url.removeprefix("http://"), "digits", pixels)  # JSON tensors


@pytest.mark.parametrize("server_fixture", ["mlserver", "mlserver_batching"])
def test_digits_answers_the_forest_own_predictions(
    server_fixture: str, request: pytest.FixtureRequest
) -> None:
    server: MLServer = request.getfixturevalue(server_fixture)
    expected = samples(server.models, "digits")
    pixels = np.asarray(expected["inputs"], dtype=np.float32)
    assert predict_digits(server, pixels) == expected["predict"]
    assert predict_digits(server, pixels[:1]) == expected["predict"][:1]


def test_sentiment_takes_and_answers_bytes_tensors(
    mlserver: MLServer, open_client: OpenClient
) -> None:
    expected = samples(mlserver.models, "sentiment")
    texts = np.asarray(expected["inputs"], dtype=np.object_).reshape(-1, 1)
    tensor = triton.InferInput("text", list(texts.shape), "BYTES")
    tensor.set_data_from_numpy(texts, binary_data=False)
    result = client(open_client, mlserver).infer("sentiment", [tensor])
    labels = result.as_numpy("predict").ravel().tolist()
    assert labels == expected["predict"]
    assert set(labels) == {"positive", "negative"}


def test_metadata_names_the_tensors(mlserver: MLServer, open_client: OpenClient) -> None:
    metadata = client(open_client, mlserver).get_model_metadata("digits")
    assert metadata["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert metadata["outputs"] == [{"name": "predict", "datatype": "INT64", "shape": [-1, 1]}]

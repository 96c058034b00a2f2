"""`modelroll-sidecar --protocol openinference` as a real process in front of a real MLServer
(the `mlserver` fixture: scikit-learn models it serves itself), called by the official Triton
HTTP client: the client's first calls (health, readiness, the model's metadata) answer under
the modelroll model's name; several clients at once, each sending requests of its own rows, get
exactly the answers MLServer gives them directly, numbers (the digits forest) and text (the
sentiment pipeline's BYTES tensors) alike, while the sidecar sends MLServer batches of several
requests."""

from __future__ import annotations

import numpy as np
import tritonclient.http as triton

from modelroll_devcluster.mlserver import MLServer, samples
from tests.support.mlserver import sidecar
from tests.support.processes import Spawn
from tests.support.triton_clients import (
    CLIENTS,
    ROUNDS,
    OpenClient,
    batch_sizes,
    digits,
    each_client,
)


def sentiment(url: str, model: str, texts: np.ndarray) -> list[str]:
    tensor = triton.InferInput("text", list(texts.shape), "BYTES")
    tensor.set_data_from_numpy(texts, binary_data=False)
    output = triton.InferRequestedOutput("predict", binary_data=False)
    with triton.InferenceServerClient(url=url) as client:
        result = client.infer(model, [tensor], outputs=[output])
    return [str(label) for label in result.as_numpy("predict").ravel()]


def test_clients_get_mlservers_own_digits_in_batches_across_clients(
    spawn: Spawn, mlserver: MLServer, open_client: OpenClient
) -> None:
    url = sidecar(spawn, mlserver, "handwriting", "digits")
    direct = mlserver.url.removeprefix("http://")
    client = open_client(url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("handwriting")
    metadata = client.get_model_metadata("handwriting")
    assert metadata["name"] == "handwriting"
    assert metadata["versions"] == ["v1"]
    assert metadata["inputs"] == open_client(direct).get_model_metadata("digits")["inputs"]
    pixels = np.asarray(samples(mlserver.models, "digits")["inputs"], dtype=np.float32)

    def rows(client: int, n: int) -> np.ndarray:
        start = (client * ROUNDS + n) % (len(pixels) - 3)
        return pixels[start : start + 1 + (client + n) % 3]  # 1 to 3 rows

    through = each_client(lambda c, n: digits(url, "handwriting", rows(c, n)))
    assert through == each_client(lambda c, n: digits(direct, "digits", rows(c, n)))
    batches, requests = batch_sizes(url)
    assert requests == CLIENTS * ROUNDS
    assert batches < requests  # some batch held requests of several clients


def test_clients_get_mlservers_own_sentiment_for_text_tensors(
    spawn: Spawn, mlserver: MLServer
) -> None:
    url = sidecar(spawn, mlserver, "reviews", "sentiment")
    direct = mlserver.url.removeprefix("http://")
    texts = np.asarray(samples(mlserver.models, "sentiment")["inputs"], dtype=np.object_)

    def rows(client: int, n: int) -> np.ndarray:
        start = (client + n) % len(texts)
        return texts[start : start + 1 + n % 2].reshape(-1, 1)

    through = each_client(lambda c, n: sentiment(url, "reviews", rows(c, n)))
    assert through == each_client(lambda c, n: sentiment(direct, "sentiment", rows(c, n)))
    assert {label for answers in through for labels in answers for label in labels} == {
        "positive",
        "negative",
    }
    batches, requests = batch_sizes(url)
    assert batches < requests

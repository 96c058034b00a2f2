"""KServe's own Python model server and REST client with modelroll, as real processes.

KServe's ``ModelServer`` serving the digits forest through a team's ``kserve.Model``
(models/kserve/digits.py) behind ``modelroll-sidecar --protocol openinference``: several official
Triton HTTP clients at once get through the sidecar exactly the digits KServe gives them
directly, in batches holding several clients' requests. And KServe's ``InferenceRESTClient``
(models/kserve/rest_client.py, in KServe's virtualenv) calling the gateway in front of a
sidecar, in front of MLServer or KServe's server, gets the model's own predictions under the
modelroll model, with its request's id, from the version the gateway routed it to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelroll_devcluster.kserve import KServe
from modelroll_devcluster.mlserver import samples
from tests.support.gateway import gateway_process, route
from tests.support.kserve import rest_infer
from tests.support.mlserver import ModelServer, sidecar
from tests.support.processes import Spawn
from tests.support.triton_clients import (
    CLIENTS,
    JSON,
    ROUNDS,
    OpenClient,
    batch_sizes,
    digits,
    each_client,
)


def test_triton_clients_get_kserves_own_digits_through_the_sidecar_in_batches(
    spawn: Spawn, kserve: KServe, open_client: OpenClient
) -> None:
    url = sidecar(spawn, kserve, "handwriting", kserve.name)
    direct = kserve.url.removeprefix("http://")
    client = open_client(url)
    assert client.is_server_ready()
    assert client.is_model_ready("handwriting")
    metadata = client.get_model_metadata("handwriting")
    assert metadata["name"] == "handwriting"
    assert metadata["inputs"] == open_client(direct).get_model_metadata(kserve.name)["inputs"]
    expected = samples(kserve.models, "digits")
    pixels = np.asarray(expected["inputs"], dtype=np.float32)
    assert digits(direct, kserve.name, pixels, JSON) == expected["predict"]

    def rows(client: int, n: int) -> np.ndarray:
        start = (client * ROUNDS + n) % (len(pixels) - 3)
        return pixels[start : start + 1 + (client + n) % 3]  # 1 to 3 rows

    through = each_client(lambda c, n: digits(url, "handwriting", rows(c, n)))
    assert through == each_client(lambda c, n: digits(direct, kserve.name, rows(c, n), JSON))
    batches, requests = batch_sizes(url)
    assert requests == CLIENTS * ROUNDS
    assert batches < requests  # some batch held requests of several clients


@pytest.mark.parametrize("server_fixture", ["mlserver", "kserve"])
def test_kserves_rest_client_gets_the_models_digits_through_the_gateway(
    server_fixture: str, spawn: Spawn, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: ModelServer = request.getfixturevalue(server_fixture)
    version = sidecar(spawn, server, "handwriting", "digits", "stable-v1")
    url, _ = gateway_process(
        spawn,
        tmp_path,
        {"handwriting": route("handwriting", ("stable-v1", 1, f"http://{version}"))},
    )
    expected = samples(request.getfixturevalue("mlserver_models"), "digits")
    for rows in (expected["inputs"], expected["inputs"][:1]):
        answer = rest_infer(url, "handwriting", rows)
        assert answer == {
            "model_name": "handwriting",
            "id": "kserve-client",
            "predict": expected["predict"][: len(rows)],
            "version": "stable-v1",
        }

"""The official Triton HTTP client pointed at `modelroll-gateway`, a real process, in front of a
real MLServer, directly or through sidecars (``--protocol openinference``): the same answers as
from MLServer directly, its first calls (health, readiness, metadata) answered, a pinned request
on the pinned version, every inference counted per version, and shadow copies compared by
tensor."""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families

from modelroll_devcluster.mlserver import MLServer, samples
from tests.support.gateway import gateway_process, route
from tests.support.mlserver import sidecar
from tests.support.processes import Spawn
from tests.support.triton_clients import OpenClient


def host(url: str) -> str:
    return url.removeprefix("http://")


def digits_input(pixels: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("pixels", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=False)  # MLServer reads JSON tensors only
    return tensor


def predict(answer: triton.InferResult) -> list[int]:
    return [int(digit) for digit in answer.as_numpy("predict").ravel()]


def scraped(admin: str, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The gateway's samples of ``name`` above 0, by the values of ``labels``."""
    with urllib.request.urlopen(f"{admin}/metrics", timeout=10) as resp:  # noqa: S310 (loopback)
        text = resp.read().decode()
    return {
        tuple(sample.labels[label] for label in labels): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.value
    }


def requests_counted(admin: str) -> dict[tuple[str, ...], float]:
    """The gateway's modelroll_gateway_requests_total by (model, version, routing, code)."""
    labels = ("model", "version", "routing", "code")
    return scraped(admin, "modelroll_gateway_requests_total", *labels)


@pytest.fixture
def gateway(spawn: Spawn, tmp_path: Path, mlserver: MLServer) -> tuple[str, str]:
    """A gateway routing MLServer's digits and sentiment models, each to the versions stable-v1
    (weight 1) and canary-v2 (weight 0), both MLServer itself."""
    versions = (("stable-v1", 1, mlserver.url), ("canary-v2", 0, mlserver.url))
    routes = {m: route(m, *versions) for m in ("digits", "sentiment")}
    return gateway_process(spawn, tmp_path, routes)


def test_the_triton_client_gets_mlservers_answers_through_the_gateway(
    gateway: tuple[str, str], mlserver: MLServer, open_client: OpenClient
) -> None:
    url, admin = gateway
    through, direct = open_client(host(url)), open_client(host(mlserver.url))

    assert through.is_server_live()
    assert through.is_server_ready()
    assert through.get_server_metadata()["name"] == "modelroll-gateway"
    assert through.is_model_ready("digits")
    assert not through.is_model_ready("no-such-model")
    assert through.get_model_metadata("digits") == direct.get_model_metadata("digits")

    expected = samples(mlserver.models, "digits")
    pixels = np.asarray(expected["inputs"], dtype=np.float32)
    answer = through.infer("digits", [digits_input(pixels)])
    assert predict(answer) == predict(direct.infer("digits", [digits_input(pixels)]))
    assert predict(answer) == expected["predict"]

    texts = np.asarray(samples(mlserver.models, "sentiment")["inputs"], dtype=np.object_)
    text = triton.InferInput("text", [len(texts), 1], "BYTES")
    text.set_data_from_numpy(texts.reshape(-1, 1), binary_data=False)
    labels = through.infer("sentiment", [text]).as_numpy("predict").ravel().tolist()
    assert labels == direct.infer("sentiment", [text]).as_numpy("predict").ravel().tolist()
    assert requests_counted(admin) == {
        ("digits", "stable-v1", "weight", "200"): 1,
        ("sentiment", "stable-v1", "weight", "200"): 1,
    }
    binary = triton.InferInput("pixels", [1, 64], "FP32")
    binary.set_data_from_numpy(pixels[:1])  # tritonclient's default: the binary extension
    with pytest.raises(triton.InferenceServerException, match=r"send tensors as JSON"):
        through.infer("digits", [binary])


def test_a_pinned_request_goes_to_the_pinned_version(
    gateway: tuple[str, str], open_client: OpenClient
) -> None:
    url, admin = gateway
    through = open_client(host(url))
    pixels = np.zeros((2, 64), dtype=np.float32)

    through.infer("digits", [digits_input(pixels)])
    through.infer("digits", [digits_input(pixels)], headers={"X-Modelroll-Version": "canary-v2"})
    through.infer("digits", [digits_input(pixels)], model_version="canary-v2")
    assert through.is_model_ready("digits", model_version="canary-v2")
    assert not through.is_model_ready("digits", model_version="no-such-version")
    assert requests_counted(admin) == {
        ("digits", "stable-v1", "weight", "200"): 1,
        ("digits", "canary-v2", "pin", "200"): 2,
    }
    with pytest.raises(triton.InferenceServerException, match="unknown version 'v9'"):
        through.infer("digits", [digits_input(pixels)], model_version="v9")


def test_through_sidecars_clients_get_mlservers_answers_and_a_shadow_agrees(
    spawn: Spawn, tmp_path: Path, mlserver: MLServer, open_client: OpenClient
) -> None:
    stable = sidecar(spawn, mlserver, "handwriting", "digits", "stable-v1")
    shadow = sidecar(spawn, mlserver, "handwriting", "digits", "shadow-v2")
    versions = [
        {"name": "stable-v1", "weight": 1, "endpoint": f"http://{stable}"},
        {"name": "shadow-v2", "weight": 0, "endpoint": f"http://{shadow}", "shadow": 100},
    ]
    url, admin = gateway_process(
        spawn, tmp_path, {"handwriting": {"model": "handwriting", "versions": versions}}
    )
    through, direct = open_client(host(url)), open_client(host(mlserver.url))
    metadata = through.get_model_metadata("handwriting")
    assert (metadata["name"], metadata["versions"]) == ("handwriting", ["stable-v1"])
    pixels = np.asarray(samples(mlserver.models, "digits")["inputs"], dtype=np.float32)

    def ask(n: int) -> tuple[str, list[int]]:
        # A client of its own per thread, closed in it: tritonclient's connections are gevent's.
        with triton.InferenceServerClient(url=host(url)) as asking:
            answer = asking.infer("handwriting", [digits_input(pixels[n : n + 1 + n % 3])])
        return answer.get_response()["model_version"], predict(answer)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(12)))
    for n, (version, digits) in enumerate(answers):
        assert version == "stable-v1"
        assert digits == predict(direct.infer("digits", [digits_input(pixels[n : n + 1 + n % 3])]))
    pinned = through.infer("handwriting", [digits_input(pixels[:2])], model_version="shadow-v2")
    assert pinned.get_response()["model_version"] == "shadow-v2"
    assert requests_counted(admin) == {
        ("handwriting", "stable-v1", "weight", "200"): 12,
        ("handwriting", "shadow-v2", "pin", "200"): 1,
    }
    # Each request the stable answered was copied to the shadow, and the same forest agreed.
    deadline = time.monotonic() + 20
    outcome = "modelroll_gateway_shadow_requests_total"
    while scraped(admin, outcome, "outcome") != {("compared",): 12}:
        assert time.monotonic() < deadline, scraped(admin, outcome, "outcome")
        time.sleep(0.1)
    agreement = "modelroll_gateway_shadow_agreement_sum"
    assert scraped(admin, agreement, "version", "primary") == {("shadow-v2", "stable-v1"): 12}

"""The official Triton HTTP client pointed at `modelroll-gateway`, a real process, in front of a
real MLServer: the same answers as from MLServer directly, its first calls (health, readiness,
metadata) answered, a pinned request on the pinned version, and every inference counted per
version."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families

from modelroll_devcluster.mlserver import MLServer, samples
from tests.support.gateway import route
from tests.support.processes import Spawn, free_port


def client(url: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=url.removeprefix("http://"))


def digits_input(pixels: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("pixels", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=False)  # MLServer reads JSON tensors only
    return tensor


def predict(answer: triton.InferResult) -> list[int]:
    return [int(digit) for digit in answer.as_numpy("predict").ravel()]


def requests_counted(admin: str) -> dict[tuple[str, str, str, str], float]:
    """The gateway's modelroll_gateway_requests_total by (model, version, routing, code), the
    counts above 0."""
    with urllib.request.urlopen(f"{admin}/metrics", timeout=10) as resp:  # noqa: S310 (loopback)
        text = resp.read().decode()
    counted: dict[tuple[str, str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "modelroll_gateway_requests_total" and sample.value:
                labels = sample.labels
                key = (labels["model"], labels["version"], labels["routing"], labels["code"])
                counted[key] = sample.value
    return counted


@pytest.fixture
def gateway(spawn: Spawn, tmp_path: Path, mlserver: MLServer) -> tuple[str, str]:
    """A gateway process routing MLServer's digits and sentiment models, each to the versions
    stable-v1 (weight 1) and canary-v2 (weight 0), both MLServer itself; it trusts loopback's
    pins. Its clients' URL and its admin URL."""
    port, admin = free_port(), free_port()
    routes = tmp_path / "routes.json"
    versions = (("stable-v1", 1, mlserver.url), ("canary-v2", 0, mlserver.url))
    routes.write_text(json.dumps({m: route(m, *versions) for m in ("digits", "sentiment")}))
    spawn(
        "modelroll-gateway",
        ready=f"http://127.0.0.1:{port}/v2/health/ready",
        env={
            "MODELROLL_PORT": str(port),
            "MODELROLL_ADMIN_PORT": str(admin),
            "MODELROLL_ROUTES_FILE": str(routes),
            "MODELROLL_TRUSTED_NETWORKS": "127.0.0.1/32",
        },
    )
    return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"


def test_the_triton_client_gets_mlservers_answers_through_the_gateway(
    gateway: tuple[str, str], mlserver: MLServer
) -> None:
    url, admin = gateway
    through, direct = client(url), client(mlserver.url)

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


def test_a_pinned_request_goes_to_the_pinned_version(gateway: tuple[str, str]) -> None:
    url, admin = gateway
    through = client(url)
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

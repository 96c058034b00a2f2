"""examples/open-inference/ exactly as a user applies it: MLServer serving a scikit-learn model
(the digits forest of models/mlserver/train.py) as two managed `protocol: OpenInference` versions
on the node, 90/10, from the image `make images` built. The official Triton client, pointed at
the gateway, gets the answers MLServer gives when called directly; concurrent clients' requests
share MLServer calls (the sidecar's batch metrics), each client getting its own rows back; the
weights split the traffic, the gateway counts it per version, and a weight patch on the canary
rolls it back.
"""

from __future__ import annotations

import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton

from modelroll_common import metric_names as names
from tests.support.incluster import InCluster
from tests.support.pods import gateway_weights, pods, ready_and_routed
from tests.support.stack import eventually, metric
from tests.support.triton_clients import OpenClient

pytestmark = pytest.mark.node

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "open-inference"
MODEL, STABLE, CANARY = "digits", "digits-stable", "digits-canary"
SERVED = "digits"
"""MLServer's name for the model (model-settings.json), the examples' servedModelName."""
MODEL_PORT, SIDECAR_PORT = 8080, 8000
"""The examples' spec.server.port (MLSERVER_HTTP_PORT), and the sidecar's port in the pod."""
CLIENTS, REQUESTS_EACH = 8, 16
"""Concurrent clients through the gateway, each sending this many single-row requests."""


def pixels(rows: np.ndarray[Any, Any]) -> triton.InferInput:
    """The input tensor in JSON: MLServer, like the sidecar, takes no binary tensor data."""
    tensor = triton.InferInput("pixels", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=False)
    return tensor


def predict() -> list[triton.InferRequestedOutput]:
    """The output asked for in JSON too (tritonclient asks for binary outputs by default)."""
    return [triton.InferRequestedOutput("predict", binary_data=False)]


def images(count: int, seed: int) -> np.ndarray[Any, Any]:
    """``count`` 8x8 images of values 0 to 16, as the model reads them."""
    return np.random.default_rng(seed).integers(0, 17, (count, 64)).astype(np.float32)


def digits(result: triton.InferResult) -> list[int]:
    found = result.as_numpy("predict")
    assert found is not None, result.get_response()
    return [int(d) for d in found.ravel()]


def one_client(url: str, sample: np.ndarray[Any, Any], first: int) -> list[tuple[int, Any]]:
    """A client of its own asking for the rows ``first``, ``first + CLIENTS``, ... of
    ``sample``, one row per request, one request after the other: (row, its result)."""
    with triton.InferenceServerClient(url) as client:  # closed in its own thread
        return [
            (row, client.infer(MODEL, [pixels(sample[row : row + 1])], outputs=predict()))
            for row in range(first, len(sample), CLIENTS)
        ]


def pod_ip(story: InCluster, version: str) -> str:
    (pod,) = pods(story, version)
    ip: str = pod["status"]["podIP"]
    return ip


def batch_sizes(story: InCluster, version: str) -> tuple[float, float]:
    """The version's sidecar: requests sent to the model in batches, and batches."""
    url = f"http://{pod_ip(story, version)}:{SIDECAR_PORT}/metrics"
    return metric(url, f"{names.BATCH_SIZE}_sum"), metric(url, f"{names.BATCH_SIZE}_count")


def answered_by_gateway(story: InCluster, version: str) -> float:
    """Requests the gateway counts as answered by ``version`` of the model."""
    url = f"{story.gateway_admin_url}/metrics"
    return metric(url, names.GATEWAY_REQUESTS, model=MODEL, version=version)


@pytest.mark.timeout(900)  # the session's node and chart come up first when it runs alone
def test_the_open_inference_examples_serve_tritonclient_through_the_gateway_batched(
    on_cluster: InCluster, open_client: OpenClient
) -> None:
    story = on_cluster
    gateway = urllib.parse.urlsplit(story.gateway_url).netloc
    try:
        story.kubectl("apply", "-f", str(EXAMPLES))
        pair = (STABLE, CANARY)
        eventually(lambda: ready_and_routed(story, pair), "both versions Ready and Routed", 420)
        eventually(lambda: gateway_weights(story, MODEL) == {STABLE: 90, CANARY: 10}, "90/10", 60)

        # What MLServer answers when called directly, in one call of many rows.
        sample = images(CLIENTS * REQUESTS_EACH, seed=0)
        direct = open_client(f"{pod_ip(story, STABLE)}:{MODEL_PORT}")
        expected = digits(direct.infer(SERVED, [pixels(sample)], outputs=predict()))
        assert set(expected) <= set(range(10))
        assert len(set(expected)) > 1, "the model answers every image alike"

        # The client's first calls, then the same rows through the gateway, pinned to each version.
        client = open_client(gateway)
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready(MODEL)
        metadata = client.get_model_metadata(MODEL)
        assert [i["name"] for i in metadata["inputs"]] == ["pixels"], metadata
        for version in pair:
            pin = {"X-Modelroll-Version": version}
            pinned = client.infer(MODEL, [pixels(sample[:32])], outputs=predict(), headers=pin)
            assert digits(pinned) == expected[:32], version
            response = pinned.get_response()
            assert (response["model_name"], response["model_version"]) == (MODEL, version)

        # Concurrent clients, one row per request, routed by weight: each gets its own row's
        # digit, and the stable's sidecar sends MLServer fewer calls than requests. (Threads,
        # each with a client: one client's async_infer sends its requests one after the other.)
        before = {v: batch_sizes(story, v) for v in pair}
        counted_before = {v: answered_by_gateway(story, v) for v in pair}
        with ThreadPoolExecutor(CLIENTS) as pool:
            parts = pool.map(lambda first: one_client(gateway, sample, first), range(CLIENTS))
            answers = [answer for part in parts for answer in part]
        assert sorted(row for row, _ in answers) == list(range(len(sample)))
        by_version: dict[str, int] = {}
        for row, result in answers:
            assert digits(result) == [expected[row]], row
            version = result.get_response()["model_version"]
            by_version[version] = by_version.get(version, 0) + 1
        assert set(by_version) == set(pair), by_version
        assert by_version[STABLE] > by_version[CANARY], by_version
        after = {v: batch_sizes(story, v) for v in pair}
        sent, batches = (after[STABLE][i] - before[STABLE][i] for i in (0, 1))
        assert sent >= by_version[STABLE], (before, after)
        assert batches < sent, f"{sent:g} requests in {batches:g} batches: none shared a call"
        for version in pair:  # the gateway's per-version counts, which a canary analysis reads
            counted = answered_by_gateway(story, version) - counted_before[version]
            assert counted == by_version[version], (version, counted, by_version)

        # Rollback: a weight patch on the canary; every request goes to the stable again.
        story.kubectl("patch", "mv", CANARY, "--type=merge", "-p", '{"spec":{"weight":0}}')
        eventually(lambda: gateway_weights(story, MODEL) == {STABLE: 90, CANARY: 0}, "90/0", 60)
        for row in range(20):
            result = client.infer(MODEL, [pixels(sample[row : row + 1])], outputs=predict())
            assert digits(result) == [expected[row]], row
            assert result.get_response()["model_version"] == STABLE
    finally:
        story.kubectl(
            "delete", "-f", str(EXAMPLES), "--ignore-not-found", "--timeout=120s", check=False
        )

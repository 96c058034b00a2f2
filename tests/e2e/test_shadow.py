"""Shadow traffic on real models: the sentence encoder's int8 ONNX export serves, its fp32
weights shadow it, and the gateway reports how far their vectors agree, while every client is
answered by the int8 version."""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml

from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.stack import Stack, VersionSpec
from tests.e2e.conftest import StartLocal, eventually, gateway_metric

pytestmark = pytest.mark.e2e

MODEL = "sentiment"
INT8, FP32 = "int8-v1", "fp32-v2"
REVIEWS = [f"review {i}: the film was {'good' if i % 2 else 'slow'} and long" for i in range(40)]


def infer(stack: Stack, text: str) -> tuple[str, list[float]]:
    request = urllib.request.Request(  # noqa: S310 (http to the gateway)
        f"{stack.gateway_url}/v1/models/{MODEL}/infer",
        data=json.dumps({"payload": text}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 (loopback)
        body = json.load(resp)
        return resp.headers["X-Modelroll-Version"], body["output"]


def test_the_fp32_encoder_shadowing_the_int8_one_reports_their_agreement(
    local_stacks: StartLocal, figures: Figures
) -> None:
    stack = local_stacks(
        [
            VersionSpec(INT8, 1, engine="encoder", variant="int8"),
            VersionSpec(FP32, 0, engine="encoder", variant="fp32"),
        ]
    )
    shadow = stack.manifest(FP32)
    shadow["spec"]["shadow"] = {"percent": 100}
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([stack.manifest(INT8), shadow]))

    def shadowed() -> bool:
        model = stack.routes().get(MODEL) or {"versions": []}
        return {v["name"]: v.get("shadow") for v in model["versions"]} == {INT8: None, FP32: 100}

    eventually(shadowed, "the gateway copying to the fp32 version", 30)
    answered = [infer(stack, text) for text in REVIEWS]
    assert {version for version, _ in answered} == {INT8}
    assert all(len(vector) == 384 for _, vector in answered)

    labels = {"model": MODEL, "version": FP32}
    copies = "modelroll_gateway_shadow_requests_total"
    eventually(
        lambda: gateway_metric(stack, copies, outcome="compared", **labels) == len(REVIEWS),
        "every copy compared",
        30,
    )
    assert gateway_metric(stack, copies, **labels) == len(REVIEWS)  # none failed or dropped
    agreement = "modelroll_gateway_shadow_agreement"
    count = gateway_metric(stack, f"{agreement}_count", primary=INT8, **labels)
    mean = gateway_metric(stack, f"{agreement}_sum", primary=INT8, **labels) / count
    at_least_099 = gateway_metric(stack, f"{agreement}_bucket", le="0.99", primary=INT8, **labels)
    # Quantization moves the vectors a little: close, not equal.
    assert 0.98 < mean < 1.0, mean
    figures.add(
        "shadow: all-MiniLM-L6-v2 fp32 shadowing int8, cosine agreement",
        f"mean {mean:.4f} over {count:.0f} copies; {count - at_least_099:.0f} above 0.99",
    )

"""Shadow traffic on real models: the sentence encoder's fp32 weights serve, its int8 ONNX
export shadows them, and the gateway reports how far their vectors agree, while every client is
answered by the fp32 version. A canary analysis with a shadow gate lets the int8 version on to
its first step on that agreement, and rolls back a version whose answers are of another kind
(the demo model's labels) before it ever has live traffic."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.stack import Stack, VersionSpec
from tests.support.stack import (
    StartLocal,
    analysis_of,
    canary_manifest,
    eventually,
    gateway_metric,
    wait_condition_of,
)

pytestmark = pytest.mark.e2e

MODEL = "sentiment"
FP32, INT8, DEMO = "fp32-v1", "int8-v2", "demo-v3"
GATE = {
    "steps": [{"weight": 50}],
    "intervalSeconds": 1,
    "warmupSeconds": 1,
    "shadow": {"minAgreement": 0.99, "minCopies": 30},
}
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


def test_the_int8_encoder_shadowing_the_fp32_one_reports_their_agreement(
    local_stacks: StartLocal, figures: Figures
) -> None:
    stack = local_stacks(
        [
            VersionSpec(FP32, 1, engine="encoder", variant="fp32"),
            VersionSpec(INT8, 0, engine="encoder", variant="int8"),
        ]
    )
    shadow = stack.manifest(INT8)
    shadow["spec"]["shadow"] = {"percent": 100}
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([stack.manifest(FP32), shadow]))

    def shadowed() -> bool:
        model = stack.routes().get(MODEL) or {"versions": []}
        return {v["name"]: v.get("shadow") for v in model["versions"]} == {FP32: None, INT8: 100}

    eventually(shadowed, "the gateway copying to the int8 version", 30)
    answered = [infer(stack, text) for text in REVIEWS]
    assert {version for version, _ in answered} == {FP32}
    assert all(len(vector) == 384 for _, vector in answered)

    labels = {"model": MODEL, "version": INT8}
    copies = "modelroll_gateway_shadow_requests_total"
    eventually(
        lambda: gateway_metric(stack, copies, outcome="compared", **labels) == len(REVIEWS),
        "every copy compared",
        30,
    )
    assert gateway_metric(stack, copies, **labels) == len(REVIEWS)  # none failed or dropped
    agreement = "modelroll_gateway_shadow_agreement"
    count = gateway_metric(stack, f"{agreement}_count", primary=FP32, **labels)
    mean = gateway_metric(stack, f"{agreement}_sum", primary=FP32, **labels) / count
    at_least_099 = gateway_metric(stack, f"{agreement}_bucket", le="0.99", primary=FP32, **labels)
    # Quantization moves the vectors a little: close, not equal.
    assert 0.98 < mean < 1.0, mean
    figures.add(
        "shadow: all-MiniLM-L6-v2 int8 shadowing fp32, cosine agreement",
        f"mean {mean:.4f} over {count:.0f} copies; {count - at_least_099:.0f} above 0.99",
    )


@contextlib.contextmanager
def reviews_sent(stack: Stack) -> Iterator[list[str]]:
    """Reviews sent to the gateway one after another until the block ends; the versions that
    answered, in order."""
    answered: list[str] = []
    stop = threading.Event()

    def send() -> None:
        i = 0
        while not stop.is_set():
            answered.append(infer(stack, REVIEWS[i % len(REVIEWS)])[0])
            i += 1

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield answered
    finally:
        stop.set()
        thread.join(30)


def shadow_canary(stack: Stack, name: str) -> str:
    """The version's ModelVersion at weight 0, shadowing every request, analysed with a gate."""
    manifest = yaml.safe_load(canary_manifest(stack, name, GATE))
    manifest["spec"]["shadow"] = {"percent": 100}
    return str(yaml.safe_dump(manifest))


def weights(stack: Stack) -> dict[str, int]:
    model = stack.routes().get(MODEL) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def test_a_shadow_gate_lets_the_agreeing_int8_encoder_on_to_its_first_step(
    local_stacks: StartLocal,
) -> None:
    stack = local_stacks(
        [
            VersionSpec(FP32, 1, engine="encoder", variant="fp32"),
            VersionSpec(INT8, 0, engine="encoder", variant="int8"),
        ]
    )
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(stack.manifest(FP32)))
    eventually(lambda: weights(stack) == {FP32: 1}, "the gateway routing fp32-v1", 30)
    with reviews_sent(stack):
        stack.kubectl("apply", "-f", "-", input=shadow_canary(stack, INT8))
        eventually(lambda: weights(stack).get(INT8) == 50, "the int8 version at step 1", 60)
    state = analysis_of(stack, INT8)
    assert not state["shadowing"]
    assert state["step"] == 1
    events = stack.kubectl("get", "events", "--field-selector", f"involvedObject.name={INT8}")
    assert "shadow copies agree with fp32-v1's 0.99" in events.stdout, events.stdout


def test_a_shadow_gate_rolls_back_a_version_whose_answers_disagree_before_live_traffic(
    local_stacks: StartLocal,
) -> None:
    stack = local_stacks(
        [VersionSpec(FP32, 1, engine="encoder", variant="fp32"), VersionSpec(DEMO, 0)]
    )
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(stack.manifest(FP32)))
    eventually(lambda: weights(stack) == {FP32: 1}, "the gateway routing fp32-v1", 30)
    with reviews_sent(stack) as answered:
        stack.kubectl("apply", "-f", "-", input=shadow_canary(stack, DEMO))
        wait_condition_of(stack, DEMO, "RolledBack", 60)
    state = analysis_of(stack, DEMO)
    assert state["reason"] == "ShadowDisagrees", state
    assert "below 0.99" in state["message"]
    assert set(answered) == {FP32}  # no client was ever answered by it
    assert weights(stack)[DEMO] == 0
    shown = stack.plugin("analysis", "status", DEMO).stdout
    assert "RolledBack (ShadowDisagrees)" in shown, shown
    assert "compared, mean agreement 0.0000" in shown, shown

"""examples/encoder/ exactly as a user applies it: a real model, all-MiniLM-L6-v2, as two managed
versions on the node (fp32 weights at 90, the int8 ONNX export at 10), each behind its batching
sidecar, from the encoder image `make images` built. Through the gateway, each version answers
a sentence with its vector; the two versions agree, the vectors mean something (a paraphrase is
nearer than an unrelated sentence), and the canary's promote comment moves the traffic.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path

import pytest

from tests.support.incluster import InCluster
from tests.support.pods import gateway_weights, kubectl_modelroll, ready_and_routed
from tests.support.stack import eventually

pytestmark = pytest.mark.node

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "encoder"
MODEL, FP32, INT8 = "minilm", "minilm-fp32", "minilm-int8"
SENTENCE = "A man is playing a guitar on the stage."
PARAPHRASE = "Someone performs music with a guitar at a concert."
UNRELATED = "The quarterly tax forms are due at the end of April."


def vector(story: InCluster, text: str, version: str) -> list[float]:
    """The sentence's vector from ``version``, pinned with the header a client may send."""
    request = urllib.request.Request(  # noqa: S310 (http to the gateway)
        f"{story.gateway_url}/v1/models/{MODEL}/infer",
        data=json.dumps({"payload": text}).encode(),
        headers={"Content-Type": "application/json", "X-Modelroll-Version": version},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310
        answer = json.loads(resp.read())
    assert answer["version"] == version, answer.get("version")
    output: list[float] = answer["output"]
    return output


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.hypot(*a) / math.hypot(*b)


@pytest.mark.timeout(480)
def test_the_encoder_examples_serve_real_vectors_that_agree_and_promote(
    on_cluster: InCluster,
) -> None:
    story = on_cluster
    try:
        story.kubectl("apply", "-f", str(EXAMPLES))
        pair = (FP32, INT8)
        eventually(lambda: ready_and_routed(story, pair), "both versions Ready and Routed", 300)
        eventually(lambda: gateway_weights(story, MODEL) == {FP32: 90, INT8: 10}, "90/10", 60)
        vectors = {v: vector(story, SENTENCE, v) for v in pair}
        for version, found in vectors.items():
            assert len(found) == 384, version
            assert math.isclose(math.hypot(*found), 1.0, rel_tol=1e-3), version
        agreement = cosine(vectors[FP32], vectors[INT8])
        assert agreement > 0.99, f"fp32 and int8 disagree: cosine {agreement:.4f}"
        for version in pair:
            near = cosine(vectors[version], vector(story, PARAPHRASE, version))
            far = cosine(vectors[version], vector(story, UNRELATED, version))
            assert near > far + 0.2, (version, near, far)

        promoted = kubectl_modelroll(story, "promote", INT8)
        assert promoted.returncode == 0, promoted.stderr
        eventually(lambda: gateway_weights(story, MODEL) == {FP32: 0, INT8: 100}, "all int8", 30)
        back = kubectl_modelroll(story, "rollback", INT8)
        assert back.returncode == 0, back.stderr
        eventually(lambda: gateway_weights(story, MODEL) == {FP32: 90, INT8: 10}, "90/10 again", 30)
    finally:
        story.kubectl(
            "delete", "-f", str(EXAMPLES), "--ignore-not-found", "--timeout=120s", check=False
        )

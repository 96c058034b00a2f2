"""The chat story on the real node: examples/llm/ exactly as a user applies it (the demo LLM
engine from the image `make images` built, behind a ``--protocol openai`` sidecar in each pod),
streamed through the gateway's Service under load. Prometheus, discovering the sidecar pods with
the chart's PodMonitor selector, shows the canary's slower first token; the rollback patch from
the canary's comment moves new streams to the stable, and no stream is lost on the way.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from modelroll_devcluster.chat import ChatLoad, ChatStream, stream_chat
from tests.support.incluster import InCluster
from tests.support.pods import gateway_weights, ready_and_routed
from tests.support.stack import eventually

pytestmark = pytest.mark.node

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "llm"
MODEL = "chat"
STABLE, CANARY = "chat-stable", "chat-canary"
ROLLBACK = """kubectl -n models patch mv chat-canary --type=merge -p '{"spec":{"weight":0}}'"""


def answers(story: InCluster, version: str) -> bool:
    """A stream pinned to ``version`` completes through the gateway."""

    async def one() -> ChatStream:
        async with aiohttp.ClientSession() as session:
            return await stream_chat(session, story.gateway_url, MODEL, max_tokens=4, pin=version)

    stream = asyncio.run(one())
    return stream.complete and stream.version == version


def ttft_p50(story: InCluster) -> dict[str, float] | None:
    """Each chat version's p50 time to first token, as the dashboard's panel computes it."""
    found = story.prometheus_api().by_label(
        "histogram_quantile(0.5, sum by (version, le) "
        f'(rate(modelroll_llm_time_to_first_token_seconds_bucket{{model="{MODEL}"}}[1m])))'
    )
    return found if found.keys() >= {STABLE, CANARY} else None


@pytest.mark.timeout(480)
def test_the_chat_examples_stream_on_the_node_show_ttft_per_version_and_roll_back(
    story: InCluster,
) -> None:
    comment = (EXAMPLES / f"{CANARY}.yaml").read_text()
    assert f"#   {ROLLBACK}\n" in comment
    try:
        story.kubectl("apply", "-f", str(EXAMPLES))
        eventually(
            lambda: ready_and_routed(story, (STABLE, CANARY)),
            "both chat versions Ready and Routed",
            300,
        )
        eventually(lambda: gateway_weights(story, MODEL) == {STABLE: 90, CANARY: 10}, "90/10", 60)
        # Both versions' Deployments run the sidecar in OpenAI mode in front of the engine.
        for name in (STABLE, CANARY):
            pod = story.cluster.kubectl_json("get", "deployment", name, namespace=story.namespace)
            containers = {c["name"]: c for c in pod["spec"]["template"]["spec"]["containers"]}
            assert "--protocol=openai" in containers["sidecar"]["args"], containers["sidecar"]
        # Ready and Routed come from the API; the Service's rules on the node follow a moment
        # later: a client sees each version answer (pinned) before the load starts.
        for name in (STABLE, CANARY):
            eventually(functools.partial(answers, story, name), f"{name} answering", 30)
        with ChatLoad(story.gateway_url, MODEL, concurrency=8, max_tokens=24) as load:
            started = time.monotonic()
            before = load.wait_for(300, started, timeout=120)
            assert {s.version for s in before} == {STABLE, CANARY}
            seen = eventually(lambda: ttft_p50(story), "both versions' TTFT in Prometheus", 90)
            assert seen[CANARY] > 1.5 * seen[STABLE], seen
            # The canary's comment, as written (in the story's namespace).
            patch = json.loads(ROLLBACK.split("-p ", 1)[1].strip("'"))
            story.kubectl("patch", "mv", CANARY, "--type=merge", "-p", json.dumps(patch))
            eventually(lambda: gateway_weights(story, MODEL) == {STABLE: 90, CANARY: 0}, "90/0", 30)
            rolled_back = time.monotonic()
            after = load.wait_for(100, rolled_back, timeout=60)
        streams = load.records[:]
        lost = [s for s in streams if not s.complete]
        assert lost == [], f"{len(lost)} of {len(streams)} streams lost: {lost[:3]}"
        assert Counter(s.version for s in after) == {STABLE: len(after)}
        # The canary's pods stay up, warm, after the rollback.
        canary: dict[str, Any] = story.cluster.kubectl_json(
            "get", "mv", CANARY, namespace=story.namespace
        )
        assert canary["status"].get("readyReplicas") == 1, canary["status"]
    finally:
        story.kubectl(
            "delete", "-f", str(EXAMPLES), "--ignore-not-found", "--timeout=120s", check=False
        )

"""examples/chat/ exactly as a user applies it: a real chat LLM, SmolLM2-135M-Instruct on
llama.cpp's llama-server (the image modelroll-llama that `make images` built), as two managed
OpenAI versions on the node, each behind a ``--protocol openai`` sidecar: one slot
(smollm2-serial, 90) against continuous batching over four (smollm2-continuous, 10). With the
official ``openai`` client through the gateway's Service, each version, pinned, streams a chat
completion token by token and its usage; three streams at once run together on the continuous
version and one after the other on the serial one; the canary's promote comment sends every new
stream to it, and its rollback comment restores 90/10.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from modelroll_common.routes import VERSION_HEADER
from modelroll_devcluster.llama import GENERATE_ALL
from tests.support.incluster import InCluster
from tests.support.pods import gateway_weights, kubectl_modelroll, ready_and_routed
from tests.support.stack import eventually

pytestmark = pytest.mark.node

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "chat"
MODEL, SERIAL, CONTINUOUS = "smollm2", "smollm2-serial", "smollm2-continuous"


@dataclass
class Streamed:
    """One streamed chat completion as the client saw it (``time.monotonic()`` seconds)."""

    version: str
    """The X-Modelroll-Version header of the answer."""
    model: str
    text: str
    chunks: int
    """Chunks that carried text."""
    first_token: float
    last_token: float
    usage: openai.types.CompletionUsage | None


def client_of(story: InCluster) -> openai.OpenAI:
    """The official client, pointed at the gateway's Service; no retries."""
    return openai.OpenAI(
        base_url=f"{story.gateway_url}/v1", api_key="unused", max_retries=0, timeout=60.0
    )


def stream_chat(
    client: openai.OpenAI, prompt: str, max_tokens: int, pin: str | None = None
) -> Streamed:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.0,
        extra_body=GENERATE_ALL,
        extra_headers={VERSION_HEADER: pin} if pin else None,
    )
    model, text, chunks, first, last, usage = "", "", 0, 0.0, 0.0, None
    for chunk in raw.parse():
        model = chunk.model or model
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
                chunks += 1
                last = time.monotonic()
                first = first or last
        usage = chunk.usage or usage
    return Streamed(raw.headers.get(VERSION_HEADER, ""), model, text, chunks, first, last, usage)


def timeline(streams: list[Streamed]) -> list[tuple[float, float]]:
    """Each stream's first and last token, in seconds after the earliest first token, in the
    streams' order."""
    start = min(s.first_token for s in streams)
    return [(round(s.first_token - start, 3), round(s.last_token - start, 3)) for s in streams]


def answers(client: openai.OpenAI, version: str) -> bool:
    """A short stream pinned to ``version`` completes through the gateway."""
    try:
        return stream_chat(client, "Hi", 1, pin=version).version == version
    except openai.APIError:  # 502 until the node's Service rules reach the new pods
        return False


def three_at_once(client: openai.OpenAI, version: str, max_tokens: int) -> list[Streamed]:
    """Three streams pinned to ``version``, sent together, ordered by their first token."""
    prompts = ("Name a planet.", "Name a colour.", "Name a river.")
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(stream_chat, client, p, max_tokens, version) for p in prompts]
        streams = [f.result() for f in futures]
    return sorted(streams, key=lambda s: s.first_token)


@pytest.mark.timeout(300)
def test_the_chat_examples_stream_a_real_llm_batch_continuously_and_promote(
    story: InCluster,
) -> None:
    client = client_of(story)
    pair = (SERIAL, CONTINUOUS)
    try:
        story.kubectl("apply", "-f", str(EXAMPLES))
        eventually(lambda: ready_and_routed(story, pair), "both versions Ready and Routed", 180)
        eventually(
            lambda: gateway_weights(story, MODEL) == {SERIAL: 90, CONTINUOUS: 10}, "90/10", 60
        )
        # Ready and Routed come from the API; the Service's rules on the node follow a moment
        # later: a client sees each version answer before the checks start.
        for name in pair:
            eventually(functools.partial(answers, client, name), f"{name} answering", 30)

        max_tokens = 24
        for version in pair:
            seen = stream_chat(client, "What is a lighthouse?", max_tokens, pin=version)
            assert seen.version == version, seen
            assert seen.model == MODEL, seen
            assert any(c.isalpha() for c in seen.text), seen
            # Streamed as generated: a chunk per token, not the answer in one piece.
            assert seen.chunks >= max_tokens - 2, seen
            assert seen.usage is not None, f"{version}: no usage chunk"
            assert seen.usage.completion_tokens == max_tokens, seen.usage
            assert seen.usage.prompt_tokens > 5, seen.usage

        # What the rollout changes: on four slots three streams sent at once are generated
        # together (each has its first token before any has its last); on one slot they queue,
        # and the last to start starts after the first has ended.
        together = three_at_once(client, CONTINUOUS, 64)
        assert {s.version for s in together} == {CONTINUOUS}, together
        spans = timeline(together)
        assert max(first for first, _ in spans) < min(last for _, last in spans), spans
        queued = three_at_once(client, SERIAL, 64)
        assert {s.version for s in queued} == {SERIAL}, queued
        spans = timeline(queued)
        assert spans[-1][0] > spans[0][1], spans

        # The canary's comments, as written (in the story's namespace).
        comment = (EXAMPLES / f"{CONTINUOUS}.yaml").read_text()
        for command in ("promote", "rollback"):
            assert f"#   kubectl modelroll -n models {command} {CONTINUOUS}\n" in comment
        promoted = kubectl_modelroll(story, "promote", CONTINUOUS)
        assert promoted.returncode == 0, promoted.stderr
        eventually(
            lambda: gateway_weights(story, MODEL) == {SERIAL: 0, CONTINUOUS: 100},
            "all continuous",
            30,
        )
        unpinned = [stream_chat(client, "Say hello.", 4) for _ in range(3)]
        assert [s.version for s in unpinned] == [CONTINUOUS] * 3, unpinned
        # The serial version, at 0, stays up and warm for a rollback: pinned, it still answers.
        assert stream_chat(client, "Say hello.", 4, pin=SERIAL).version == SERIAL
        back = kubectl_modelroll(story, "rollback", CONTINUOUS)
        assert back.returncode == 0, back.stderr
        eventually(
            lambda: gateway_weights(story, MODEL) == {SERIAL: 90, CONTINUOUS: 10}, "90/10 again", 30
        )
    finally:
        story.kubectl(
            "delete", "-f", str(EXAMPLES), "--ignore-not-found", "--timeout=120s", check=False
        )

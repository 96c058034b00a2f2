"""Chat versions on a real engine, end to end: llama.cpp's llama-server with SmolLM2-135M-Instruct
(modelroll_devcluster.llama; ``make llama-server llm-model``) behind a ``--protocol openai``
sidecar, with the local control plane, the operator and the gateway. Clients are the official
``openai`` client, through the gateway. The tests check what the client sees, what the engine
did (llama-server's own ``/metrics``, its ``llamacpp:`` series), and what the gateway and the
sidecar counted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import yaml

from modelroll_common.routes import VERSION_HEADER
from modelroll_devcluster.llama import GENERATE_ALL, llama_metrics
from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.stack import Stack, VersionSpec
from tests.support.stack import (
    StartLocal,
    analysis_of,
    canary_manifest,
    eventually,
    gateway_metric,
    metric,
    wait_condition_of,
)

pytestmark = pytest.mark.e2e

MODEL = "chat"
STABLE, CANARY = "chat-stable", "chat-canary"


def llama(name: str, weight: int, **options: Any) -> VersionSpec:
    return VersionSpec(name, weight, protocol="openai", model=MODEL, engine="llama", **options)


def client_of(stack: Stack) -> openai.OpenAI:
    """The official client, pointed at the gateway; no retries, so each call is one request."""
    return openai.OpenAI(
        base_url=f"{stack.gateway_url}/v1", api_key="unused", max_retries=0, timeout=30.0
    )


def routed(stack: Stack, *names: str) -> None:
    """Apply the versions' ModelVersions as a user would, and wait until the gateway routes them."""
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([stack.manifest(n) for n in names]))
    expected = {n: stack.versions[n].spec.weight for n in names}
    eventually(lambda: weights(stack) == expected, f"the gateway routing {expected}", 30)


def weights(stack: Stack) -> dict[str, int]:
    model = stack.routes().get(MODEL) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def sidecar_metric(stack: Stack, name: str, sample: str, **labels: str) -> float:
    return metric(f"{stack.versions[name].sidecar_url}/metrics", sample, version=name, **labels)


def engine(stack: Stack, name: str) -> dict[str, float]:
    return llama_metrics(stack.versions[name].model_url)


def warm_up(stack: Stack, name: str) -> None:
    """One short completion straight to the version's engine (not through the gateway or the
    sidecar, whose counters stay at 0): a fresh llama-server's first prompt costs many times what
    later ones do (its compute buffers and threads start cold)."""
    url = f"{stack.versions[name].model_url}/v1"
    direct = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30.0)
    direct.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
    )


@dataclass
class Streamed:
    """One streamed chat completion as the client saw it (``time.monotonic()`` seconds)."""

    version: str
    sent: float
    first_token: float | None
    ended: float
    chunks: int
    """Chunks that carried text."""
    finish_reason: str | None
    usage: openai.types.CompletionUsage | None


def stream_completion(client: openai.OpenAI, prompt: str, max_tokens: int) -> Streamed:
    sent = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.0,
        seed=7,
        extra_body=GENERATE_ALL,
    )
    first_token, chunks, finish_reason, usage = None, 0, None, None
    for chunk in raw.parse():
        for choice in chunk.choices:
            if choice.delta.content:
                chunks += 1
                first_token = first_token or time.monotonic()
            finish_reason = choice.finish_reason or finish_reason
        usage = chunk.usage or usage
    version = raw.headers.get(VERSION_HEADER, "")
    return Streamed(version, sent, first_token, time.monotonic(), chunks, finish_reason, usage)


def test_a_real_model_streams_its_tokens_through_gateway_and_sidecar(
    local_stacks: StartLocal, figures: Figures
) -> None:
    stack = local_stacks([llama(STABLE, 100)])
    routed(stack, STABLE)
    warm_up(stack, STABLE)
    predicted_before = engine(stack, STABLE)["tokens_predicted_total"]
    max_tokens = 96

    seen = stream_completion(client_of(stack), "Tell me a story about a lighthouse.", max_tokens)
    assert seen.version == STABLE
    assert seen.finish_reason == "length", seen
    assert seen.usage is not None, "no usage chunk"
    assert seen.usage.completion_tokens == max_tokens, seen.usage
    assert seen.usage.prompt_tokens > 5, seen.usage
    assert seen.chunks >= max_tokens - 2, seen
    assert seen.first_token is not None
    ttft, streamed_for = seen.first_token - seen.sent, seen.ended - seen.first_token
    # The first token came in the first third of the stream: the rest was still being generated.
    assert streamed_for > 2 * ttft, (ttft, streamed_for)
    assert engine(stack, STABLE)["tokens_predicted_total"] - predicted_before == max_tokens

    labels = {"model": MODEL, "version": STABLE}

    def counted() -> bool:
        return gateway_metric(stack, "modelroll_gateway_llm_requests_total", **labels) == 1

    eventually(counted, "the gateway counting the stream", 5)
    # It ended with data: [DONE] at both hops: outcome "completed" at the gateway and the sidecar.
    completed = {"outcome": "completed"}
    assert gateway_metric(stack, "modelroll_gateway_llm_requests_total", **labels, **completed) == 1
    assert sidecar_metric(stack, STABLE, "modelroll_llm_requests_total", **completed) == 1
    ttft_name = "modelroll_gateway_llm_time_to_first_token_seconds"
    assert gateway_metric(stack, f"{ttft_name}_count", **labels) == 1
    assert 0 < gateway_metric(stack, f"{ttft_name}_sum", **labels) < streamed_for
    sidecar_ttft = "modelroll_llm_time_to_first_token_seconds"
    sidecar_tpot = "modelroll_llm_time_per_output_token_seconds"
    assert sidecar_metric(stack, STABLE, f"{sidecar_ttft}_count") == 1
    assert sidecar_metric(stack, STABLE, f"{sidecar_tpot}_count") == 1
    tpot = sidecar_metric(stack, STABLE, f"{sidecar_tpot}_sum")
    assert 0.001 < tpot < streamed_for / 10, tpot
    assert sidecar_metric(stack, STABLE, "modelroll_llm_output_tokens_total") == max_tokens
    prompt_tokens = sidecar_metric(stack, STABLE, "modelroll_llm_prompt_tokens_total")
    assert prompt_tokens == seen.usage.prompt_tokens
    figures.add("SmolLM2-135M first token through gateway and sidecar", f"{ttft * 1000:.0f} ms")
    figures.add("SmolLM2-135M time per output token (sidecar)", f"{tpot * 1000:.1f} ms")


def test_a_client_that_leaves_mid_stream_stops_the_real_engine(local_stacks: StartLocal) -> None:
    stack = local_stacks([llama(STABLE, 100)])
    routed(stack, STABLE)
    client = client_of(stack)

    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from one to one thousand."}],
        max_tokens=2000,
        stream=True,
        temperature=0.0,
        seed=7,
        extra_body=GENERATE_ALL,
    )
    chunks = 0
    for chunk in stream:
        chunks += sum(1 for c in chunk.choices if c.delta.content)
        if chunks >= 5:
            break
    assert engine(stack, STABLE)["requests_processing"] == 1, "the engine was not generating"
    stream.close()  # the client goes away, 1995 tokens short
    left = time.monotonic()

    def stopped() -> dict[str, float] | None:
        now = engine(stack, STABLE)
        return now if now["requests_processing"] == 0 else None

    at_stop = eventually(stopped, "the engine to stop generating", 5)
    stopped_in = time.monotonic() - left
    time.sleep(1.0)
    later = engine(stack, STABLE)
    assert later["n_decode_total"] == at_stop["n_decode_total"], "the engine went on decoding"
    # The slot was released early: what it generated is flushed into the counter then.
    assert 5 <= later["tokens_predicted_total"] < 200, later

    labels = {"model": MODEL, "version": STABLE, "outcome": "client_disconnect"}

    def counted() -> bool:
        return gateway_metric(stack, "modelroll_gateway_llm_requests_total", **labels) == 1

    eventually(counted, "the gateway counting a client_disconnect", 5)
    assert gateway_metric(stack, "modelroll_gateway_llm_requests_total", outcome="completed") == 0
    assert stopped_in < 5


LONG_PROMPT = "Summarize this: " + " ".join(f"item {i}," for i in range(80))
"""About 450 tokens with the chat template: within a context of 2048, beyond llama-server's
smallest (it rounds ``-c`` up to a multiple of 256)."""


class OpenAILoad:
    """``concurrency`` threads, each sending streamed completions of LONG_PROMPT through the
    gateway with the official client, one after the other, until the block ends. ``records``:
    (version, HTTP status) per request, 200 only for a stream read to its normal end."""

    def __init__(self, stack: Stack, concurrency: int, max_tokens: int) -> None:
        self.client = client_of(stack)
        self.max_tokens = max_tokens
        self.records: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(concurrency)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                seen = stream_completion(self.client, LONG_PROMPT, self.max_tokens)
                record = (seen.version, 200 if seen.finish_reason == "length" else 0)
            except openai.APIStatusError as err:
                record = (err.response.headers.get(VERSION_HEADER, ""), err.status_code)
            except openai.APIError:
                record = ("", 0)
            self.records.append(record)

    def __enter__(self) -> OpenAILoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@pytest.fixture
def two_versions(local_stacks: StartLocal) -> Stack:
    """A stable with a normal context and a canary whose engine runs with ``-c 64``."""
    stack = local_stacks([llama(STABLE, 100, context=2048), llama(CANARY, 0, context=64)])
    routed(stack, STABLE)
    return stack


def test_a_canary_whose_real_engine_refuses_the_prompts_is_rolled_back(
    two_versions: Stack, figures: Figures
) -> None:
    """The canary's engine has too small a context for the prompts the baseline serves: it
    refuses each with 400 (exceed_context_size_error). The analysis, told that 400 counts as an
    error for this model, rolls it back by itself; the baseline fails none."""
    stack = two_versions
    steps = {"steps": [{"weight": 50}], "intervalSeconds": 1, "warmupSeconds": 2}
    checks = {"errors": {"codes": ["5xx", "400", "422", "429"]}}
    analysis = {**steps, "minSeconds": 4, "minRequests": 10, "checks": checks}
    started = time.monotonic()
    with OpenAILoad(stack, concurrency=3, max_tokens=4) as load:
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, CANARY, analysis))
        wait_condition_of(stack, CANARY, "RolledBack", 45)
    rolled_back_in = time.monotonic() - started
    state = analysis_of(stack, CANARY)
    assert state["reason"] in {"CanaryWorse", "GuardrailBreached"}, state
    on_canary = [status for version, status in load.records if version == CANARY]
    on_stable = [status for version, status in load.records if version == STABLE]
    assert on_canary, "the canary answered no request"
    assert set(on_canary) == {400}, load.records
    assert on_stable, "the stable answered no request"
    assert set(on_stable) == {200}, load.records
    assert engine(stack, CANARY)["tokens_predicted_total"] == 0
    eventually(lambda: weights(stack) == {STABLE: 100, CANARY: 0}, "the rollback's routes", 5)
    figures.add("real-engine canary (-c 64) rolled back after", f"{rolled_back_in:.1f} s")
    figures.add("requests: stable / canary", f"{len(on_stable)} / {len(on_canary)}")

"""Chat-LLM versions end to end, on real processes: the local control plane and operator, the
gateway watching its ConfigMap, and per version ``modelroll-demo-llm`` (continuous batching)
behind a ``--protocol openai`` sidecar. Clients stream chat completions through the gateway as
an OpenAI client does; the tests check what such a client, and the engine, would see: when the
first token came, whether every stream ended with ``data: [DONE]``, which version answered, and
what the engine generated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import yaml

from modelroll_devcluster.chat import (
    CHAT_PATH,
    ChatLoad,
    ChatStream,
    chat_body,
    stream_chat,
    ttft_percentile,
)
from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.stack import Stack, VersionSpec
from tests.support.stack import (
    StartLocal,
    analysis_of,
    canary_manifest,
    eventually,
    wait_condition_of,
)

pytestmark = pytest.mark.e2e

MODEL = "chat"
STABLE, CANARY = "chat-stable", "chat-canary"
LONG = ("--output-mu=9", "--output-sigma=0.1")
"""Engine flags for outputs far longer than any test's ``max_tokens``: every stream generates
exactly ``max_tokens`` tokens."""


def chat(name: str, weight: int, **options: Any) -> VersionSpec:
    return VersionSpec(name, weight, protocol="openai", model=MODEL, **options)


def routed(stack: Stack, *names: str) -> None:
    """Apply the versions' ModelVersions as a user would, and wait until the gateway routes them."""
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([stack.manifest(n) for n in names]))
    expected = {n: stack.versions[n].spec.weight for n in names}
    eventually(lambda: weights(stack) == expected, f"the gateway routing {expected}", 30)


def weights(stack: Stack) -> dict[str, int]:
    model = stack.routes().get(MODEL) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def engine_stats(stack: Stack, name: str) -> dict[str, Any]:
    url = f"{stack.versions[name].model_url}/v1/stats"
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback)
        stats: dict[str, Any] = json.load(resp)
    return stats


def running(stack: Stack, count: int, names: tuple[str, ...]) -> None:
    """Wait until the versions' engines generate ``count`` sequences at once."""

    def now() -> int:
        return sum(engine_stats(stack, n)["running"] for n in names)

    eventually(lambda: now() >= count, f"{count} streams running", 30)


def lost(streams: list[ChatStream]) -> list[ChatStream]:
    return [s for s in streams if not s.complete]


@contextlib.asynccontextmanager
async def opened(
    url: str, count: int, max_tokens: int
) -> AsyncIterator[list[asyncio.Task[ChatStream]]]:
    """``count`` streams started at once, each a task that ends with its stream; await them
    before leaving the block."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        yield [
            asyncio.create_task(
                stream_chat(session, url, MODEL, prompt=f"question {i}", max_tokens=max_tokens)
            )
            for i in range(count)
        ]


def at_once(url: str, count: int, max_tokens: int) -> list[ChatStream]:
    """``count`` streams started at once, read to their ends."""

    async def run() -> list[ChatStream]:
        async with opened(url, count, max_tokens) as tasks:
            return await asyncio.gather(*tasks)

    return asyncio.run(run())


def test_the_first_token_reaches_the_client_while_the_engine_is_still_generating(
    local_stacks: StartLocal, figures: Figures
) -> None:
    stack = local_stacks([chat(STABLE, 100, engine_args=LONG)])
    routed(stack, STABLE)

    async def scenario() -> tuple[ChatStream, dict[str, Any]]:
        first = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(
                stream_chat(
                    session, stack.gateway_url, MODEL, max_tokens=120, on_first_token=first.set
                )
            )
            await asyncio.wait_for(first.wait(), 10)
            at_first_token = await asyncio.to_thread(engine_stats, stack, STABLE)
            return await task, at_first_token

    stream, at_first_token = asyncio.run(scenario())
    assert stream.complete, stream
    assert (stream.version, stream.tokens) == (STABLE, 120)
    # When the client had its first token, the engine was still generating this sequence.
    assert at_first_token["running"] == 1, at_first_token
    assert at_first_token["sequences"] == 0, at_first_token
    assert stream.ttft is not None
    assert stream.first_token is not None
    streamed_for = stream.ended - stream.first_token
    assert streamed_for > 10 * stream.ttft, (stream.ttft, streamed_for)
    figures.add("first token through gateway and sidecar", f"{stream.ttft * 1000:.1f} ms")
    figures.add("last of 120 tokens", f"{(stream.ended - stream.sent) * 1000:.0f} ms")


def test_a_rollback_during_hundreds_of_open_streams_cuts_none_and_moves_new_ones(
    local_stacks: StartLocal, figures: Figures
) -> None:
    """200 streams open across both versions; the canary's weight is patched to 0 while they
    stream. Every one of them ends with [DONE] on the version it started on; streams opened
    after the gateway saw the patch go to the stable alone."""
    engine = (*LONG, "--max-seqs=128")
    stack = local_stacks(
        [
            chat(STABLE, 50, engine_args=engine, max_in_flight=512),
            chat(CANARY, 50, engine_args=engine, max_in_flight=512),
        ]
    )
    routed(stack, STABLE, CANARY)
    max_tokens = 100

    async def scenario() -> tuple[list[ChatStream], list[ChatStream], float]:
        async with opened(stack.gateway_url, 200, max_tokens) as tasks:
            await asyncio.to_thread(running, stack, 150, (STABLE, CANARY))
            patched = time.monotonic()
            await asyncio.to_thread(
                stack.kubectl, "patch", "mv", CANARY, "--type=merge", "-p", '{"spec":{"weight":0}}'
            )
            await asyncio.to_thread(
                eventually, lambda: weights(stack).get(CANARY) == 0, "the gateway's rollback", 10
            )
            rolled_back_in = time.monotonic() - patched
            new = await asyncio.to_thread(at_once, stack.gateway_url, 40, 8)
            return await asyncio.gather(*tasks), new, rolled_back_in

    before, new, rolled_back_in = asyncio.run(scenario())
    assert lost(before) == [], f"{len(lost(before))} of 200 streams cut: {lost(before)[:3]}"
    assert {s.tokens for s in before} == {max_tokens}
    on = Counter(s.version for s in before)
    assert min(on[STABLE], on[CANARY]) > 0, on
    # Each engine generated every stream its version answered, to the end, and no other.
    for name in (STABLE, CANARY):
        stats = engine_stats(stack, name)
        assert stats["sequences"] == on[name] + (len(new) if name == STABLE else 0), stats
        assert stats["cancelled"] == 0, stats
    assert lost(new) == []
    assert Counter(s.version for s in new) == {STABLE: len(new)}
    figures.add("streams open during the rollback", f"{len(before)} ({dict(on)})")
    figures.add("rollback patch to gateway routing", f"{rolled_back_in * 1000:.0f} ms")


def test_a_client_that_goes_away_stops_generation_in_the_engine(local_stacks: StartLocal) -> None:
    stack = local_stacks([chat(STABLE, 100, engine_args=LONG)])
    routed(stack, STABLE)

    async def scenario() -> ChatStream:
        async with aiohttp.ClientSession() as session:
            return await stream_chat(
                session, stack.gateway_url, MODEL, max_tokens=2000, stop_after_tokens=3
            )

    left = asyncio.run(scenario())
    assert left.tokens >= 3
    assert not left.done

    def stopped() -> dict[str, Any] | None:
        stats = engine_stats(stack, STABLE)
        return stats if stats["running"] == 0 and stats["waiting"] == 0 else None

    stats = eventually(stopped, "the engine to stop generating", 2.0)
    assert stats["cancelled"] == 1, stats
    assert stats["sequences"] == 0, stats
    assert stats["tokens"] < 50, f"the engine went on generating: {stats}"


def test_a_client_that_leaves_while_queued_is_dropped_before_the_engine_spends_on_it(
    local_stacks: StartLocal,
) -> None:
    """The engine takes one sequence at a time; a second stream, its headers already through the
    gateway, waits in the engine's queue, and its client leaves. The gateway and the sidecar
    close their connections at once, so the engine drops it from the queue and never generates
    a token for it."""
    stack = local_stacks([chat(STABLE, 100, engine_args=(*LONG, "--max-seqs=1"))])
    routed(stack, STABLE)

    def queue_empty_and_one_cancelled() -> dict[str, Any] | None:
        stats = engine_stats(stack, STABLE)
        return stats if (stats["waiting"], stats["cancelled"]) == (0, 1) else None

    async def scenario() -> tuple[ChatStream, dict[str, Any], dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(
                stream_chat(session, stack.gateway_url, MODEL, max_tokens=80)
            )
            await asyncio.to_thread(running, stack, 1, (STABLE,))
            body = chat_body(MODEL, "a question nobody waits for", 80)
            async with session.post(stack.gateway_url + CHAT_PATH, json=body) as resp:
                assert resp.status == 200
                queued = await asyncio.to_thread(engine_stats, stack, STABLE)
                resp.close()  # the client goes away before its first token
            dropped = await asyncio.to_thread(
                eventually, queue_empty_and_one_cancelled, "the queued stream dropped", 2.0
            )
            return await first, queued, dropped

    first, queued, dropped = asyncio.run(scenario())
    assert (queued["running"], queued["waiting"]) == (1, 1), queued
    assert dropped["running"] == 1, "dropped only after the running stream ended"
    assert first.complete
    stats = engine_stats(stack, STABLE)
    assert (stats["sequences"], stats["tokens"], stats["cancelled"]) == (1, 80, 1), stats


def test_sigterm_to_the_sidecar_lets_every_open_stream_finish(local_stacks: StartLocal) -> None:
    stack = local_stacks([chat(STABLE, 100, engine_args=LONG)])
    routed(stack, STABLE)
    sidecar = stack.versions[STABLE].sidecar
    assert sidecar.process is not None

    async def scenario() -> list[ChatStream]:
        async with opened(stack.versions[STABLE].sidecar_url, 30, 80) as tasks:
            await asyncio.to_thread(running, stack, 30, (STABLE,))
            sidecar.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            return await asyncio.gather(*tasks)

    streams = asyncio.run(scenario())
    assert lost(streams) == [], f"{len(lost(streams))} of 30 streams cut: {lost(streams)[:3]}"
    assert {s.tokens for s in streams} == {80}
    assert sidecar.process.wait(30) == 0, "the sidecar did not exit cleanly after draining"


def test_a_full_in_flight_bound_refuses_with_429_and_loses_no_accepted_stream(
    local_stacks: StartLocal,
) -> None:
    stack = local_stacks([chat(STABLE, 100, engine_args=LONG, max_in_flight=8)])
    routed(stack, STABLE)

    streams = at_once(stack.gateway_url, 20, 60)
    assert Counter(s.status for s in streams) == {200: 8, 429: 12}
    accepted = [s for s in streams if s.status == 200]
    assert lost(accepted) == []
    assert {s.tokens for s in accepted} == {60}
    for refused in (s for s in streams if s.status == 429):
        assert refused.retry_after == "1"
        assert json.loads(refused.error)["error"]["type"] == "rate_limit_error"
        assert "8 requests are in flight" in refused.error


def test_an_engine_that_fails_mid_stream_ends_each_stream_with_an_error_event(
    local_stacks: StartLocal,
) -> None:
    stack = local_stacks([chat(STABLE, 100, engine_args=LONG, error_rate=1.0)])
    routed(stack, STABLE)

    streams = at_once(stack.gateway_url, 10, 400)
    for stream in streams:
        assert stream.status == 200, stream
        assert not stream.done, stream
        assert stream.error.startswith("the model server's stream broke off after"), stream
        assert stream.tokens < 400
    assert engine_stats(stack, STABLE)["failed"] == 10


def test_a_chat_canary_whose_engine_breaks_every_stream_is_rolled_back(
    local_stacks: StartLocal,
) -> None:
    """Every canary stream starts with a 200 and ends in an error event: the analysis judges
    what the clients saw, not the status line."""
    stack = local_stacks(
        [chat(STABLE, 100, engine_args=LONG), chat(CANARY, 0, engine_args=LONG, error_rate=1.0)]
    )
    routed(stack, STABLE)
    steps = {"steps": [{"weight": 50}], "intervalSeconds": 1, "warmupSeconds": 2}
    analysis = {**steps, "minSeconds": 4, "minRequests": 20}
    with ChatLoad(stack.gateway_url, MODEL, concurrency=4, max_tokens=24) as load:
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, CANARY, analysis))
        wait_condition_of(stack, CANARY, "RolledBack", 60)
    state = analysis_of(stack, CANARY)
    assert state["reason"] == "CanaryWorse", state
    errors = next(c for c in state["checks"] if c["name"] == "errors")
    assert errors["verdict"] == "Fail"
    assert errors["canary"]["bad"] > 0
    broken = [s for s in load.records if s.version == CANARY]
    assert broken, "the canary answered no stream"
    assert all(s.status == 200 and not s.done for s in broken), broken[:3]
    assert all(s.done for s in load.records if s.version == STABLE)
    eventually(lambda: weights(stack) == {STABLE: 100, CANARY: 0}, "the rollback's routes", 5)


def test_a_chat_canary_slower_to_its_first_token_is_rolled_back_on_that_check(
    local_stacks: StartLocal, figures: Figures
) -> None:
    """The canary's engine takes 3 ms per prompt token before its first token (the stable's
    0.02 ms) and decodes as fast: no stream fails in either version, and the time to first
    token check alone rolls it back."""
    stack = local_stacks(
        [
            chat(STABLE, 100, engine_args=LONG),
            chat(CANARY, 0, engine_args=(*LONG, "--prefill-ms-per-token=3")),
        ]
    )
    routed(stack, STABLE)
    steps = {"steps": [{"weight": 50}], "intervalSeconds": 1, "warmupSeconds": 2}
    checks: dict[str, Any] = {"errors": {}, "timeToFirstToken": {}}
    analysis = {**steps, "minSeconds": 30, "minRequests": 20, "checks": checks}
    with ChatLoad(stack.gateway_url, MODEL, concurrency=4, max_tokens=24) as load:
        applied = time.monotonic()
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, CANARY, analysis))
        wait_condition_of(stack, CANARY, "RolledBack", 60)
        took = time.monotonic() - applied
    state = analysis_of(stack, CANARY)
    assert state["reason"] == "CanaryWorse", state
    verdicts = {c["name"]: c["verdict"] for c in state["checks"]}
    assert verdicts == {"errors": "Pass", "timeToFirstToken": "Fail"}, state["checks"]
    ttft = next(c for c in state["checks"] if c["name"] == "timeToFirstToken")
    assert ttft["canary"]["bad"] > ttft["baseline"]["bad"], ttft
    assert lost(load.records[:]) == []
    assert {s.version for s in load.records} == {STABLE, CANARY}
    eventually(lambda: weights(stack) == {STABLE: 100, CANARY: 0}, "the rollback's routes", 5)
    figures.add(
        "analysis: canary's first token later, rolled back on timeToFirstToken after",
        f"{took:.1f} s (errors check: Pass)",
    )


def test_the_chat_story_a_slow_canary_shows_in_prometheus_and_is_rolled_back(
    local_stacks: StartLocal, figures: Figures
) -> None:
    """Stable and canary chat versions at 50/50 under streaming load; the canary's engine takes
    five times as long per iteration. Prometheus shows the canary's time to first token above the
    stable's, from the sidecars and from the gateway; the rollback patch moves new streams to the
    stable and cuts none."""
    stack = local_stacks(
        [chat(STABLE, 50, step_ms=8.0), chat(CANARY, 50, step_ms=40.0)], prometheus=True
    )
    routed(stack, STABLE, CANARY)
    prometheus = stack.prometheus_api()
    with ChatLoad(stack.gateway_url, MODEL, concurrency=8, max_tokens=24) as load:
        started = time.monotonic()
        load.wait_for(200, started, timeout=60)

        def p50_by_version(metric: str) -> dict[str, float] | None:
            found = prometheus.by_label(
                f"histogram_quantile(0.5, sum by (version, le) (rate({metric}_bucket[30s])))"
            )
            return found if found.keys() >= {STABLE, CANARY} else None

        sidecar_p50 = eventually(
            lambda: p50_by_version("modelroll_llm_time_to_first_token_seconds"),
            "both versions' TTFT in Prometheus",
            30,
        )
        gateway_p50 = eventually(
            lambda: p50_by_version("modelroll_gateway_llm_time_to_first_token_seconds"),
            "the gateway's TTFT per version in Prometheus",
            30,
        )
        for seen in (sidecar_p50, gateway_p50):
            assert seen[CANARY] > 2 * seen[STABLE], seen
        before = load.since(started)

        stack.kubectl("patch", "mv", CANARY, "--type=merge", "-p", '{"spec":{"weight":0}}')
        eventually(lambda: weights(stack).get(CANARY) == 0, "the gateway's rollback", 10)
        rolled_back = time.monotonic()
        after = load.wait_for(100, rolled_back, timeout=60)
    streams = load.records[:]
    assert lost(streams) == [], f"{len(lost(streams))} streams lost: {lost(streams)[:3]}"
    assert Counter(s.version for s in after) == {STABLE: len(after)}
    assert {s.version for s in before} == {STABLE, CANARY}
    client = {
        v: ttft_percentile([s for s in before if s.version == v], 50) for v in (STABLE, CANARY)
    }
    for name, seen in (("sidecars", sidecar_p50), ("gateway", gateway_p50), ("clients", client)):
        figures.add(
            f"TTFT p50 stable / canary ({name})",
            f"{seen[STABLE] * 1000:.1f} / {seen[CANARY] * 1000:.1f} ms",
        )
    figures.add("chat streams, none lost", str(len(streams)))


def test_concurrent_embeddings_through_the_gateway_share_engine_calls_and_keep_their_vectors(
    local_stacks: StartLocal,
) -> None:
    """30 clients embed their own texts at once: the sidecar sends them to the engine in fewer
    calls than requests, and every client gets exactly the vectors the engine gives its texts
    alone, in its order."""
    stack = local_stacks([chat(STABLE, 100)])
    routed(stack, STABLE)
    texts = [[f"review {i} part {j}" for j in range(1 + i % 3)] for i in range(30)]

    async def embed(session: aiohttp.ClientSession, url: str, given: list[str]) -> Any:
        async with session.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": given}) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def scenario() -> tuple[list[Any], list[Any]]:
        async with aiohttp.ClientSession() as session:
            together = await asyncio.gather(*(embed(session, stack.gateway_url, t) for t in texts))
            calls = len(engine_stats(stack, STABLE)["embedding_calls"])
            engine = stack.versions[STABLE].model_url
            alone = [await embed(session, engine, [t]) for given in texts for t in given]
            assert len(engine_stats(stack, STABLE)["embedding_calls"]) == calls + len(alone)
            return together, alone

    together, alone = asyncio.run(scenario())
    calls = engine_stats(stack, STABLE)["embedding_calls"][: -len(alone)]
    assert sum(calls) == sum(len(t) for t in texts)
    assert len(calls) < len(texts) / 2, f"barely batched: {calls}"
    vectors = iter(a["data"][0]["embedding"] for a in alone)
    for given, answer in zip(texts, together, strict=True):
        assert [d["index"] for d in answer["data"]] == list(range(len(given)))
        assert [d["embedding"] for d in answer["data"]] == [next(vectors) for _ in given]

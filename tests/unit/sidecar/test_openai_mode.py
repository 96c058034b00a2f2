"""The sidecar in ``--protocol openai`` mode, in front of the demo LLM engine, both
served on loopback: streams pass through as they are generated, the in-flight bound, a broken
engine stream, a client that goes away, draining, and embeddings batched across requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pytest_aiohttp import AiohttpServer

from modelroll_standins.engine import Engine
from modelroll_standins.llm import ENGINE, STATS_EMBED, DemoLLMConfig, create_demo_llm_app
from tests.support.sidecar import RunningSidecar, StartSidecar


@dataclass
class RunningLLM:
    server: TestServer

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def engine(self) -> Engine:
        return self.server.app[ENGINE]

    @property
    def embedding_calls(self) -> list[int]:
        return self.server.app[STATS_EMBED]


StartLLM = Callable[..., Awaitable[RunningLLM]]


@pytest.fixture
def start_llm(aiohttp_server: AiohttpServer) -> StartLLM:
    async def start(**settings: Any) -> RunningLLM:
        server = await aiohttp_server(create_demo_llm_app(DemoLLMConfig(**settings)))
        return RunningLLM(server)

    return start


async def openai_sidecar(start_sidecar: StartSidecar, llm: RunningLLM, **settings: Any) -> Any:
    sidecar = await start_sidecar(llm.url, protocol="openai", **settings)
    for _ in range(100):  # the readiness probe finds the engine's /health
        if sidecar.sidecar.model_ready:
            break
        await asyncio.sleep(0.02)
    return sidecar


def chat(text: str, *, stream: bool = True, max_tokens: int = 20) -> dict[str, Any]:
    return {
        "model": "demo-llm",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": True},
    }


async def events(resp: aiohttp.ClientResponse) -> list[dict[str, Any] | str]:
    """Every SSE event's data, parsed (``"[DONE]"`` as the string)."""
    found: list[dict[str, Any] | str] = []
    async for line in resp.content:
        text = line.decode().strip()
        if text.startswith("data: "):
            data = text[len("data: ") :]
            found.append(data if data == "[DONE]" else json.loads(data))
    return found


def content(found: list[dict[str, Any] | str]) -> str:
    return "".join(
        c["delta"].get("content", "")
        for e in found
        if isinstance(e, dict)
        for c in e.get("choices", [])
    )


async def test_a_stream_passes_through_token_by_token_and_is_measured(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(step_ms=20.0, output_mu=3.0, output_sigma=0.01)  # 20 tokens, 20 ms each
    sidecar: RunningSidecar = await openai_sidecar(start_sidecar, llm)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with sidecar.client.post("/v1/chat/completions", json=chat("hello there")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        first = await resp.content.readline()
        first_at = loop.time() - started
        rest = await events(resp)
    done_at = loop.time() - started
    assert first.startswith(b"data: ")
    assert first_at < done_at / 3  # the first token came long before the engine finished
    assert rest[-1] == "[DONE]"
    usage = next(e["usage"] for e in rest if isinstance(e, dict) and e.get("usage"))
    assert usage["completion_tokens"] == 20
    assert sidecar.sample("modelroll_llm_time_to_first_token_seconds_count") == 1
    ttft = sidecar.sample("modelroll_llm_time_to_first_token_seconds_sum")
    assert 0.015 < ttft < first_at + 0.01
    tpot = sidecar.sample("modelroll_llm_time_per_output_token_seconds_sum")
    assert 0.015 < tpot < 0.04
    assert sidecar.sample("modelroll_llm_output_tokens_total") == 20
    assert sidecar.sample("modelroll_llm_prompt_tokens_total") == usage["prompt_tokens"]
    assert sidecar.sample("modelroll_llm_requests_total", outcome="completed") == 1


async def test_a_whole_answer_passes_through_when_not_streamed(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(step_ms=1.0)
    sidecar = await openai_sidecar(start_sidecar, llm)
    resp = await sidecar.client.post(
        "/v1/completions",
        json={
            "model": "demo-llm",
            "prompt": "once upon a time",
            "max_tokens": 5,
            "stream": False,
        },
    )
    body = await resp.json()
    assert resp.status == 200
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] <= 5


async def test_more_than_max_in_flight_gets_429_with_retry_after(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(step_ms=50.0, output_mu=3.0, output_sigma=0.01)
    sidecar = await openai_sidecar(start_sidecar, llm, max_in_flight=2)
    open_streams = [
        await sidecar.client.post("/v1/chat/completions", json=chat(f"stream {i}"))
        for i in range(2)
    ]
    refused = await sidecar.client.post("/v1/chat/completions", json=chat("one more"))
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert (await refused.json())["error"]["type"] == "rate_limit_error"
    for resp in open_streams:  # the two in flight finish whole
        assert (await events(resp))[-1] == "[DONE]"


async def test_an_engine_that_breaks_off_a_stream_gives_the_client_an_error_event(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(step_ms=2.0, error_rate=1.0, output_mu=3.0, output_sigma=0.01)
    sidecar = await openai_sidecar(start_sidecar, llm)
    async with sidecar.client.post("/v1/chat/completions", json=chat("doomed")) as resp:
        assert resp.status == 200
        found = await events(resp)
    assert "[DONE]" not in found
    last = found[-1]
    assert isinstance(last, dict)
    assert "broke off" in last["error"]["message"]
    assert sidecar.sample("modelroll_llm_requests_total", outcome="upstream_error") == 1


async def test_a_client_that_goes_away_stops_the_engine_generating(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(step_ms=10.0, output_mu=7.0, output_sigma=0.01)  # ~1100 tokens
    sidecar = await openai_sidecar(start_sidecar, llm)
    resp = await sidecar.client.post("/v1/chat/completions", json=chat("long", max_tokens=2000))
    await resp.content.readline()
    resp.close()  # the client hangs up
    for _ in range(100):
        if llm.engine.stats.cancelled:
            break
        await asyncio.sleep(0.02)
    assert llm.engine.stats.cancelled == 1
    assert llm.engine.running == 0
    assert llm.engine.stats.tokens < 300


async def test_draining_finishes_the_streams_in_progress_and_refuses_new_ones(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(step_ms=20.0, output_mu=3.0, output_sigma=0.01)
    sidecar = await openai_sidecar(start_sidecar, llm)
    streams = [
        await sidecar.client.post("/v1/chat/completions", json=chat(f"s{i}")) for i in range(5)
    ]
    draining = asyncio.ensure_future(sidecar.sidecar.shutdown())
    await asyncio.sleep(0.01)
    refused = await sidecar.client.post("/v1/chat/completions", json=chat("late"))
    assert refused.status == 503
    for resp in streams:
        found = await events(resp)
        assert found[-1] == "[DONE]"
        assert len(content(found).split()) == 20
    await draining


async def test_a_stream_outlasting_the_drain_ends_with_an_error_event_saying_why(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(step_ms=20.0, output_mu=9.0, output_sigma=0.01)
    sidecar = await openai_sidecar(start_sidecar, llm, drain_timeout_s=0.3)
    resp = await sidecar.client.post("/v1/chat/completions", json=chat("long", max_tokens=500))
    await resp.content.readline()  # under way
    await sidecar.sidecar.shutdown()  # the drain runs out with the stream still open
    found = await events(resp)
    assert "[DONE]" not in found
    last = found[-1]
    assert isinstance(last, dict)
    message = last["error"]["message"]
    assert message.startswith("the stream was cut off after ")
    assert message.endswith(": the sidecar is shutting down")
    assert 0 < len(content(found).split()) < 500
    assert sidecar.sample("modelroll_llm_requests_total", outcome="cut") == 1


async def test_concurrent_embeddings_go_in_one_engine_call_and_each_gets_its_own(
    start_sidecar: StartSidecar, start_llm: StartLLM
) -> None:
    llm = await start_llm(embed_fixed_ms=5.0)
    sidecar = await openai_sidecar(start_sidecar, llm, max_batch_size=16, max_wait_ms=50)
    requests = [["alpha", "beta"], ["gamma"], ["delta", "epsilon", "zeta"], "eta"]
    answers = await asyncio.gather(
        *(
            sidecar.client.post("/v1/embeddings", json={"model": "demo-llm", "input": given})
            for given in requests
        )
    )
    bodies = [await a.json() for a in answers]
    assert [a.status for a in answers] == [200] * 4
    assert llm.embedding_calls == [7]  # one call with every input
    alone = {}
    for text in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"):
        resp = await sidecar.client.post(
            "/v1/embeddings", json={"model": "demo-llm", "input": text}
        )
        alone[text] = (await resp.json())["data"][0]["embedding"]
    for given, body in zip(requests, bodies, strict=True):
        texts = [given] if isinstance(given, str) else given
        assert [d["index"] for d in body["data"]] == list(range(len(texts)))
        assert [d["embedding"] for d in body["data"]] == [alone[t] for t in texts]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/chat/completions"])
async def test_a_lone_surrogate_gets_400_and_never_reaches_the_engine(
    start_sidecar: StartSidecar, start_llm: StartLLM, path: str
) -> None:
    llm = await start_llm()
    sidecar = await openai_sidecar(start_sidecar, llm)
    text = '"caf\\u00e9 \\ud800"'  # the escape of half a surrogate pair, alone
    body = {
        "/v1/embeddings": f'{{"model": "demo-llm", "input": {text}}}',
        "/v1/chat/completions": (
            f'{{"model": "demo-llm", "messages": [{{"role": "user", "content": {text}}}]}}'
        ),
    }[path]

    resp = await sidecar.client.post(path, data=body, headers={"Content-Type": "application/json"})

    assert resp.status == 400
    error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", 400)
    assert error["message"].startswith("undecodable text: a string holds a lone surrogate")
    assert sidecar.sample("modelroll_requests_total", code="400") == 1
    assert llm.embedding_calls == []
    assert llm.engine.stats.sequences == 0

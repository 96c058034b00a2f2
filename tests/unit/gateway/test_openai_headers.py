"""What the gateway passes to a version on the OpenAI paths: the client's request id and trace,
never its Authorization (that is for whatever authenticates clients in front of the gateway)."""

from __future__ import annotations

from openai import AsyncOpenAI
from pytest_aiohttp import AiohttpServer

from tests.support.gateway import RoutesFile, StartGateway, route
from tests.support.scripted_engines import serve_recording_engine


async def test_the_request_id_reaches_the_version_and_the_clients_key_does_not(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    version = await serve_recording_engine(aiohttp_server)  # as a version's sidecar answers
    routes_file.write({"chat": route("chat", ("chat-v1", 1, version.url))})
    gateway = await start_gateway()
    await gateway.wait_weights("chat", {"chat-v1": 1})
    async with AsyncOpenAI(
        base_url=gateway.url("/v1"), api_key="the-clients-own", max_retries=0
    ) as client:
        answer = await client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"X-Request-Id": "req-7", "traceparent": "00-ef-01-01"},
        )
    assert answer.choices[0].message.content == "hi"
    (headers,) = version.seen
    assert (headers["X-Request-Id"], headers["traceparent"]) == ("req-7", "00-ef-01-01")
    assert "Authorization" not in headers

"""What reaches an OpenAI-compatible engine through the sidecar: the engine's own API key, from
a file (a mounted Secret), never the client's Authorization; and the client's request id."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from pytest_aiohttp import AiohttpServer

from modelroll_sidecar.config import SidecarConfig
from tests.support.scripted_engines import serve_recording_engine
from tests.support.sidecar import StartSidecar

KEY = "engine-secret"


async def ask(base_url: str) -> str | None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="the-clients-own", max_retries=0)
    try:
        answer = await client.chat.completions.create(
            model="demo-llm",
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"X-Request-Id": "req-42", "traceparent": "00-ab-cd-01"},
        )
        return answer.choices[0].message.content
    finally:
        await client.close()


async def test_the_engine_gets_its_own_key_and_the_clients_request_id(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar, tmp_path: Path
) -> None:
    engine = await serve_recording_engine(aiohttp_server, key=KEY)
    key_file = tmp_path / "key"
    key_file.write_text(f"{KEY}\n")

    keyed = await start_sidecar(engine.url, protocol="openai", engine_api_key_file=str(key_file))
    assert await ask(str(keyed.client.make_url("/v1"))) == "hi"
    (headers,) = engine.seen
    assert headers["Authorization"] == f"Bearer {KEY}"  # the engine's, not the client's
    assert (headers["X-Request-Id"], headers["traceparent"]) == ("req-42", "00-ab-cd-01")

    # Without the key file the client's own Authorization still never reaches the engine.
    plain = await start_sidecar(engine.url, protocol="openai")
    with pytest.raises(openai.AuthenticationError):
        await ask(str(plain.client.make_url("/v1")))
    assert "Authorization" not in engine.seen[-1]


def test_a_key_file_that_cannot_be_read_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--engine-api-key-file .* cannot be read"):
        SidecarConfig(engine_api_key_file=str(tmp_path / "missing"))

"""Gateway fixtures: a real gateway app on loopback, reading a routes file, in front of real
aiohttp servers that stand in for sidecars (they speak the sidecar's POST /v1/infer contract)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from modelroll_gateway import GatewayConfig, create_admin_app, create_app
from modelroll_standins.llm import DemoLLMConfig, create_demo_llm_app
from tests.support.gateway import (
    STANDIN,
    TEST_CLIENT,
    Gateway,
    RoutesFile,
    StandIn,
    StartEngine,
    StartGateway,
    StartStandIn,
    standin_infer,
)


@pytest.fixture
def start_standin(aiohttp_server: AiohttpServer) -> StartStandIn:
    """``await start_standin("stable-v1")``: a stand-in sidecar served on 127.0.0.1."""

    async def start(version: str) -> StandIn:
        app = web.Application()
        standin = StandIn(version)
        app[STANDIN] = standin
        app.router.add_post("/v1/infer", standin_infer)
        server = await aiohttp_server(app, host="127.0.0.1")
        standin.url = str(server.make_url("")).rstrip("/")
        return standin

    return start


@pytest.fixture
def start_engine(aiohttp_server: AiohttpServer) -> StartEngine:
    """``await start_engine()``: a demo LLM engine on 127.0.0.1 (it speaks a version's OpenAI
    paths, as its sidecar would), by its base URL."""

    async def start() -> str:
        server = await aiohttp_server(create_demo_llm_app(DemoLLMConfig()), host="127.0.0.1")
        return str(server.make_url("")).rstrip("/")

    return start


@pytest.fixture
def routes_file(tmp_path: Path) -> RoutesFile:
    return RoutesFile(tmp_path / "routes.json")


@pytest.fixture
async def start_gateway(
    aiohttp_server: AiohttpServer, routes_file: RoutesFile
) -> AsyncIterator[StartGateway]:
    """``await start_gateway(**config)``: a gateway reading `routes_file`, and its admin app,
    served on loopback; it trusts the tests' client (TEST_CLIENT) unless told otherwise."""
    sessions: list[aiohttp.ClientSession] = []

    async def start(**settings: Any) -> Gateway:
        settings.setdefault("routes_poll_seconds", 0.05)
        settings.setdefault("routes_file", routes_file.path)
        settings.setdefault("trusted_networks", TEST_CLIENT)
        config = GatewayConfig(**settings)
        registry = CollectorRegistry()
        app = create_app(config, registry=registry)
        server = await aiohttp_server(app, host="127.0.0.1")
        admin = await aiohttp_server(create_admin_app(app), host="127.0.0.1")
        session = aiohttp.ClientSession()
        sessions.append(session)
        return Gateway(server, admin, session, registry)

    yield start
    for session in sessions:
        await session.close()

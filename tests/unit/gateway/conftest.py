"""Gateway fixtures: a real gateway app on loopback, reading a routes file, in front of real
aiohttp servers that stand in for sidecars (they speak the sidecar's POST /v1/infer contract)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from modelroll_common.calls import CALL_SIZE_HEADER
from modelroll_gateway import GatewayConfig, create_admin_app, create_app
from modelroll_gateway.config import parse_networks
from modelroll_standins.llm import DemoLLMConfig, create_demo_llm_app


@dataclass
class StandIn:
    """A stand-in sidecar for one version: echoes the payload, and obeys a few test directives.

    A payload {"status": 429, "retry_after": "3"} answers that status; {"sleep": 0.2} waits first;
    {"call_size": "4"} sends that X-Modelroll-Batch-Size header.
    """

    version: str
    received: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    content_types: list[str] = field(default_factory=list)
    url: str = ""


STANDIN = web.AppKey("standin", StandIn)


async def _standin_infer(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    standin.received += 1
    standin.reached.set()
    standin.content_types.append(request.headers.get("Content-Type", ""))
    body = await request.json()
    payload = body.get("payload")
    headers: dict[str, str] = {}
    if isinstance(payload, dict):
        if "sleep" in payload:
            await asyncio.sleep(float(payload["sleep"]))
        if "call_size" in payload:
            headers[CALL_SIZE_HEADER] = str(payload["call_size"])
        if "status" in payload:
            if "retry_after" in payload:
                headers["Retry-After"] = payload["retry_after"]
            return web.json_response(
                {"error": f"told to answer {payload['status']}"},
                status=int(payload["status"]),
                headers=headers,
            )
    body = {"output": payload, "model": "m", "version": standin.version}
    return web.json_response(body, headers=headers)


StartStandIn = Callable[[str], Awaitable[StandIn]]


@pytest.fixture
def start_standin(aiohttp_server: AiohttpServer) -> StartStandIn:
    """``await start_standin("stable-v1")``: a stand-in sidecar served on 127.0.0.1."""

    async def start(version: str) -> StandIn:
        app = web.Application()
        standin = StandIn(version)
        app[STANDIN] = standin
        app.router.add_post("/v1/infer", _standin_infer)
        server = await aiohttp_server(app, host="127.0.0.1")
        standin.url = str(server.make_url("")).rstrip("/")
        return standin

    return start


StartEngine = Callable[[], Awaitable[str]]


@pytest.fixture
def start_engine(aiohttp_server: AiohttpServer) -> StartEngine:
    """``await start_engine()``: a demo LLM engine on 127.0.0.1 (it speaks a version's OpenAI
    paths, as its sidecar would), by its base URL."""

    async def start() -> str:
        server = await aiohttp_server(create_demo_llm_app(DemoLLMConfig()), host="127.0.0.1")
        return str(server.make_url("")).rstrip("/")

    return start


def route(
    model: str, *versions: tuple[str, int, str], cohort_header: str | None = None
) -> dict[str, Any]:
    """A routes document for one model: route("m", ("v1", 9, url), ...)."""
    doc: dict[str, Any] = {
        "model": model,
        "versions": [{"name": n, "weight": w, "endpoint": e} for n, w, e in versions],
    }
    if cohort_header is not None:
        doc["cohortHeader"] = cohort_header
    return doc


class RoutesFile:
    """The routes file a gateway reads; every write replaces it atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writes = 0

    def write_text(self, text: str) -> None:
        self._writes += 1
        tmp = self.path.with_name(f".{self.path.name}.{self._writes}")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def write(self, routes: Mapping[str, Any]) -> None:
        """Write model -> route (dicts, or the JSON strings a ConfigMap would hold)."""
        self.write_text(json.dumps(dict(routes)))


@pytest.fixture
def routes_file(tmp_path: Path) -> RoutesFile:
    return RoutesFile(tmp_path / "routes.json")


TEST_CLIENT = parse_networks("127.0.0.1/32")
"""The network of the tests' clients: the gateways the fixture starts trust it (they pin), unless
a test gives its own ``trusted_networks``."""


@dataclass
class Gateway:
    """A running gateway app, its admin app, and a client session pointed at them."""

    server: TestServer
    admin: TestServer
    session: aiohttp.ClientSession
    registry: CollectorRegistry

    def url(self, path: str) -> str:
        """A URL on the clients' port."""
        return str(self.server.make_url(path))

    def admin_url(self, path: str) -> str:
        """A URL on the admin port (GET /metrics, GET /v1/routes)."""
        return str(self.admin.make_url(path))

    async def infer(
        self,
        model: str,
        payload: Any = "hello",
        version: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, str, dict[str, Any]]:
        """POST an inference (with ``headers`` besides); returns (status, X-Modelroll-Version,
        JSON body)."""
        headers = dict(headers or {})
        if version is not None:
            headers["X-Modelroll-Version"] = version
        async with self.session.post(
            self.url(f"/v1/models/{model}/infer"), json={"payload": payload}, headers=headers
        ) as resp:
            body = await resp.json()
            return resp.status, resp.headers["X-Modelroll-Version"], body

    async def routes(self) -> dict[str, Any]:
        async with self.session.get(self.admin_url("/v1/routes")) as resp:
            assert resp.status == 200
            doc: dict[str, Any] = await resp.json()
            return doc

    async def weights(self, model: str) -> dict[str, int]:
        """The weights the gateway is routing by for `model` (empty when it has no route)."""
        for item in (await self.routes())["models"]:
            if item["model"] == model:
                return {v["name"]: v["weight"] for v in item["versions"]}
        return {}

    async def wait_for(
        self, check: Callable[[dict[str, Any]], bool], within: float = 10.0
    ) -> dict[str, Any]:
        """Poll GET /v1/routes until `check` holds (generous deadline: a functional bound)."""
        deadline = time.monotonic() + within
        while True:
            doc = await self.routes()
            if check(doc):
                return doc
            if time.monotonic() > deadline:
                pytest.fail(f"the gateway's routes never matched; last seen: {doc}")
            await asyncio.sleep(0.02)

    async def wait_weights(self, model: str, weights: Mapping[str, int]) -> None:
        deadline = time.monotonic() + 10.0
        while (seen := await self.weights(model)) != dict(weights):
            if time.monotonic() > deadline:
                pytest.fail(f"model {model}: gateway kept weights {seen}, expected {weights}")
            await asyncio.sleep(0.02)

    async def wait_served(self, model: str) -> None:
        """Wait until GET /v1/models/{model} lists `model` (it takes traffic), as any client
        can, trusted or not."""
        deadline = time.monotonic() + 10.0
        while True:
            async with self.session.get(self.url(f"/v1/models/{model}")) as resp:
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"the gateway never served model {model}")
            await asyncio.sleep(0.02)

    def sample(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``: a label not
        given is summed over, as PromQL's sum does."""
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )


StartGateway = Callable[..., Awaitable[Gateway]]


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

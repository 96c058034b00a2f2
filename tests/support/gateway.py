"""A real gateway app on loopback, reading a routes file, in front of real aiohttp servers that
stand in for sidecars (they speak the sidecar's POST /v1/infer contract): what the gateway's
fixtures (tests/unit/gateway/conftest.py) start, and the routes documents tests write; and a
real gateway process reading them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from modelroll_common.calls import CALL_SIZE_HEADER
from modelroll_gateway.app import PROXY_KEY
from modelroll_gateway.config import parse_networks
from modelroll_gateway.shadow import SHADOW_OUTCOMES
from modelroll_gateway.streaming import StreamingForwarder
from tests.support.processes import Spawn, free_port


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


async def standin_infer(request: web.Request) -> web.Response:
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


StartEngine = Callable[[], Awaitable[str]]


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

    def shadow_outcomes(self, model: str) -> dict[str, float]:
        """How the shadow copies of ``model``'s requests ended so far, by outcome (none at 0)."""
        counted = {
            outcome: self.sample(
                "modelroll_gateway_shadow_requests_total", model=model, outcome=outcome
            )
            for outcome in SHADOW_OUTCOMES
        }
        return {k: v for k, v in counted.items() if v}


StartGateway = Callable[..., Awaitable[Gateway]]


async def gateway_to(
    start_gateway: StartGateway, routes_file: RoutesFile, url: str, **settings: float
) -> Gateway:
    routes_file.write({"chat": route("chat", ("chat-v1", 1, url))})
    gateway = await start_gateway(**settings)
    await gateway.wait_weights("chat", {"chat-v1": 1})
    return gateway


def forwarder(gateway: Gateway) -> StreamingForwarder:
    llm = gateway.server.app[PROXY_KEY].llm
    assert llm is not None
    return llm


def gateway_process(spawn: Spawn, tmp_path: Path, routes: Mapping[str, object]) -> tuple[str, str]:
    """A ``modelroll-gateway`` process following ``routes`` (model: :func:`route`), trusting
    loopback's pins, ready: its clients' URL and its admin URL."""
    port, admin = free_port(), free_port()
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(routes))
    spawn(
        "modelroll-gateway",
        ready=f"http://127.0.0.1:{port}/v2/health/ready",
        env={
            "MODELROLL_PORT": str(port),
            "MODELROLL_ADMIN_PORT": str(admin),
            "MODELROLL_ROUTES_FILE": str(path),
            "MODELROLL_TRUSTED_NETWORKS": "127.0.0.1/32",
        },
    )
    return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"

"""A demo model and a sidecar app served on loopback, lifespans entered: what the sidecar's
fixtures (tests/unit/sidecar/conftest.py) start, and the batching modes they run in."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from modelroll_sidecar.app import Sidecar
from modelroll_standins.model import DemoModel


@dataclass
class RunningModel:
    server: TestServer
    model: DemoModel

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


@dataclass
class RunningSidecar:
    client: TestClient[web.Request, web.Application]
    sidecar: Sidecar
    registry: CollectorRegistry

    async def infer(self, payload: Any) -> tuple[int, dict[str, Any]]:
        resp = await self.client.post("/v1/infer", json={"payload": payload})
        body: dict[str, Any] = await resp.json()
        return resp.status, body

    def sample(self, name: str, **labels: str) -> float:
        """The current value of one series of this sidecar's metrics (0 when absent)."""
        value = self.registry.get_sample_value(
            name,
            {"model": self.sidecar.config.model, "version": self.sidecar.config.version, **labels},
        )
        return value or 0.0


async def until_ready(client: TestClient[web.Request, web.Application]) -> None:
    """Wait, at most 5 s, until the sidecar behind ``client`` answers /readyz 200."""
    for _ in range(100):
        if (await client.get("/readyz")).status == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the sidecar never became ready")


StartModel = Callable[..., Awaitable[RunningModel]]


StartSidecar = Callable[..., Awaitable[RunningSidecar]]


FIFO = {"batch_by": "arrival", "wait_policy": "fixed"}
"""First in, first out, each batch waiting max-wait for company: the simplest rules."""


MODES = {
    "arrival-fixed": FIFO,
    "length-fixed": {"batch_by": "length", "wait_policy": "fixed"},
    "length-adaptive": {"batch_by": "length", "wait_policy": "adaptive"},
    "defaults": {},
}
"""The batching modes a module runs its tests in when it overrides ``batching_mode`` with
``every_mode`` (a parametrized fixture)."""

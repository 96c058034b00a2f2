"""The real sentence encoder served on loopback: what the models' fixtures
(tests/unit/models/conftest.py) start."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp.test_utils import TestServer

from modelroll_models.batch_server import BatchService

LOAD_TIMEOUT_S = 10.0


@dataclass
class RunningEncoder:
    server: TestServer
    service: BatchService

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


StartEncoder = Callable[..., Awaitable[RunningEncoder]]


async def wait_loaded(service: BatchService) -> None:
    async with asyncio.timeout(LOAD_TIMEOUT_S):
        await service.load_finished.wait()

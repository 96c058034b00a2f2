"""Sidecar fixtures: a demo model and a sidecar app served on loopback, lifespans entered."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from modelroll_sidecar.app import SIDECAR, create_app
from modelroll_sidecar.config import SidecarConfig
from modelroll_sidecar.cost_model import MIN_BATCHES
from modelroll_standins.model import DEMO_MODEL, DemoModelConfig, create_demo_model_app
from tests.support.sidecar import (
    FIFO,
    MODES,
    RunningModel,
    RunningSidecar,
    StartModel,
    StartSidecar,
)


@pytest.fixture
def start_model(aiohttp_server: AiohttpServer) -> StartModel:
    """Serve a demo model on loopback: ``await start_model(fixed_ms=..., parallel=...)``."""

    async def start(**settings: Any) -> RunningModel:
        app = create_demo_model_app(DemoModelConfig(**settings))
        server = await aiohttp_server(app)
        return RunningModel(server, app[DEMO_MODEL])

    return start


@pytest.fixture
def batching_mode() -> dict[str, str]:
    """The sidecar's batch_by and wait_policy: FIFO, unless a module overrides this."""
    return FIFO


@pytest.fixture(params=list(MODES))
def every_mode(request: pytest.FixtureRequest) -> dict[str, str]:
    mode: dict[str, str] = MODES[request.param]
    return mode


@pytest.fixture
def start_sidecar(aiohttp_client: AiohttpClient, batching_mode: dict[str, str]) -> StartSidecar:
    """Serve a sidecar app (its cleanup_ctx entered) in front of ``upstream``, in the module's
    batching mode. Unless it batches first in, first out with a fixed wait, its cost surface
    starts out as a sidecar's does after a few batches of a 1 ms model, so the decisions that
    rest on it are live from the first request. Lengths are words unless a test asks otherwise:
    the demo model serves no tokenizer, and under --length-from auto a sidecar refuses requests
    until the model has said so, which tests that send at once do not wait for
    (tests/unit/sidecar/test_tokenizer.py does)."""

    async def start(upstream: str, **settings: Any) -> RunningSidecar:
        config = SidecarConfig(
            upstream=upstream,
            model="sentiment",
            version="v1",
            readiness_interval_ms=100,
            **{"length_from": "words", **batching_mode, **settings},
        )
        registry = CollectorRegistry()
        app = create_app(config, registry)
        client = await aiohttp_client(app)
        running = RunningSidecar(client, app[SIDECAR], registry)
        if config.wait_policy != "fixed" or config.batch_by != "arrival":
            for size in range(1, MIN_BATCHES + 1):
                running.sidecar.batcher.cost.observe(size, 2 * size, 0.001)
        return running

    return start

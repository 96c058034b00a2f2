"""Readiness follows the model; an app whose lifespan never ran fails fast instead of hanging."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import make_mocked_request

from modelroll_sidecar.app import create_app, handle_infer, handle_livez
from modelroll_sidecar.config import SidecarConfig

from .conftest import StartModel, StartSidecar


async def test_readyz_is_503_until_the_model_is_ready(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, ready_after_ms=700)
    sidecar = await start_sidecar(model.url)

    before = await sidecar.client.get("/readyz")
    for _ in range(50):
        await asyncio.sleep(0.1)
        after = await sidecar.client.get("/readyz")
        if after.status == 200:
            break

    assert before.status == 503
    assert "not ready" in (await before.json())["error"]
    assert after.status == 200
    assert (await sidecar.client.get("/livez")).status == 200


async def test_an_app_whose_lifespan_never_started_answers_503_at_once() -> None:
    app = create_app(SidecarConfig(upstream="http://127.0.0.1:9"))
    request = make_mocked_request(
        "POST", "/v1/infer", headers={"Content-Type": "application/json"}, app=app
    )
    request._read_bytes = b'{"payload": 1}'  # the body a client would have sent

    response = await asyncio.wait_for(handle_infer(request), timeout=2)
    live = await handle_livez(make_mocked_request("GET", "/livez", app=app))

    assert response.status == 503
    assert live.status == 503

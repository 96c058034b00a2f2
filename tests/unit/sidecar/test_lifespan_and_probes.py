"""Readiness follows the model; an app whose lifespan never ran fails fast instead of hanging."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from pytest_aiohttp import AiohttpServer

from modelroll_sidecar.app import create_app, handle_infer, handle_livez
from modelroll_sidecar.config import SidecarConfig
from tests.support.sidecar import StartModel, StartSidecar, until_ready


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


async def test_a_model_slower_to_answer_readyz_than_the_probe_timeout_stays_unready(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    """A model whose /readyz takes 1.2 s: never ready behind the default 1 s probe timeout,
    ready once --readiness-timeout-ms gives it 2 s."""

    async def slow_readyz(request: web.Request) -> web.Response:
        await asyncio.sleep(1.2)
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_get("/readyz", slow_readyz)
    url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    hasty, patient = await asyncio.gather(
        start_sidecar(url), start_sidecar(url, readiness_timeout_ms=2000)
    )
    loop = asyncio.get_running_loop()
    started = loop.time()

    while (await patient.client.get("/readyz")).status != 200:
        assert loop.time() - started < 3.0, "the patient sidecar never became ready"
        await asyncio.sleep(0.05)
    await asyncio.sleep(started + 2.5 - loop.time())  # the hasty one's second probe gave up too
    unready = await hasty.client.get("/readyz")

    assert unready.status == 503
    assert "not ready" in (await unready.json())["error"]


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


async def test_a_sidecar_counting_tokens_stays_unready_behind_a_model_with_no_tokenizer(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    """--length-from tokenizer in front of a model that serves no GET /v1/tokenizer (the demo
    model): the model is ready, the sidecar is not, says why, and takes no request."""
    model = await start_model(fixed_ms=1)
    sidecar = await start_sidecar(model.url, length_from="tokenizer")
    counting_words = await start_sidecar(model.url)

    await until_ready(counting_words.client)
    await asyncio.sleep(0.3)  # three more probes of the model, each asking for its tokenizer
    unready = await sidecar.client.get("/readyz")
    status, body = await sidecar.infer("a sentence")

    assert unready.status == 503
    assert (await unready.json())["error"] == (
        "no tokenizer from the model: the model answers GET /v1/tokenizer with HTTP 404; "
        "--length-from tokenizer needs a model that serves its tokenizer.json there"
    )
    assert (status, body) == (503, {"error": "the model's tokenizer is not loaded yet"})
    assert model.model.items == 0

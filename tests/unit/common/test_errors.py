"""The one error middleware of the sidecar and the gateway, on an app of its own: what a client
gets for a path that does not exist, a method a path does not take, and a handler that fails."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp.pytest_plugin import AiohttpClient

from modelroll_common.errors import json_errors


async def _fails(request: web.Request) -> web.Response:
    raise RuntimeError("a bug")


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _app() -> web.Application:
    app = web.Application(middlewares=[json_errors("tester", lambda p: p.startswith("/v1/chat"))])
    app.router.add_post("/v1/infer", _ok)
    app.router.add_post("/v1/chat/completions", _ok)
    app.router.add_get("/v1/broken", _fails)
    return app


async def test_unknown_paths_and_methods_are_named_in_json(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(_app())

    missing = await client.get("/v1/elsewhere")
    wrong = await client.get("/v1/infer")
    answered = await client.post("/v1/infer")

    assert (missing.status, await missing.json()) == (
        404,
        {"error": "no such path '/v1/elsewhere'"},
    )
    assert (wrong.status, wrong.headers["Allow"]) == (405, "POST")
    assert await wrong.json() == {"error": "method GET is not allowed on /v1/infer; use POST"}
    assert (answered.status, await answered.json()) == (200, {"ok": True})


async def test_openai_paths_get_openai_shaped_errors(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(_app())

    wrong = await client.get("/v1/chat/completions")

    assert wrong.status == 405
    assert (await wrong.json())["error"] == {
        "message": "method GET is not allowed on /v1/chat/completions; use POST",
        "type": "invalid_request_error",
        "param": None,
        "code": 405,
    }


async def test_a_failing_handler_is_a_logged_json_500(
    aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = await aiohttp_client(_app())

    with caplog.at_level(logging.ERROR, logger="modelroll_tester"):
        resp = await client.get("/v1/broken")

    assert (resp.status, resp.content_type) == (500, "application/json")
    assert await resp.json() == {"error": "internal error in the tester (logged)"}
    assert "Handling GET /v1/broken failed" in caplog.text

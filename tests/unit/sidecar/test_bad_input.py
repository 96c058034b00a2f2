"""Bad requests and bad settings get a specific status or message, and the app keeps serving."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from modelroll_sidecar.config import SidecarConfig, parse_args
from tests.support.sidecar import StartModel, StartSidecar


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"{not json", "application/json", 400, "malformed JSON"),
        (b'{"input": 1}', "application/json", 400, '"payload" field'),
        (b"[1, 2]", "application/json", 400, '"payload" field'),
        (b"\xff\xfe", "application/json", 400, "malformed JSON"),
        (b'{"payload": 1}', "text/plain", 415, "application/json"),
        (b'{"payload": 1}', "application/x-www-form-urlencoded", 415, "application/json"),
    ],
)
async def test_bad_requests_get_a_json_error(
    start_model: StartModel,
    start_sidecar: StartSidecar,
    body: bytes,
    content_type: str,
    status: int,
    message: str,
) -> None:
    model = await start_model(fixed_ms=1)
    sidecar = await start_sidecar(model.url, max_wait_ms=5)

    resp = await sidecar.client.post("/v1/infer", data=body, headers={"Content-Type": content_type})

    assert resp.status == status
    assert resp.content_type == "application/json"
    assert message in (await resp.json())["error"]
    assert sidecar.sample("modelroll_requests_total", code=str(status)) == 1
    # The app still serves good requests afterwards.
    assert (await sidecar.infer("fine"))[0] == 200


async def test_oversized_bodies_get_413_whether_or_not_they_declare_a_length(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1)
    sidecar = await start_sidecar(model.url, max_wait_ms=5, max_body_bytes=1024)
    big = b'{"payload": "' + b"x" * 4096 + b'"}'

    declared = await sidecar.client.post(
        "/v1/infer", data=big, headers={"Content-Type": "application/json"}
    )

    async def chunks() -> AsyncIterator[bytes]:
        yield big

    chunked = await sidecar.client.post(
        "/v1/infer", data=chunks(), headers={"Content-Type": "application/json"}
    )

    for resp in (declared, chunked):
        assert resp.status == 413
        assert "1024 bytes" in (await resp.json())["error"]
    assert model.model.items == 0


async def test_unknown_paths_and_methods_answer_json(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1)
    sidecar = await start_sidecar(model.url)

    missing = await sidecar.client.get("/v1/nothing")
    wrong_method = await sidecar.client.get("/v1/infer")

    assert missing.status == 404
    assert (await missing.json())["error"] == "no such path '/v1/nothing'"
    assert (wrong_method.status, wrong_method.headers["Allow"]) == (405, "POST")
    assert (await wrong_method.json())["error"] == (
        "method GET is not allowed on /v1/infer; use POST"
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--max-batch-size", "0"], "--max-batch-size"),
        (["--max-wait-ms", "-1"], "--max-wait-ms"),
        (["--max-queue-size", "0"], "--max-queue-size"),
        (["--max-concurrent-batches", "0"], "--max-concurrent-batches"),
        (["--max-batch-tokens", "-5"], "--max-batch-tokens"),
        (["--timeout-ms", "5", "--max-wait-ms", "10"], "--max-wait-ms"),
        (["--upstream", "localhost:8080"], "--upstream"),
        (["--max-batch-size", "many"], "--max-batch-size"),
        (["--event-loop", "trio"], "--event-loop"),
        (["--control-port", "8000"], "--control-port must differ from --port, got 8000 for both"),
        (["--control-port", "65536"], "--control-port must be within 0..65535, got 65536"),
        (["--control-port", "-1"], "--control-port must be within 0..65535, got -1"),
    ],
)
def test_invalid_settings_exit_with_a_message_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv, environ={})

    assert exited.value.code == 2
    assert named in capsys.readouterr().err


def test_settings_come_from_flags_then_environment_then_defaults() -> None:
    environ = {"MODELROLL_MAX_BATCH_SIZE": "64", "MODELROLL_MODEL": "sentiment"}

    from_env = parse_args([], environ=environ)
    from_flag = parse_args(["--max-batch-size", "8"], environ=environ)

    assert from_env.max_batch_size == 64
    assert from_env.model == "sentiment"
    assert from_flag.max_batch_size == 8
    assert from_env.max_wait_ms == SidecarConfig().max_wait_ms


def test_a_bad_environment_value_is_reported_against_its_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_args([], environ={"MODELROLL_MAX_WAIT_MS": "soon"})

    assert "error: MODELROLL_MAX_WAIT_MS=soon: invalid number" in capsys.readouterr().err


async def test_payloads_reach_the_model_exactly_and_non_json_constants_are_refused(
    aiohttp_server: AiohttpServer, start_sidecar: StartSidecar
) -> None:
    async def echo_model(request: web.Request) -> web.Response:
        # Answers each input as its output, byte for byte.
        raw = (await request.read()).replace(b'{"inputs":', b'{"outputs":', 1)
        return web.Response(body=raw, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/batch", echo_model)
    model = await aiohttp_server(app)
    sidecar = await start_sidecar(str(model.make_url("")).rstrip("/"), max_wait_ms=5)
    big = 2**100 + 1

    status, body = await sidecar.infer({"id": big, "text": "naïve café"})
    refused = await sidecar.client.post(
        "/v1/infer", data=b'{"payload": NaN}', headers={"Content-Type": "application/json"}
    )

    assert status == 200
    assert body["output"] == {"id": big, "text": "naïve café"}  # not rounded to a float
    assert refused.status == 400
    assert "NaN is not valid JSON" in (await refused.json())["error"]

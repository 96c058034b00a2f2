"""Requests through a real gateway to stand-in sidecars on loopback: split, pinning, errors."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from modelroll_sidecar.app import create_app as create_sidecar_app
from modelroll_sidecar.config import SidecarConfig
from modelroll_standins.model import DemoModelConfig, create_demo_model_app
from tests.support.gateway import RoutesFile, StartGateway, StartStandIn, route
from tests.support.processes import free_port


@pytest.mark.parametrize(
    ("stable_weight", "canary_weight", "requests"), [(9, 1, 1000), (70, 30, 500)]
)
async def test_the_split_follows_the_weights_exactly(
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
    stable_weight: int,
    canary_weight: int,
    requests: int,
) -> None:
    """Smooth weighted round robin: every run of total-weight requests holds each version's
    weight exactly, so the split is exact to the request."""
    stable, canary = await start_standin("stable-v1"), await start_standin("canary-v2")
    versions = (("stable-v1", stable_weight, stable.url), ("canary-v2", canary_weight, canary.url))
    routes_file.write({"sentiment": route("sentiment", *versions)})
    gw = await start_gateway()

    async def one(i: int) -> str:
        status, version, body = await gw.infer("sentiment", payload=i)
        assert status == 200
        assert body == {"output": i, "model": "m", "version": version}
        return version

    seen: Counter[str] = Counter()
    for start in range(0, requests, 50):  # 50 in flight at a time
        seen.update(await asyncio.gather(*(one(i) for i in range(start, start + 50))))

    share = canary_weight / (stable_weight + canary_weight)
    to_canary = round(requests * share)
    assert seen == {"stable-v1": requests - to_canary, "canary-v2": to_canary}
    assert (stable.received, canary.received) == (requests - to_canary, to_canary)
    listed = {v["name"]: v for v in (await gw.routes())["models"][0]["versions"]}
    assert listed["stable-v1"]["requests"] == requests - to_canary
    assert listed["canary-v2"]["requests"] == to_canary
    assert listed["canary-v2"]["share"] == share
    labels = {"model": "sentiment", "version": "canary-v2"}
    assert gw.sample("modelroll_gateway_requests_total", code="200", **labels) == to_canary
    assert gw.sample("modelroll_gateway_request_duration_seconds_count", **labels) == to_canary
    assert gw.sample("modelroll_gateway_weight", **labels) == canary_weight


async def test_the_version_header_pins_a_version_even_a_dark_one(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable, dark = await start_standin("stable-v1"), await start_standin("canary-v2")
    routes_file.write(
        {"sentiment": route("sentiment", ("stable-v1", 1, stable.url), ("canary-v2", 0, dark.url))}
    )
    gw = await start_gateway()
    for _ in range(5):
        status, version, body = await gw.infer("sentiment", version="canary-v2")
        assert (status, version, body["version"]) == (200, "canary-v2", "canary-v2")
    status, version, _ = await gw.infer("sentiment")
    assert (status, version) == (200, "stable-v1")
    assert (stable.received, dark.received) == (1, 5)


async def test_a_version_scaled_to_zero_answers_pins_503_with_retry_after(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable = await start_standin("stable-v1")
    doc = route("sentiment", ("stable-v1", 1, stable.url), ("canary-v2", 0, "http://nowhere:1"))
    doc["versions"][1]["standby"] = True
    routes_file.write({"sentiment": doc})
    gw = await start_gateway()
    async with gw.session.post(
        gw.url("/v1/models/sentiment/infer"),
        json={"payload": 1},
        headers={"X-Modelroll-Version": "canary-v2"},
    ) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "10"
        body = await resp.json()
    assert body == {
        "error": "version 'canary-v2' of model 'sentiment' is scaled to zero: no replica is "
        "Ready yet"
    }
    for _ in range(3):  # it takes nothing by weight
        assert (await gw.infer("sentiment"))[:2] == (200, "stable-v1")
    assert stable.received == 3


async def test_unknown_model_and_unknown_version_answer_404(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable = await start_standin("stable-v1")
    routes_file.write({"sentiment": route("sentiment", ("stable-v1", 1, stable.url))})
    gw = await start_gateway()
    assert await gw.infer("nope") == (404, "", {"error": "unknown model 'nope'"})
    status, version, body = await gw.infer("sentiment", version="v9")
    assert (status, version) == (404, "")
    assert body == {"error": "unknown version 'v9' of model 'sentiment'"}
    assert stable.received == 0
    assert gw.sample("modelroll_gateway_requests_total", model="", version="", code="404") == 1
    assert (
        gw.sample("modelroll_gateway_requests_total", model="sentiment", version="", code="404")
        == 1
    )


async def test_a_model_with_no_routable_version_answers_503(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    dark = await start_standin("v1")
    routes_file.write(
        {"dark": route("dark", ("v1", 0, dark.url)), "empty": {"model": "empty", "versions": []}}
    )
    gw = await start_gateway()
    for model in ("dark", "empty"):
        status, version, body = await gw.infer(model)
        assert (status, version) == (503, "")
        assert "no routable version" in body["error"]
    assert dark.received == 0
    listed = {m["model"]: m["routable"] for m in (await gw.routes())["models"]}
    assert listed == {"dark": False, "empty": False}


async def test_an_unreachable_version_answers_502_counted_against_it(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    routes_file.write({"sentiment": route("sentiment", ("gone-v1", 1, dead))})
    gw = await start_gateway()
    status, version, body = await gw.infer("sentiment")
    assert (status, version) == (502, "gone-v1")
    assert body == {"error": "version 'gone-v1' could not be reached"}
    versions = (await gw.routes())["models"][0]["versions"]
    assert versions[0]["responses"] == {"502": 1}
    labels = {"model": "sentiment", "version": "gone-v1"}
    assert gw.sample("modelroll_gateway_requests_total", code="502", **labels) == 1
    assert gw.sample("modelroll_gateway_requests_total", code="200", **labels) == 0


async def test_the_sidecars_status_body_and_retry_after_pass_through(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    busy = await start_standin("v1")
    routes_file.write({"sentiment": route("sentiment", ("v1", 1, busy.url))})
    gw = await start_gateway()
    async with gw.session.post(
        gw.url("/v1/models/sentiment/infer"),
        json={"payload": {"status": 429, "retry_after": "3"}},
    ) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "3"
        assert resp.headers["X-Modelroll-Version"] == "v1"
        assert await resp.json() == {"error": "told to answer 429"}
    labels = {"model": "sentiment", "version": "v1"}
    assert gw.sample("modelroll_gateway_requests_total", code="429", **labels) == 1


async def test_a_version_slower_than_the_upstream_timeout_answers_504(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    slow = await start_standin("v1")
    routes_file.write({"sentiment": route("sentiment", ("v1", 1, slow.url))})
    gw = await start_gateway(upstream_timeout=0.5)
    status, version, body = await gw.infer("sentiment", payload={"sleep": 5})
    assert (status, version) == (504, "v1")
    assert body == {"error": "version 'v1' did not answer within 0.5s"}


async def test_a_body_over_the_limit_answers_413_and_never_reaches_a_sidecar(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    v1 = await start_standin("v1")
    routes_file.write({"sentiment": route("sentiment", ("v1", 1, v1.url))})
    gw = await start_gateway(max_body_bytes=1000)
    big = json.dumps({"payload": "x" * 2000}).encode()

    async def chunked() -> object:
        yield big[:1000]
        yield big[1000:]

    for data in (big, chunked()):  # with a Content-Length, and without one
        async with gw.session.post(
            gw.url("/v1/models/sentiment/infer"),
            data=data,
            headers={"Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 413
            assert await resp.json() == {"error": "request body exceeds 1000 bytes"}
    assert v1.received == 0
    status, _, _ = await gw.infer("sentiment", payload="x" * 900)
    assert status == 200


async def test_through_a_real_sidecar_output_and_bad_input_errors_pass_through(
    start_gateway: StartGateway,
    aiohttp_server: AiohttpServer,
    routes_file: RoutesFile,
) -> None:
    model = await aiohttp_server(create_demo_model_app(DemoModelConfig(fixed_ms=1)))
    sidecar = await aiohttp_server(
        create_sidecar_app(
            SidecarConfig(
                upstream=str(model.make_url("")).rstrip("/"),
                model="sentiment",
                version="stable-v1",
                max_wait_ms=1,
                readiness_interval_ms=100,
            )
        ),
        host="127.0.0.1",
    )
    routes_file.write(
        {"sentiment": route("sentiment", ("stable-v1", 1, str(sidecar.make_url("")).rstrip("/")))}
    )
    gw = await start_gateway()
    status, version, body = await gw.infer("sentiment", payload="a good movie")
    assert (status, version) == (200, "stable-v1")
    assert (body["model"], body["version"]) == ("sentiment", "stable-v1")
    url = gw.url("/v1/models/sentiment/infer")
    async with gw.session.post(url, data=b"hello", headers={"Content-Type": "text/plain"}) as resp:
        assert resp.status == 415
        assert "error" in await resp.json()
    async with gw.session.post(url, json={"nopayload": 1}) as resp:
        assert resp.status == 400
        assert "error" in await resp.json()


async def test_other_paths_and_methods_get_json_errors(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    routes_file.write({})
    gw = await start_gateway()
    async with gw.session.get(gw.url("/v1/models/sentiment/infer")) as resp:
        assert (resp.status, resp.headers["Allow"]) == (405, "POST")
        assert "use POST" in (await resp.json())["error"]
    async with gw.session.get(gw.url("/nowhere")) as resp:
        assert resp.status == 404
        assert await resp.json() == {"error": "no such path '/nowhere'"}


async def test_probes_and_metrics_are_served(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    v1 = await start_standin("v1")
    routes_file.write({"sentiment": route("sentiment", ("v1", 3, v1.url))})
    gw = await start_gateway()
    for path in ("/livez", "/readyz"):
        async with gw.session.get(gw.url(path)) as resp:
            assert resp.status == 200
    async with gw.session.get(gw.admin_url("/metrics")) as resp:
        text = await resp.text()
    assert 'modelroll_gateway_weight{model="sentiment",version="v1"} 3.0' in text
    # series exist at 0 before any request, so an error ratio is never "no data"
    for routing in ("weight", "pin"):
        labels = f'code="502",model="sentiment",routing="{routing}",version="v1"'
        assert f"modelroll_gateway_requests_total{{{labels}}} 0.0" in text
    for reason in ("connect", "timeout", "protocol", "closed"):
        labels = f'model="sentiment",reason="{reason}",version="v1"'
        assert f"modelroll_gateway_upstream_errors_total{{{labels}}} 0.0" in text
    assert 'modelroll_gateway_upstream_waiting{model="sentiment",version="v1"} 0.0' in text


async def test_connection_errors_do_not_leak_between_requests(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    """A client that gives up mid-request does not disturb the next requests."""
    v1 = await start_standin("v1")
    routes_file.write({"sentiment": route("sentiment", ("v1", 1, v1.url))})
    gw = await start_gateway()
    timeout = aiohttp.ClientTimeout(total=0.2)
    try:
        async with gw.session.post(
            gw.url("/v1/models/sentiment/infer"), json={"payload": {"sleep": 1}}, timeout=timeout
        ):
            pass
    except TimeoutError:
        pass
    for _ in range(3):
        status, _, _ = await gw.infer("sentiment")
        assert status == 200

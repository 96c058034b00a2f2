"""Shadow traffic through a real gateway: copies of a share of the requests go to a shadow
version after the client has its answer; the shadow's slowness and failures change nothing a
client sees; copies beyond the bound are dropped and counted; the answers' agreement is
recorded (equality for labels, cosine similarity for vectors)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from modelroll_gateway.app import PROXY_KEY
from modelroll_gateway.shadow import agreement
from tests.support.gateway import Gateway, RoutesFile, StartGateway, StartStandIn
from tests.support.scripted_engines import until

MODEL = "sentiment"


@dataclass
class Shadow:
    """A shadow version that holds every copy until ``gate`` opens, then fails every other one
    and answers the rest with ``output(payload)``."""

    url: str = ""
    received: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    output: Any = None
    headers: list[Mapping[str, str]] = field(default_factory=list)
    """The headers of each copy received."""


SHADOW = web.AppKey("shadow", Shadow)


async def _shadow_infer(request: web.Request) -> web.Response:
    shadow = request.app[SHADOW]
    shadow.received += 1
    shadow.headers.append(request.headers)
    n = shadow.received
    payload = (await request.json())["payload"]
    await shadow.gate.wait()
    if n % 2 == 0:
        return web.json_response({"error": "the shadow failed"}, status=500)
    output = payload if shadow.output is None else shadow.output(payload)
    return web.json_response({"output": output, "model": MODEL, "version": "shadow-v2"})


async def start_shadow(aiohttp_server: AiohttpServer, output: Any = None) -> Shadow:
    app = web.Application()
    shadow = app[SHADOW] = Shadow(output=output)
    app.router.add_post("/v1/infer", _shadow_infer)
    server = await aiohttp_server(app, host="127.0.0.1")
    shadow.url = str(server.make_url("")).rstrip("/")
    return shadow


def routes(routes_file: RoutesFile, stable_url: str, shadow_url: str, percent: int) -> None:
    versions = [
        {"name": "stable-v1", "weight": 1, "endpoint": stable_url},
        {"name": "shadow-v2", "weight": 0, "endpoint": shadow_url, "shadow": percent},
    ]
    routes_file.write({MODEL: {"model": MODEL, "versions": versions}})


def outcomes(gateway: Gateway) -> dict[str, float]:
    return gateway.shadow_outcomes(MODEL)


async def answers(gateway: Gateway, payloads: list[Any]) -> Counter[tuple[int, str]]:
    seen = await asyncio.gather(*(gateway.infer(MODEL, payload=p) for p in payloads))
    for (_, _, body), payload in zip(seen, payloads, strict=True):
        assert body["output"] == payload
    return Counter((status, version) for status, version, _ in seen)


async def test_a_slow_failing_shadow_changes_nothing_clients_see_and_its_copies_are_bounded(
    aiohttp_server: AiohttpServer,
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
) -> None:
    stable, shadow = await start_standin("stable-v1"), await start_shadow(aiohttp_server)
    routes(routes_file, stable.url, shadow.url, 100)
    gateway = await start_gateway(shadow_max_in_flight=8)
    await gateway.wait_weights(MODEL, {"stable-v1": 1, "shadow-v2": 0})

    # The shadow answers nothing yet: every client is answered by the stable all the same.
    assert await answers(gateway, list(range(40))) == {(200, "stable-v1"): 40}
    await until(lambda: shadow.received == 8, "the shadow holding 8 copies")
    assert outcomes(gateway) == {"dropped": 32}
    assert gateway.sample("modelroll_gateway_requests_total", version="shadow-v2") == 0

    shadow.gate.set()
    await until(lambda: sum(outcomes(gateway).values()) == 40, "the copies answered")
    assert outcomes(gateway) == {"compared": 4, "failed": 4, "dropped": 32}
    labels = {"model": MODEL, "version": "shadow-v2", "primary": "stable-v1"}
    assert gateway.sample("modelroll_gateway_shadow_agreement_count", **labels) == 4
    assert gateway.sample("modelroll_gateway_shadow_agreement_sum", **labels) == 4.0
    shadows = gateway.server.app[PROXY_KEY].shadows
    assert shadows is not None
    await until(lambda: shadows.in_flight == 0, "every copy's task done")


async def test_a_tenth_is_copied_and_disagreeing_vectors_show_their_cosine(
    aiohttp_server: AiohttpServer,
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
) -> None:
    stable = await start_standin("stable-v1")
    shadow = await start_shadow(aiohttp_server, output=lambda v: [v[0], v[0]])
    shadow.gate.set()
    routes(routes_file, stable.url, shadow.url, 10)
    gateway = await start_gateway()
    await gateway.wait_weights(MODEL, {"stable-v1": 1, "shadow-v2": 0})

    assert await answers(gateway, [[1.0, 0.0]] * 100) == {(200, "stable-v1"): 100}
    await until(lambda: sum(outcomes(gateway).values()) == 10, "ten copies answered")
    assert outcomes(gateway) == {"compared": 5, "failed": 5}
    labels = {"model": MODEL, "version": "shadow-v2", "primary": "stable-v1"}
    mean = gateway.sample("modelroll_gateway_shadow_agreement_sum", **labels) / 5
    assert math.isclose(mean, math.sqrt(0.5))  # [1, 0] against [1, 1]
    # A request pinned to the shadow is answered by it, and not copied to it again.
    status, version, _ = await gateway.infer(MODEL, payload="x", version="shadow-v2")
    assert (status, version) == (200, "shadow-v2")


Shadowed = Callable[..., Awaitable[tuple[Gateway, Shadow]]]


@pytest.fixture
def shadowed(
    aiohttp_server: AiohttpServer,
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
) -> Shadowed:
    """``await shadowed(**config)``: a gateway whose stable's every request is copied to a
    shadow that answers at once (every other copy with a 500), and that shadow."""

    async def start(**settings: Any) -> tuple[Gateway, Shadow]:
        stable, shadow = await start_standin("stable-v1"), await start_shadow(aiohttp_server)
        shadow.gate.set()
        routes(routes_file, stable.url, shadow.url, 100)
        gateway = await start_gateway(**settings)
        await gateway.wait_weights(MODEL, {"stable-v1": 1, "shadow-v2": 0})
        return gateway, shadow

    return start


async def test_an_answer_over_the_bound_is_counted_not_compared(shadowed: Shadowed) -> None:
    gateway, _ = await shadowed(shadow_max_compare_bytes=1000)

    assert await answers(gateway, ["x" * 2000]) == {(200, "stable-v1"): 1}
    await until(lambda: bool(outcomes(gateway)), "the copy answered")
    assert outcomes(gateway) == {"too_large": 1}
    labels = {"model": MODEL, "version": "shadow-v2"}
    assert gateway.sample("modelroll_gateway_shadow_agreement_count", **labels) == 0


async def test_the_gateway_serves_while_a_comparison_runs(shadowed: Shadowed) -> None:
    """A comparison held until /livez has answered: the loop served it meanwhile."""
    gateway, _ = await shadowed()
    comparing, served = threading.Event(), threading.Event()
    released: list[bool] = []

    def held(primary: bytes, copy: bytes) -> float:
        comparing.set()
        # Bounded, so that a comparison run on the loop fails the test instead of hanging it.
        released.append(served.wait(10.0))
        return agreement(primary, copy)

    shadows = gateway.server.app[PROXY_KEY].shadows
    assert shadows is not None
    shadows.compare = held

    assert await answers(gateway, ["hello"]) == {(200, "stable-v1"): 1}
    await until(comparing.is_set, "the comparison started")
    async with gateway.session.get(gateway.url("/livez")) as resp:
        assert resp.status == 200
    served.set()
    await until(lambda: bool(outcomes(gateway)), "the comparison done")
    assert released == [True]
    assert outcomes(gateway) == {"compared": 1}


async def test_a_copy_is_marked_and_has_its_own_request_id_and_span(shadowed: Shadowed) -> None:
    gateway, shadow = await shadowed()

    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    sent = {"X-Request-Id": "req-7", "traceparent": f"00-{trace}-00f067aa0ba902b7-01"}
    assert (await gateway.infer(MODEL, headers=sent))[:2] == (200, "stable-v1")
    await until(lambda: bool(shadow.headers), "the copy received")
    copy = shadow.headers[0]
    assert copy["X-Modelroll-Shadow"] == "1"
    assert copy["X-Request-Id"] not in ("", "req-7")
    version, copy_trace, span, flags = copy["traceparent"].split("-")
    assert (version, copy_trace, flags) == ("00", trace, "01")
    assert span not in ("00f067aa0ba902b7", "0" * 16)


def test_agreement_of_labels_vectors_and_batches_of_vectors() -> None:
    def answer(output: Any) -> bytes:
        return json.dumps({"output": output}).encode()

    assert agreement(answer("positive"), answer("positive")) == 1.0
    assert agreement(answer("positive"), answer("negative")) == 0.0
    assert agreement(answer([3.0, 4.0]), answer([6.0, 8.0])) == 1.0
    assert agreement(answer([1.0, 0.0]), answer([-1.0, 0.0])) == -1.0
    batch = agreement(answer([[1.0, 0.0], [0.0, 1.0]]), answer([[1.0, 0.0], [1.0, 0.0]]))
    assert batch == 0.5
    assert agreement(answer([1.0, 2.0]), answer([1.0, 2.0, 3.0])) == 0.0  # another length

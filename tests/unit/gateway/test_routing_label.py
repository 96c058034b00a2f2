"""The ``routing`` label: requests pinned by header are counted apart from those routed by
weight, so that a canary analysis (which reads only the weighted ones) never judges them."""

from __future__ import annotations

from modelroll_common.calls import CALL_SIZE_HEADER
from tests.support.gateway import RoutesFile, StartGateway, StartStandIn, route


async def test_pinned_requests_are_counted_apart_from_weighted_ones(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable, canary = await start_standin("stable-v1"), await start_standin("canary-v2")
    routes_file.write(
        {
            "sentiment": route(
                "sentiment", ("stable-v1", 1, stable.url), ("canary-v2", 0, canary.url)
            )
        }
    )
    gw = await start_gateway()

    for _ in range(5):
        assert (await gw.infer("sentiment", version="canary-v2"))[0] == 200
    for _ in range(3):
        assert (await gw.infer("sentiment"))[:2] == (200, "stable-v1")

    def requests(version: str, routing: str) -> float:
        return gw.sample(
            "modelroll_gateway_requests_total", version=version, routing=routing, code="200"
        )

    def timed(version: str, routing: str) -> float:
        name = "modelroll_gateway_request_duration_seconds_count"
        return gw.sample(name, version=version, routing=routing)

    assert (requests("canary-v2", "pin"), requests("canary-v2", "weight")) == (5, 0)
    assert (requests("stable-v1", "pin"), requests("stable-v1", "weight")) == (0, 3)
    assert (timed("canary-v2", "pin"), timed("canary-v2", "weight")) == (5, 0)
    listed = {v["name"]: v for v in (await gw.routes())["models"][0]["versions"]}
    assert listed["canary-v2"]["requests"] == 5  # /v1/routes counts both


async def test_a_request_no_version_answered_has_no_routing(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable = await start_standin("stable-v1")
    routes_file.write({"sentiment": route("sentiment", ("stable-v1", 1, stable.url))})
    gw = await start_gateway()

    assert (await gw.infer("sentiment", version="v9"))[0] == 404

    labels = {"model": "sentiment", "version": "", "routing": "", "code": "404"}
    assert gw.sample("modelroll_gateway_requests_total", **labels) == 1


async def test_each_answer_counts_as_its_share_of_the_model_call_behind_it(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    """A batch of 4 answered 502 together is one failed model call, not four; an answer without
    a valid size is a call of its own."""
    stable = await start_standin("stable-v1")
    routes_file.write({"sentiment": route("sentiment", ("stable-v1", 1, stable.url))})
    gw = await start_gateway()

    for _ in range(4):
        assert (await gw.infer("sentiment", {"status": 502, "call_size": "4"}))[0] == 502
    for size in ("8", "0", "-3", "x"):
        assert (await gw.infer("sentiment", {"call_size": size}))[0] == 200
    async with gw.session.post(
        gw.url("/v1/models/sentiment/infer"), json={"payload": {"call_size": "8"}}
    ) as response:
        assert response.headers[CALL_SIZE_HEADER] == "8"  # passed on to the client

    def calls(code: str) -> float:
        return gw.sample("modelroll_gateway_model_calls_total", version="stable-v1", code=code)

    assert calls("502") == 1.0
    assert calls("200") == 0.125 * 2 + 3  # two answers of calls of 8; 0, -3, x are their own
    assert gw.sample("modelroll_gateway_requests_total", version="stable-v1", code="502") == 4
    name = "modelroll_gateway_model_call_duration_seconds_count"
    assert gw.sample(name, version="stable-v1") == 1.0 + 3.25

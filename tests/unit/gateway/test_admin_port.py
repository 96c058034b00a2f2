"""GET /metrics and GET /v1/routes name every version, weight-0 ones too, and their endpoints:
they are served on the admin port, for the scraper and the operator, and are unknown paths on the
port clients call, whoever the client is."""

from __future__ import annotations

import pytest

from modelroll_gateway import GatewayConfig
from tests.support.gateway import RoutesFile, StartGateway, StartStandIn, route


@pytest.mark.parametrize("path", ["/metrics", "/v1/routes"])
async def test_the_clients_port_does_not_serve_the_admin_paths_even_to_trusted_clients(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile, path: str
) -> None:
    stable, dark = await start_standin("stable-v1"), await start_standin("canary-v2")
    routes_file.write(
        {"sentiment": route("sentiment", ("stable-v1", 1, stable.url), ("canary-v2", 0, dark.url))}
    )
    gw = await start_gateway()  # it trusts the tests' client
    await gw.wait_served("sentiment")
    async with gw.session.get(gw.url(path)) as resp:
        assert resp.status == 404
        assert await resp.json() == {"error": f"no such path '{path}'"}


async def test_the_admin_port_serves_every_version_of_the_routes_with_its_metrics(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable, dark = await start_standin("stable-v1"), await start_standin("canary-v2")
    routes_file.write(
        {"sentiment": route("sentiment", ("stable-v1", 1, stable.url), ("canary-v2", 0, dark.url))}
    )
    gw = await start_gateway(trusted_networks=GatewayConfig().trusted_networks)  # none
    await gw.wait_weights("sentiment", {"stable-v1": 1, "canary-v2": 0})
    async with gw.session.get(gw.admin_url("/v1/routes")) as resp:
        assert resp.status == 200
        (model,) = (await resp.json())["models"]
    assert {v["name"]: v["endpoint"] for v in model["versions"]} == {
        "stable-v1": stable.url,
        "canary-v2": dark.url,
    }
    async with gw.session.get(gw.admin_url("/metrics")) as resp:
        assert resp.status == 200
        text = await resp.text()
    assert 'modelroll_gateway_weight{model="sentiment",version="canary-v2"} 0.0' in text
    async with gw.session.get(gw.admin_url("/v1/models")) as resp:
        assert resp.status == 404  # the admin port serves nothing else

"""What only trusted clients get: the routing table (GET /v1/routes, which names the versions'
internal endpoints) and, with --pin-trusted-only, pinning a version. The gateway listens on
loopback here, so the test client is trusted by default and untrusted once --trusted-networks
leaves loopback out."""

from __future__ import annotations

import logging

import openai
import pytest
from openai import AsyncOpenAI

from modelroll_gateway.cli import build_parser, config_from_args
from modelroll_gateway.config import parse_networks

from .conftest import Gateway, RoutesFile, StartEngine, StartGateway, StartStandIn, route

ELSEWHERE = parse_networks("192.0.2.0/24,2001:db8::/32")
"""Trusted networks that leave the test client (127.0.0.1) out."""


async def start(
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
    **settings: object,
) -> Gateway:
    """A gateway routing sentiment to stable (weight 1) and dark (weight 0)."""
    stable, dark = await start_standin("stable"), await start_standin("dark")
    routes_file.write(
        {"sentiment": route("sentiment", ("stable", 1, stable.url), ("dark", 0, dark.url))}
    )
    gw = await start_gateway(**settings)
    await gw.wait_served("sentiment")
    return gw


async def test_the_routing_table_is_served_to_loopback_by_default(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    gw = await start(start_gateway, start_standin, routes_file)
    doc = await gw.wait_for(lambda d: bool(d["models"]))
    (model,) = doc["models"]
    assert {v["name"]: v["weight"] for v in model["versions"]} == {"stable": 1, "dark": 0}
    assert all(v["endpoint"].startswith("http://127.0.0.1:") for v in model["versions"])


async def test_the_routing_table_is_refused_to_a_client_outside_the_trusted_networks(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    gw = await start(start_gateway, start_standin, routes_file, trusted_networks=ELSEWHERE)
    async with gw.session.get(gw.url("/v1/routes")) as resp:
        assert resp.status == 403
        message = (await resp.json())["error"]
    assert "GET /v1/routes is for operators" in message
    assert "127.0.0.1 is not in the gateway's --trusted-networks" in message
    assert "192.0.2.0" not in message  # what is trusted is not told
    # The models a client may call stay public.
    async with AsyncOpenAI(base_url=gw.url("/v1"), api_key="unused", max_retries=0) as client:
        assert [m.id async for m in client.models.list()] == ["sentiment"]


async def test_an_untrusted_clients_pin_is_honoured_unless_pins_are_for_trusted_clients_only(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    """Off by default, as before --pin-trusted-only existed: anyone may pin, a dark version
    too."""
    gw = await start(start_gateway, start_standin, routes_file, trusted_networks=ELSEWHERE)
    status, version, _ = await gw.infer("sentiment", version="dark")
    assert (status, version) == (200, "dark")
    status, version, _ = await gw.infer("sentiment", version="v9")
    assert status == 404


async def test_with_pins_for_trusted_clients_only_an_untrusted_pin_is_routed_by_weight(
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="modelroll_gateway")
    gw = await start(
        start_gateway,
        start_standin,
        routes_file,
        trusted_networks=ELSEWHERE,
        pin_trusted_only=True,
    )
    for pinned in ("dark", "v9", "stable"):  # a dark version, an unknown one: neither matters
        status, version, _ = await gw.infer("sentiment", version=pinned)
        assert (status, version) == (200, "stable")
    status, version, _ = await gw.infer("sentiment")
    assert (status, version) == (200, "stable")
    assert gw.sample("modelroll_gateway_pins_ignored_total") == 3
    ignored = [r.getMessage() for r in caplog.records if "Ignored the" in r.getMessage()]
    assert ignored == [
        "Ignored the X-Modelroll-Version header of a client at 127.0.0.1, outside "
        "--trusted-networks, and routed its request by weight; further ones are counted in "
        "modelroll_gateway_pins_ignored_total, not logged"
    ]


async def test_a_trusted_client_still_pins_with_pins_for_trusted_clients_only(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    gw = await start(start_gateway, start_standin, routes_file, pin_trusted_only=True)
    status, version, _ = await gw.infer("sentiment", version="dark")
    assert (status, version) == (200, "dark")
    assert gw.sample("modelroll_gateway_pins_ignored_total") == 0


async def test_an_untrusted_pin_on_an_openai_path_is_routed_by_weight_too(
    start_gateway: StartGateway, start_engine: StartEngine, routes_file: RoutesFile
) -> None:
    stable, dark = await start_engine(), await start_engine()
    routes_file.write({"embed": route("embed", ("stable", 1, stable), ("dark", 0, dark))})
    gw = await start_gateway(trusted_networks=ELSEWHERE, pin_trusted_only=True)
    await gw.wait_served("embed")
    async with AsyncOpenAI(
        base_url=gw.url("/v1"),
        api_key="unused",
        max_retries=0,
        default_headers={"X-Modelroll-Version": "dark"},
    ) as client:
        raw = await client.embeddings.with_raw_response.create(model="embed", input="hi")
        assert raw.headers["X-Modelroll-Version"] == "stable"
        with pytest.raises(openai.NotFoundError, match="unknown model 'nope'"):
            await client.embeddings.create(model="nope", input="hi")
    assert gw.sample("modelroll_gateway_pins_ignored_total") == 2  # both requests carried it


def test_trusted_networks_are_read_from_the_flag_or_its_variable() -> None:
    parser = build_parser({"MODELROLL_TRUSTED_NETWORKS": "10.244.0.0/16, 192.0.2.2"})
    config = config_from_args(parser.parse_args([]))
    assert [str(n) for n in config.trusted_networks] == ["10.244.0.0/16", "192.0.2.2/32"]
    assert (config.trusts("10.244.7.1"), config.trusts("::ffff:192.0.2.2")) == (True, True)
    assert (config.trusts("127.0.0.1"), config.trusts(None)) == (False, False)
    default = config_from_args(build_parser({}).parse_args([]))
    assert (default.trusts("127.0.0.1"), default.trusts("::1")) == (True, True)
    assert (default.trusts("10.0.0.1"), default.pin_trusted_only) == (False, False)
    switched = config_from_args(build_parser({"MODELROLL_PIN_TRUSTED_ONLY": "on"}).parse_args([]))
    assert switched.pin_trusted_only
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["--trusted-networks=10.1.2.3/8"])  # host bits: refused

"""Who may pin a version with its header: only clients in --trusted-networks, which are none by
default. Another client's header is ignored and its request routed by weight, so that its answer
is the same whatever the header names, a version (a dark one too) or a guess. The gateway listens
on loopback here; the tests' client is 127.0.0.1, or 127.0.0.6, the address Istio's sidecar
hands inbound connections over from."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from modelroll_gateway import GatewayConfig
from modelroll_gateway.cli import build_parser, config_from_args
from modelroll_gateway.config import parse_networks
from tests.support.gateway import (
    Gateway,
    RoutesFile,
    StandIn,
    StartEngine,
    StartGateway,
    StartStandIn,
    route,
)

DEFAULT = GatewayConfig().trusted_networks
"""The networks a gateway trusts when nobody names any."""
ISTIO_INBOUND = "127.0.0.6"
"""Where Istio's sidecar connects from when it hands a client's connection to the app."""
GUESS = "canary-v9"
"""A version name that no route has."""


async def start(
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
    **settings: object,
) -> tuple[Gateway, StandIn]:
    """A gateway routing sentiment to stable (weight 1) and dark (weight 0); and dark."""
    stable, dark = await start_standin("stable"), await start_standin("dark")
    routes_file.write(
        {"sentiment": route("sentiment", ("stable", 1, stable.url), ("dark", 0, dark.url))}
    )
    gw = await start_gateway(**settings)
    await gw.wait_served("sentiment")
    return gw, dark


async def answer(
    gw: Gateway, pinned: str, session: aiohttp.ClientSession | None = None
) -> tuple[int, str, Any]:
    """What a client sees for an inference pinned to `pinned`: status, the version header and
    the body."""
    async with (session or gw.session).post(
        gw.url("/v1/models/sentiment/infer"),
        json={"payload": "hello"},
        headers={"X-Modelroll-Version": pinned},
    ) as resp:
        return resp.status, resp.headers["X-Modelroll-Version"], await resp.json()


async def whole_answer(gw: Gateway, pinned: str) -> tuple[int, dict[str, str], bytes]:
    """Everything a client sees for an inference pinned to `pinned` but the Date header."""
    async with gw.session.post(
        gw.url("/v1/models/sentiment/infer"),
        json={"payload": "hello"},
        headers={"X-Modelroll-Version": pinned},
    ) as resp:
        headers = {k: v for k, v in resp.headers.items() if k != "Date"}
        return resp.status, headers, await resp.read()


async def test_by_default_no_client_reaches_a_dark_version_by_pinning_it(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    gw, dark = await start(start_gateway, start_standin, routes_file, trusted_networks=DEFAULT)
    for _ in range(5):
        status, version, body = await answer(gw, "dark")
        assert (status, version, body["version"]) == (200, "stable", "stable")
    assert dark.received == 0
    assert gw.sample("modelroll_gateway_pins_ignored_total") == 5


async def test_an_untrusted_client_gets_the_same_answer_for_a_version_and_for_a_guess(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    """Nothing in the answer, status, headers or body, tells that "dark" exists."""
    gw, _ = await start(start_gateway, start_standin, routes_file, trusted_networks=DEFAULT)
    real, guess = await whole_answer(gw, "dark"), await whole_answer(gw, GUESS)
    assert real == guess == await whole_answer(gw, "stable")
    assert real[0] == 200


async def test_a_client_from_istios_inbound_address_is_not_trusted_by_default(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    """Behind Istio's sidecar every client arrives from 127.0.0.6: trusting loopback would let
    every one of them pin. A platform that means it names the address."""
    assert not any(GatewayConfig().trusts(a) for a in (ISTIO_INBOUND, "127.0.0.1", "::1"))
    gw, dark = await start(start_gateway, start_standin, routes_file, trusted_networks=DEFAULT)
    meshed = aiohttp.TCPConnector(local_addr=(ISTIO_INBOUND, 0))
    async with aiohttp.ClientSession(connector=meshed) as session:
        assert (await answer(gw, "dark", session))[:2] == (200, "stable")
    assert dark.received == 0
    named, dark = await start(
        start_gateway, start_standin, routes_file, trusted_networks=parse_networks(ISTIO_INBOUND)
    )
    meshed = aiohttp.TCPConnector(local_addr=(ISTIO_INBOUND, 0))
    async with aiohttp.ClientSession(connector=meshed) as session:
        assert (await answer(named, "dark", session))[:2] == (200, "dark")
    assert dark.received == 1


async def test_a_trusted_client_pins_a_dark_version_and_is_told_a_guess_is_unknown(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    gw, dark = await start(start_gateway, start_standin, routes_file)  # trusts 127.0.0.1
    assert (await answer(gw, "dark"))[:2] == (200, "dark")
    status, version, body = await answer(gw, GUESS)
    assert (status, version) == (404, "")
    assert body == {"error": f"unknown version '{GUESS}' of model 'sentiment'"}
    assert (dark.received, gw.sample("modelroll_gateway_pins_ignored_total")) == (1, 0)


async def test_pins_from_any_client_let_an_untrusted_client_pin_and_tell_names_apart(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    """What --pins-from-any-client opens: every version to every client, and its name."""
    gw, dark = await start(
        start_gateway,
        start_standin,
        routes_file,
        trusted_networks=DEFAULT,
        pins_from_any_client=True,
    )
    assert (await answer(gw, "dark"))[:2] == (200, "dark")
    assert (await answer(gw, GUESS))[0] == 404
    assert dark.received == 1


async def test_the_first_ignored_pin_is_logged_and_every_one_counted(
    start_gateway: StartGateway,
    start_standin: StartStandIn,
    routes_file: RoutesFile,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="modelroll_gateway")
    gw, _ = await start(start_gateway, start_standin, routes_file, trusted_networks=DEFAULT)
    for pinned in ("dark", GUESS, "stable"):
        assert (await answer(gw, pinned))[:2] == (200, "stable")
    status, version, _ = await gw.infer("sentiment")
    assert (status, version) == (200, "stable")
    assert gw.sample("modelroll_gateway_pins_ignored_total") == 3
    ignored = [r.getMessage() for r in caplog.records if "Ignored the" in r.getMessage()]
    assert ignored == [
        "Ignored the X-Modelroll-Version header of a client at 127.0.0.1, outside "
        "--trusted-networks, and routed its request by weight; further ones are counted in "
        "modelroll_gateway_pins_ignored_total, not logged"
    ]


async def test_an_untrusted_pin_on_an_openai_path_is_routed_by_weight_too(
    start_gateway: StartGateway, start_engine: StartEngine, routes_file: RoutesFile
) -> None:
    stable, dark = await start_engine(), await start_engine()
    routes_file.write({"embed": route("embed", ("stable", 1, stable), ("dark", 0, dark))})
    gw = await start_gateway(trusted_networks=DEFAULT)
    await gw.wait_served("embed")
    for pinned in ("dark", GUESS):
        async with AsyncOpenAI(
            base_url=gw.url("/v1"),
            api_key="unused",
            max_retries=0,
            default_headers={"X-Modelroll-Version": pinned},
        ) as client:
            raw = await client.embeddings.with_raw_response.create(model="embed", input="hi")
            assert raw.headers["X-Modelroll-Version"] == "stable"
            with pytest.raises(openai.NotFoundError, match="unknown model 'nope'"):
                await client.embeddings.create(model="nope", input="hi")
    assert gw.sample("modelroll_gateway_pins_ignored_total") == 4  # every request carried it


def test_trusted_networks_and_pins_from_any_client_are_read_from_flags_or_variables() -> None:
    parser = build_parser({"MODELROLL_TRUSTED_NETWORKS": "10.244.0.0/16, 192.0.2.2"})
    config = config_from_args(parser.parse_args([]))
    assert [str(n) for n in config.trusted_networks] == ["10.244.0.0/16", "192.0.2.2/32"]
    assert (config.trusts("10.244.7.1"), config.trusts("::ffff:192.0.2.2")) == (True, True)
    assert (config.trusts("127.0.0.1"), config.trusts(None)) == (False, False)
    default = config_from_args(build_parser({}).parse_args([]))
    assert (default.trusted_networks, default.pins_from_any_client) == ((), False)
    opened = build_parser({"MODELROLL_PINS_FROM_ANY_CLIENT": "on"}).parse_args([])
    assert config_from_args(opened).pins_from_any_client
    flagged = build_parser({}).parse_args(["--pins-from-any-client"])
    assert config_from_args(flagged).pins_from_any_client
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["--trusted-networks=10.1.2.3/8"])  # host bits: refused

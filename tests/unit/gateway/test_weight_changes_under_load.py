"""Weight changes while traffic flows: not one request fails because of a change."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

from tests.support.gateway import RoutesFile, StartGateway, StartStandIn, route


async def test_a_request_in_flight_finishes_where_it_started(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    old, new = await start_standin("old"), await start_standin("new")
    routes_file.write({"m": route("m", ("old", 1, old.url))})
    gw = await start_gateway()
    slow = asyncio.create_task(gw.infer("m", payload={"sleep": 1.0}))
    await old.reached.wait()  # the request is at the old version now

    routes_file.write({"m": route("m", ("new", 1, new.url))})  # "old" is gone from the routes
    await gw.wait_weights("m", {"new": 1})
    assert (await gw.infer("m"))[:2] == (200, "new")

    status, version, body = await slow
    assert (status, version, body["version"]) == (200, "old", "old")


async def test_weights_changing_under_load_fail_no_request(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    a, b, c = [await start_standin(name) for name in ("a", "b", "c")]
    plans = [
        (("a", 9, a.url), ("b", 1, b.url)),
        (("a", 1, a.url), ("b", 1, b.url)),
        (("a", 0, a.url), ("b", 1, b.url), ("c", 3, c.url)),  # a goes dark, c joins
        (("b", 5, b.url), ("c", 5, c.url)),  # a removed while requests to it are in flight
        (("a", 2, c.url), ("c", 1, c.url)),  # a back, now served at c's endpoint
    ]
    routes_file.write({"m": route("m", *plans[0])})
    gw = await start_gateway()

    codes: Counter[int] = Counter()
    versions: Counter[str] = Counter()
    stop = asyncio.Event()

    async def client() -> None:
        for _ in range(2000):  # bounded; the changes end the run much sooner
            if stop.is_set():
                return
            status, version, _ = await gw.infer("m", payload={"sleep": 0.01})
            codes[status] += 1
            versions[version] += 1

    async def change_weights() -> None:
        for plan in itertools.islice(itertools.cycle(plans[1:] + plans[:1]), 15):
            await asyncio.sleep(0.1)
            routes_file.write({"m": route("m", *plan)})
            await gw.wait_weights("m", {name: weight for name, weight, _ in plan})
        stop.set()

    clients = [asyncio.create_task(client()) for _ in range(24)]
    await change_weights()
    await asyncio.gather(*clients)

    assert sum(codes.values()) > 200
    assert codes == {200: sum(codes.values())}, f"failed requests: {codes}"
    assert set(versions) == {"a", "b", "c"}
    assert gw.sample("modelroll_gateway_routes_updates_total") >= 16

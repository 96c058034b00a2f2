"""Sticky cohorts: a request key picks its version by weighted rendezvous hashing. As a canary's
weight grows, keys only move to it; the shares follow the weights; every gateway replica picks
the same version for a key; requests without the key keep the weighted round robin."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

from modelroll_gateway.cohorts import CohortPicker
from tests.support.gateway import RoutesFile, StartGateway, StartStandIn, route

KEYS = [f"user-{i}" for i in range(10_000)]
CANARY_WEIGHTS = (5, 20, 50)


STABLE, CANARY = "stable-v1", "canary-v2"


def picker(canary: int) -> CohortPicker[str]:
    """The versions by name, the canary at ``canary`` of 100."""
    return CohortPicker([(STABLE, STABLE, 100 - canary), (CANARY, CANARY, canary)])


def within_four_sigma(count: int, total: int, share: float) -> bool:
    """Whether ``count`` of ``total`` keys is within 4 binomial standard deviations of
    ``share``: about 1 in 16,000 for a fair hash."""
    return abs(count - total * share) <= 4 * math.sqrt(total * share * (1 - share))


def test_10000_keys_follow_the_weights_and_only_ever_move_to_the_growing_canary() -> None:
    on_canary: set[str] = set()
    for weight in CANARY_WEIGHTS:
        chosen = {key: picker(weight).pick(key) for key in KEYS}
        now = {key for key, version in chosen.items() if version == CANARY}
        assert within_four_sigma(len(now), len(KEYS), weight / 100), (weight, len(now))
        assert on_canary <= now, f"{len(on_canary - now)} keys went back at weight {weight}"
        on_canary = now
    # Back down (a rollback to 5): the keys that leave are exactly those that came last.
    assert {k for k in KEYS if picker(5).pick(k) == CANARY} <= on_canary


def test_a_version_at_weight_zero_gets_no_key_and_a_third_version_takes_only_its_share() -> None:
    two = CohortPicker([("a", "a", 1), ("b", "b", 0)])
    assert {two.pick(k) for k in KEYS[:1000]} == {"a"}
    before = {k: picker(20).pick(k) for k in KEYS}
    three = CohortPicker([(STABLE, STABLE, 80), (CANARY, CANARY, 20), ("other-v3", "other-v3", 25)])
    after = {k: three.pick(k) for k in KEYS}
    moved = [k for k in KEYS if after[k] != before[k]]
    assert all(after[k] == "other-v3" for k in moved)  # no key moves between the first two
    assert within_four_sigma(len(moved), len(KEYS), 0.2)


async def test_two_gateway_replicas_send_each_key_to_the_same_version(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable, canary = await start_standin("stable-v1"), await start_standin("canary-v2")

    def routes(canary_weight: int) -> None:
        versions = (
            ("stable-v1", 100 - canary_weight, stable.url),
            ("canary-v2", canary_weight, canary.url),
        )
        routes_file.write({"chat": route("chat", *versions, cohort_header="X-User-Id")})

    routes(20)
    replicas = [await start_gateway(), await start_gateway()]
    keys = KEYS[:600]

    async def versions(gateway_index: int) -> dict[str, str]:
        gateway = replicas[gateway_index]

        async def one(key: str) -> tuple[str, str]:
            status, version, _ = await gateway.infer("chat", headers={"x-user-id": key})
            assert status == 200
            return key, version

        seen: dict[str, str] = {}
        for at in range(0, len(keys), 50):
            seen.update(await asyncio.gather(*(one(k) for k in keys[at : at + 50])))
        return seen

    first, second = await versions(0), await versions(1)
    assert first == second
    assert first == {k: picker(20).pick(k) for k in keys}
    assert first == await versions(0)  # and the same key again gets the same version
    on_canary = {k for k, v in first.items() if v == "canary-v2"}

    routes(50)
    for gateway in replicas:
        await gateway.wait_weights("chat", {"stable-v1": 50, "canary-v2": 50})
    grown = await versions(1)
    assert on_canary <= {k for k, v in grown.items() if v == "canary-v2"}

    # Without the header: the weighted round robin, exact over each 2 requests at 50/50.
    plain = Counter([(await replicas[0].infer("chat"))[1] for _ in range(100)])
    assert plain == {"stable-v1": 50, "canary-v2": 50}
    assert (await replicas[0].routes())["models"][0]["cohortHeader"] == "X-User-Id"

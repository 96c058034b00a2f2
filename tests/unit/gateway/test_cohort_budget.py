"""A client picks its cohort key, and so its version: one key's requests reach a canary
analysis only up to the key's budget (--cohort-key-budget a minute), the rest are counted
apart, as ``routing="cohort_over_budget"``, and never judged.

The analysis's side is the operator's reader, reading the gateway's real /metrics."""

from __future__ import annotations

import itertools

from modelroll_gateway.cohorts import CohortPicker, KeyBudget
from modelroll_operator.analysis.reader import _Sums, add_exposition
from tests.support.gateway import Gateway, RoutesFile, StartGateway, StartStandIn, route

MODEL = "sentiment"
STABLE, CANARY = "stable-v1", "canary-v2"
HEADER = "X-User"


PICKER = CohortPicker([(STABLE, STABLE, 1), (CANARY, CANARY, 1)])
"""The versions' keys in the route below (weights 1:1): the pick is the same hash on every
gateway, so a client can find a key on the canary as easily."""


def a_key_on(version: str) -> str:
    return next(k for k in (f"user-{i}" for i in itertools.count()) if PICKER.pick(k) == version)


async def judged(gateway: Gateway) -> tuple[dict[str, float], dict[str, float]]:
    """The canary's judged and unjudged requests by code, as a canary analysis reads them from
    the gateway's /metrics."""
    async with gateway.session.get(gateway.admin_url("/metrics")) as resp:
        text = await resp.text()
    sums = _Sums()
    add_exposition(sums, text, MODEL, (CANARY, STABLE))
    counts = sums.counts(CANARY)
    return dict(counts.codes), dict(counts.pinned)


async def test_one_keys_failing_requests_reach_the_verdict_only_up_to_its_budget(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    stable, canary = await start_standin(STABLE), await start_standin(CANARY)
    routes_file.write(
        {
            MODEL: route(
                MODEL, (STABLE, 1, stable.url), (CANARY, 1, canary.url), cohort_header=HEADER
            )
        }
    )
    gateway = await start_gateway(cohort_key_budget=10)
    await gateway.wait_served(MODEL)

    key = a_key_on(CANARY)
    for _ in range(40):
        status, version, _ = await gateway.infer(MODEL, {"status": 500}, headers={HEADER: key})
        assert (status, version) == (500, CANARY)
    others = [f"other-{user}" for user in range(20)]
    for other in others:  # one request each: all judged
        assert (await gateway.infer(MODEL, headers={HEADER: other}))[0] == 200

    codes, apart = await judged(gateway)
    assert codes.get("500") == 10
    assert codes.get("200", 0) == sum(1 for other in others if PICKER.pick(other) == CANARY)
    assert apart.get("500") == 30
    over = {"model": MODEL, "version": CANARY, "routing": "cohort_over_budget", "code": "500"}
    assert gateway.sample("modelroll_gateway_requests_total", **over) == 30


def test_a_keys_budget_comes_back_after_its_window_and_other_keys_have_their_own() -> None:
    now = [0.0]
    budget = KeyBudget(3, window=60.0, clock=lambda: now[0])
    assert [budget.take(MODEL, "alice") for _ in range(4)] == [True, True, True, False]
    assert budget.take(MODEL, "bob")
    assert budget.take("another-model", "alice")  # a key's budget is per model
    now[0] = 59.9
    assert not budget.take(MODEL, "alice")
    now[0] = 60.0
    assert budget.take(MODEL, "alice")


def test_a_budget_of_zero_judges_no_request_routed_by_key() -> None:
    assert not KeyBudget(0).take(MODEL, "alice")

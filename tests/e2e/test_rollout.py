"""The rollout story end to end, under continuous load, with every figure measured and printed.

stable-v1 and canary-v2 of model ``sentiment`` at weights 9 and 1; canary-v2's model fails 20%
of its items. Driven with kubectl and ``kubectl modelroll`` the way a person would: the split,
per-version error ratios in Prometheus, a rollback by patching the weight, a promote, the
operator killed and restarted, a version deleted. The load generator sends rounds of 10
concurrent requests (see modelroll_devcluster.traffic): while it is the gateway's only client, a
round is 10 consecutive picks of the gateway's smooth weighted round-robin.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.traffic import Traffic, by_version, whole_rounds
from tests.support.stack import Rollout, eventually
from tests.support.story import (
    CANARY,
    MODEL,
    STABLE,
    WINDOW,
    assert_nothing_failed,
    describe,
    failed,
    gateway_weights,
    last_answer,
    ms,
    only_to,
    windows_after,
)

pytestmark = pytest.mark.e2e

ROUNDS_PER_SECOND = 20.0
PROPAGATION_BOUND_S = 1.0
#: How long each step watches the traffic after its change.
OBSERVE_S = 3.0
PROM_WINDOW = "30s"


def gateway_view(rollout: Rollout) -> list[tuple[str, int, str]]:
    model = rollout.routes().get(MODEL) or {"versions": []}
    return sorted((v["name"], v["weight"], v["endpoint"]) for v in model["versions"])


def observe(traffic: Traffic, after: float) -> None:
    """Wait until the load has run ``OBSERVE_S`` seconds past ``after`` (a round sent then)."""
    traffic.wait_for(WINDOW, after=after + OBSERVE_S, timeout=OBSERVE_S + 30)


Ratios = dict[str, float]


def error_ratios(rollout: Rollout, minimum: int) -> tuple[Ratios, float, Ratios]:
    """Per-version and blended error ratio over the last PROM_WINDOW, from Prometheus, once it
    has seen ``minimum`` requests of each version."""
    prometheus = rollout.prometheus_api()
    selector = f'namespace="{rollout.namespace}", model="{MODEL}"'
    total_q = f"sum by (version) (increase(modelroll_requests_total{{{selector}}}[{PROM_WINDOW}]))"
    errors_q = (
        f"sum by (version) (increase(modelroll_requests_total"
        f'{{{selector}, code=~"5..|422"}}[{PROM_WINDOW}]))'
    )

    def enough() -> dict[str, float] | None:
        totals = prometheus.by_label(total_q)
        seen = all(totals.get(v, 0) >= minimum for v in (STABLE, CANARY))
        return totals if seen else None

    within = max(60.0, rollout.settle_s)  # a cluster's Prometheus discovers new pods slowly
    totals = eventually(enough, f"Prometheus seeing {minimum} requests of each version", within)
    errors = prometheus.by_label(errors_q)
    ratios = {v: errors.get(v, 0.0) / totals[v] for v in (STABLE, CANARY)}
    blended = sum(errors.get(v, 0.0) for v in totals) / sum(totals.values())
    return ratios, blended, totals


def pinned_status(rollout: Rollout, version: str) -> int:
    request = urllib.request.Request(  # noqa: S310 (the gateway's http URL)
        f"{rollout.gateway_url}/v1/models/{MODEL}/infer",
        data=b'{"payload": "pinned"}',
        headers={"Content-Type": "application/json", "X-Modelroll-Version": version},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.timeout(300)
def test_the_rollout_story(rollout: Rollout, figures: Figures) -> None:
    # 1. Both versions at 9:1, applied with kubectl: every round of 10 splits exactly 9/1.
    rollout.kubectl("apply", "-f", "-", input=rollout.manifests_yaml())
    eventually(
        lambda: gateway_weights(rollout) == {STABLE: 9, CANARY: 1},
        "the gateway routing stable-v1:canary-v2 at 9:1",
        rollout.settle_s,
    )
    with Traffic(
        rollout.gateway_url, MODEL, window=WINDOW, rounds_per_second=ROUNDS_PER_SECOND
    ) as traffic:
        started = time.monotonic()
        traffic.wait_for(40 * WINDOW, after=started, timeout=60)
        windows = windows_after(traffic, started)
        assert len(windows) >= 40
        uneven = [w for w in windows if w != Counter({STABLE: 9, CANARY: 1})]
        assert not uneven, f"{len(uneven)} of {len(windows)} rounds were not 9/1: {uneven[:5]}"
        split = Counter(r.version for r in whole_rounds(traffic.since(started), WINDOW))
        total = sum(split.values())
        figures.add(
            "1. split",
            f"{len(windows)} consecutive rounds of {WINDOW}: every one 9 stable-v1 + 1 canary-v2;"
            f" overall {split[STABLE]}/{split[CANARY]} = "
            f"{split[STABLE] / total:.1%} / {split[CANARY] / total:.1%}",
        )

        # 2. Prometheus keeps the versions apart: the canary's 20% is not averaged away.
        ratios, blended, totals = error_ratios(rollout, minimum=150)
        client = by_version(traffic.since(started))
        figures.add(
            "2. error ratio (Prometheus)",
            f"canary-v2 {ratios[CANARY]:.1%}, stable-v1 {ratios[STABLE]:.1%}; blended "
            f"{blended:.1%} (increase over {PROM_WINDOW}: {totals[CANARY]:.0f} canary-v2, "
            f"{totals[STABLE]:.0f} stable-v1 requests)",
        )
        figures.add(
            "2. error ratio (load generator)",
            f"canary-v2 {client[CANARY].error_ratio:.1%} of {client[CANARY].requests}, "
            f"stable-v1 {client[STABLE].error_ratio:.1%} of {client[STABLE].requests}",
        )
        assert ratios[STABLE] == 0.0
        assert 0.1 < ratios[CANARY] < 0.3
        assert 0.005 < blended < 0.05

        # 3. Rollback: weight 0 with kubectl patch. Within 1 s nothing reaches canary-v2.
        patching = time.monotonic()
        rollout.kubectl("patch", "mv", CANARY, "--type", "merge", "-p", '{"spec":{"weight":0}}')
        patched = time.monotonic()
        observe(traffic, patched)
        propagation, late = last_answer(traffic, CANARY, patched)
        whole_path, from_start = last_answer(traffic, CANARY, patching)
        figures.add(
            "3. rollback propagation",
            f"{ms(propagation)} from `kubectl patch` returning to the last response from "
            f"canary-v2 ({late} requests sent after it returned still reached canary-v2; "
            f"bound {ms(PROPAGATION_BOUND_S)}). Counted from the moment kubectl started: "
            f"{ms(whole_path)}, {from_start} requests (kubectl itself took "
            f"{ms(patched - patching)})",
        )
        assert propagation < PROPAGATION_BOUND_S
        only_to(traffic, STABLE, patched + PROPAGATION_BOUND_S)
        switch = failed(traffic.since(started))
        figures.add("3. failed requests, start to rollback", f"{len(switch)}")
        assert not switch, describe(switch)

        # 4. Promote with the plugin: all traffic moves to canary-v2.
        promoting = time.monotonic()
        promote = rollout.plugin("promote", CANARY)
        promoted = time.monotonic()
        print(promote.stdout)
        observe(traffic, promoted)
        moved, _ = last_answer(traffic, STABLE, promoted)
        figures.add(
            "4. promote",
            f"`kubectl modelroll promote canary-v2` took {ms(promoted - promoting)} (it waits "
            f"for the operator); last response from stable-v1 {ms(moved)} after it returned; "
            f"gateway weights now {gateway_weights(rollout)}",
        )
        assert gateway_weights(rollout) == {STABLE: 0, CANARY: 9}
        only_to(traffic, CANARY, promoted + PROPAGATION_BOUND_S)

        # 5. Kill the operator mid-traffic and start it again: routing never notices.
        routes_before, view_before = rollout.configmap_data(), gateway_view(rollout)
        killed = time.monotonic()
        rollout.kill_operator()
        time.sleep(2.0)
        rollout.start_operator()
        restarted = time.monotonic()
        observe(traffic, restarted)
        during = traffic.since(killed)
        routes_after, view_after = rollout.configmap_data(), gateway_view(rollout)
        figures.add(
            "5. operator killed and restarted",
            f"down {restarted - killed:.1f} s; {len(during)} requests meanwhile and after, "
            f"{len(failed(during))} failed; routes identical afterwards: "
            f"{routes_after == routes_before and view_after == view_before}",
        )
        assert not failed(during), describe(failed(during))
        assert {r.version for r in during} == {CANARY}
        assert routes_after == routes_before
        assert view_after == view_before

        # 6. Delete a version: its route is gone.
        deleting = time.monotonic()
        rollout.kubectl("delete", "mv", STABLE, "--timeout=60s")

        def gone() -> bool:
            in_configmap = STABLE in rollout.configmap_data().get(MODEL, "")
            return not in_configmap and STABLE not in gateway_weights(rollout)

        eventually(gone, "stable-v1's route removed", 10)
        removed = time.monotonic() - deleting
        pinned = pinned_status(rollout, STABLE)
        figures.add(
            "6. delete",
            f"stable-v1's route gone {ms(removed)} after `kubectl delete` started; a request "
            f"pinned to it now gets {pinned}; routes: {gateway_weights(rollout)}",
        )
        assert pinned == 404
        assert gateway_weights(rollout) == {CANARY: 9}
        observe(traffic, time.monotonic())

    assert_nothing_failed(figures, "failed requests", traffic.since(started))

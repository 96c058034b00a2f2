"""A one-replica canary promoted under load on the node, and rolled back right after.

promote-stable runs two replicas of the demo model at a known capacity (each request one model
call of 400 ms, eight at a time per replica: 20 requests a second a replica) and takes all of
the model's traffic; promote-canary, the same model, runs one replica at weight 0. Open-loop
load at 70% of the stable's capacity goes through the chart's gateway while ``kubectl modelroll
promote`` gives the canary all of it and ``kubectl modelroll rollback`` gives it back. (Two
replicas, where ``make bench-promote`` runs three: the canary's new pod starts on the two cores
that serve, and one new pod is what this node can start without stalling the others.)

With scale before shift (the chart's default), the canary has the stable's two ready replicas
before its weight is in force, and the old stable keeps its replicas, so the rollback finds it
warm: no request fails (no 5xx, no 429, no connection error) and the p99 of every phase stays
within the plan's SLO (five model calls). One replica alone would get 1.4 times its capacity:
its queue fills and it answers 429.

The scenario and its windows are modelroll_bench.promotion's, which ``make bench-promote``
measures with and without scale before shift.
"""

from __future__ import annotations

import pytest

from modelroll_bench.promotion import (
    CANARY,
    STABLE,
    Plan,
    PromotionError,
    Target,
    Window,
    promote_and_roll_back,
    windows,
)
from modelroll_devcluster.pytest_plugin import Figures
from tests.support.incluster import InCluster

pytestmark = pytest.mark.node

PLAN = Plan(stable_replicas=2)


def shown(w: Window) -> str:
    failures = ", ".join(f"{n} {k}" for k, n in w.failures.items()) or "none"
    if w.failed_by:
        failures += f" (from {w.failed_by})"
    return (
        f"{w.requests} requests, failed: {failures}; p50/p95/p99 {w.p50_ms}/{w.p95_ms}/"
        f"{w.p99_ms} ms; answered by {w.answered_by}"
    )


@pytest.mark.timeout(900)
def test_a_promotion_under_load_waits_for_replicas_and_loses_nothing(
    story: InCluster, figures: Figures
) -> None:
    target = Target(story.cluster, story.namespace, story.gateway_url, story.gateway_admin_url)
    try:
        run = promote_and_roll_back(target, PLAN, "scale before shift")
    except PromotionError as err:
        pytest.fail(str(err), pytrace=False)
    phases = {w.phase: w for w in windows(run)}
    for w in phases.values():
        figures.add(f"node: promotion at {run.rate:g} req/s, {w.phase}", shown(w))
    for s in (run.promote, run.rollback):
        figures.add(
            f"node: {s.command} -> in force",
            f"{s.to_force_s:.1f} s; {s.rising} had {s.ready_at_force} ready replicas and "
            f"{s.endpoints_at_force} ready endpoints then, the other version at least "
            f"{s.others_min_ready} ready replicas meanwhile"
            + (
                " (its Capacity condition said WaitingForReplicas meanwhile)"
                if s.waited_for_capacity
                else ""
            ),
        )

    replicas = PLAN.stable_replicas
    assert run.promote.ready_at_force >= replicas, (
        f"{CANARY}'s weight came into force with {run.promote.ready_at_force} ready replicas, "
        f"not the {replicas} its share needs"
    )
    assert run.rollback.ready_at_force >= replicas, (
        f"{STABLE} got its traffic back with {run.rollback.ready_at_force} ready replicas: "
        "not kept warm"
    )
    # The traffic moved, and whole: only the canary answered once promoted, only the stable
    # once rolled back.
    assert set(phases["promoted"].answered_by) == {CANARY}, phases["promoted"]
    assert set(phases["rolled back"].answered_by) == {STABLE}, phases["rolled back"]
    for w in phases.values():
        assert not w.failures, f"{w.phase}: {shown(w)}"
        assert w.p99_ms is not None, f"{w.phase}: no request answered"
        assert w.p99_ms <= PLAN.slo_ms, f"{w.phase}: {shown(w)}, over {PLAN.slo_ms:g} ms"

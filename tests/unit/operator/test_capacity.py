"""Scale before shift (capacity.py): which replicas a share needs, when a move waits, and how
long a version that lost traffic stays warm."""

from __future__ import annotations

from dataclasses import replace

from modelroll_operator.capacity import Floor, Member, decide

NOW = 1_000_000.0
DELAY = 600


def stable(ready: int = 8, floor: Floor | None = None) -> Member:
    return Member("stable", replicas=8, ready=ready, floor=floor, delay_s=DELAY)


def canary(ready: int = 1, floor: Floor | None = None, **kw: object) -> Member:
    return Member("canary", replicas=1, ready=ready, floor=floor, delay_s=DELAY, **kw)  # type: ignore[arg-type]


def test_a_promotion_waits_until_the_canary_has_the_stables_replicas() -> None:
    decision = decide(
        "m", [stable(), canary()], {"stable": 0, "canary": 100}, {"stable": 100, "canary": 0}, NOW
    )
    assert not decision.shift
    verdict = decision.verdicts["canary"]
    assert verdict.floor == Floor(8, 1.0)  # its Deployment is raised to 8 now
    assert (verdict.ready, verdict.reason) == (False, "WaitingForReplicas")
    assert "8 ready replicas before it takes 100.0% of model m's traffic: 1 ready" in (
        verdict.message
    )
    assert decision.waiting == (f"canary: {verdict.message}",)
    assert decision.verdicts["stable"].ready


def test_the_weights_move_once_the_replicas_are_ready_and_the_old_stable_stays_warm() -> None:
    waited = Floor(8, 1.0)
    decision = decide(
        "m",
        [stable(), canary(ready=8, floor=waited)],
        {"stable": 0, "canary": 100},
        {"stable": 100, "canary": 0},
        NOW,
    )
    assert decision.shift
    assert decision.verdicts["canary"].floor == waited  # kept while it takes the traffic
    old = decision.verdicts["stable"]
    assert old.floor == Floor(8, 1.0, NOW + DELAY)
    assert (old.ready, old.reason) == (True, "KeptWarm")
    assert decision.next_change() == NOW + DELAY


def test_a_rollback_right_after_a_promotion_needs_no_new_replica() -> None:
    warm = Floor(8, 1.0, NOW + DELAY)
    decision = decide(
        "m",
        [stable(floor=warm), canary(ready=8, floor=Floor(8, 1.0))],
        {"stable": 100, "canary": 0},
        {"stable": 0, "canary": 100},
        NOW + 5,
    )
    assert decision.shift
    assert decision.verdicts["stable"].ready


def test_a_warm_version_scales_back_once_its_delay_is_over() -> None:
    warm = Floor(8, 1.0, NOW + DELAY)
    members = [Member("old", 1, 8, warm, DELAY), Member("new", 1, 8, Floor(8, 1.0), DELAY)]
    weights = {"old": 0, "new": 100}
    during = decide("m", members, weights, weights, NOW + DELAY - 1)
    assert during.verdicts["old"].floor == warm
    after = decide("m", members, weights, weights, NOW + DELAY + 1)
    assert after.verdicts["old"].floor is None  # back to spec.replicas
    assert after.verdicts["new"].floor == Floor(8, 1.0)
    assert after.next_change() is None


def test_a_canary_step_needs_its_share_of_the_stables_replicas() -> None:
    decision = decide(
        "m", [stable(), canary(ready=3)], {"stable": 50, "canary": 50}, {"stable": 100}, NOW
    )
    assert not decision.shift
    assert decision.verdicts["canary"].floor == Floor(4, 0.5)
    ready = decide(
        "m", [stable(), canary(ready=4)], {"stable": 50, "canary": 50}, {"stable": 100}, NOW
    )
    assert ready.shift


def test_a_canary_at_a_tenth_of_the_traffic_needs_one_replica() -> None:
    decision = decide("m", [stable(), canary()], {"stable": 90, "canary": 10}, {"stable": 100}, NOW)
    assert decision.shift


def test_a_version_whose_pods_cannot_be_created_holds_the_move_with_the_reason() -> None:
    quota = 'pods "canary-1" is forbidden: exceeded quota: compute'
    decision = decide(
        "m",
        [stable(), canary(failure=quota)],
        {"stable": 0, "canary": 100},
        {"stable": 100, "canary": 0},
        NOW,
    )
    assert not decision.shift
    verdict = decision.verdicts["canary"]
    assert (verdict.ready, verdict.reason) == (False, "ReplicasUnavailable")
    assert quota in verdict.message


def test_an_autoscaled_version_needs_no_more_than_its_max_and_hands_over_after_the_delay() -> None:
    scaled = canary(ready=5, max_replicas=5)
    decision = decide("m", [stable(), scaled], {"stable": 0, "canary": 100}, {"stable": 100}, NOW)
    assert decision.shift
    assert decision.verdicts["canary"].floor == Floor(5, 1.0, NOW + DELAY)
    later = replace(scaled, floor=Floor(5, 1.0, NOW + DELAY))
    after = decide("m", [later], {"canary": 100}, {"canary": 100}, NOW + DELAY + 1)
    assert after.verdicts["canary"].floor is None  # the autoscaler owns its replicas now


def test_a_new_model_goes_into_its_route_at_once() -> None:
    decision = decide("m", [stable(ready=1), canary()], {"stable": 90, "canary": 10}, {}, NOW)
    assert decision.shift
    assert all(v.ready for v in decision.verdicts.values())


def test_a_floor_read_back_from_status_is_the_one_written() -> None:
    floor = Floor(8, 0.9090909, NOW + DELAY)
    back = Floor.from_status(floor.to_status())
    assert (back.replicas, back.until) == (8, NOW + DELAY)
    # Read back to a tenth of a percent, it still covers the share it was kept for.
    member = stable(floor=back)
    decision = decide(
        "m", [member, canary(ready=9)], {"stable": 100, "canary": 10}, {"canary": 100}, NOW
    )
    assert decision.shift


def test_a_rollback_patched_one_version_at_a_time_still_needs_no_new_replica() -> None:
    """`kubectl modelroll rollback` patches the versions in turn: first both take half, then
    the canary none. The stable, warm for all of the traffic, takes it back at once."""
    warm = Floor(3, 1.0, NOW + DELAY)
    members = [
        Member("stable", 3, 3, warm, DELAY),
        Member("canary", 1, 3, Floor(3, 1.0), DELAY),
    ]
    halfway = decide(
        "m", members, {"stable": 100, "canary": 100}, {"stable": 0, "canary": 100}, NOW
    )
    assert halfway.shift
    floors = {n: v.floor for n, v in halfway.verdicts.items()}
    members = [replace(m, floor=floors[m.name]) for m in members]
    done = decide(
        "m", members, {"stable": 100, "canary": 0}, {"stable": 100, "canary": 100}, NOW + 1
    )
    assert done.shift


def test_beside_an_external_stable_a_canary_is_not_sized_from_its_own_small_share() -> None:
    """The operator does not know an external version's replicas: a managed canary at a tenth,
    with 1 replica, is no measure of the model's traffic."""
    decision = decide(
        "m", [canary()], {"stable": 10, "canary": 90}, {"stable": 90, "canary": 10}, NOW
    )
    assert decision.shift
    assert decision.verdicts["canary"].floor == Floor(1, 0.9)


def test_the_last_version_of_a_90_10_split_takes_all_of_it_on_as_many_replicas() -> None:
    """Within the HPA's 10% tolerance: no extra replica for the tenth the stable did not carry,
    so promoting and rolling back again and again never grows the model."""
    one = Member("stable", 1, 1, None, DELAY)
    decision = decide(
        "m", [one, canary()], {"stable": 0, "canary": 100}, {"stable": 90, "canary": 10}, NOW
    )
    assert decision.shift
    eight = stable()
    decision = decide(
        "m", [eight, canary()], {"stable": 0, "canary": 100}, {"stable": 100, "canary": 10}, NOW
    )
    assert decision.verdicts["canary"].floor == Floor(8, 1.0)


def test_a_promote_patched_in_two_steps_needs_the_stables_replicas_not_more() -> None:
    """`kubectl modelroll promote` patches the canary up first, then the stable down: the model
    is at 50/50 in between. The stable, kept warm for all of the traffic, still measures it."""
    two = Member("stable", 2, 2, None, DELAY)
    first = decide(
        "m", [two, canary()], {"stable": 100, "canary": 100}, {"stable": 100, "canary": 0}, NOW
    )
    assert first.shift  # a half needs ceil(0.9 x 0.5 x 2) = 1 replica
    floors = {n: v.floor for n, v in first.verdicts.items()}
    members = [replace(m, floor=floors[m.name]) for m in (two, canary(ready=1))]
    second = decide(
        "m", members, {"stable": 0, "canary": 100}, {"stable": 100, "canary": 100}, NOW + 1
    )
    assert second.verdicts["canary"].floor == Floor(2, 1.0)

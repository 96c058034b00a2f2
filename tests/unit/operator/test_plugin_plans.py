"""What `kubectl modelroll promote` and `rollback` will patch, and when they refuse."""

from __future__ import annotations

import pytest

from modelroll_operator.plugin import (
    PluginError,
    Version,
    WeightChange,
    build_parser,
    plan_promote,
    plan_rollback,
    render_table,
)


def mv(name: str, weight: int, ready: bool = True, previous: int | None = None) -> Version:
    return Version(
        namespace="prod",
        name=name,
        model="sentiment",
        weight=weight,
        generation=1,
        share="-",
        ready="True" if ready else "False",
        ready_reason="ReplicasReady" if ready else "ReplicasNotReady",
        ready_message="1 of 1 replicas ready" if ready else "0 of 1 replicas ready",
        routed="Routed",
        endpoint="http://x:8000",
        previous_weight=previous,
        deleting=False,
    )


def test_promote_gives_the_version_the_models_whole_weight_first() -> None:
    changes = plan_promote(mv("canary", 1), [mv("stable", 9), mv("dark", 0)], force=False)
    assert changes == [
        WeightChange("canary", 1, 10, remember=True),
        WeightChange("stable", 9, 0, remember=True),
    ]


def test_promote_twice_changes_nothing_the_second_time() -> None:
    assert plan_promote(mv("canary", 10), [mv("stable", 0, previous=9)], force=False) == []


def test_promote_refuses_a_version_that_is_not_ready() -> None:
    with pytest.raises(PluginError, match=r"canary is not Ready \(ReplicasNotReady"):
        plan_promote(mv("canary", 1, ready=False), [mv("stable", 9)], force=False)
    forced = plan_promote(mv("canary", 1, ready=False), [mv("stable", 9)], force=True)
    assert [c.after for c in forced] == [10, 0]


def test_promote_caps_the_weight_at_the_crds_maximum() -> None:
    changes = plan_promote(mv("canary", 600), [mv("stable", 900)], force=False)
    assert changes[0].after == 1000


def test_rollback_restores_the_weights_from_before_the_promote_then_drops_the_version() -> None:
    changes = plan_rollback(mv("canary", 10), [mv("stable", 0, previous=9)], force=False)
    assert changes == [
        WeightChange("stable", 0, 9, remember=False),
        WeightChange("canary", 10, 0, remember=True),
    ]


def test_rollback_of_a_canary_that_was_never_promoted_only_drops_it() -> None:
    changes = plan_rollback(mv("canary", 1), [mv("stable", 9)], force=False)
    assert changes == [WeightChange("canary", 1, 0, remember=True)]


def test_rollback_refuses_to_leave_the_model_without_traffic() -> None:
    with pytest.raises(PluginError, match="no Ready version that has weight"):
        plan_rollback(mv("canary", 10), [mv("stable", 0)], force=False)
    with pytest.raises(PluginError, match="no Ready version that has weight"):
        plan_rollback(mv("canary", 10), [mv("stable", 0, ready=False, previous=9)], force=False)


def test_the_status_table_lists_versions_by_model() -> None:
    table = render_table([mv("stable", 9), mv("canary", 1)]).splitlines()
    assert table[0].split() == [
        "MODEL",
        "VERSION",
        "WEIGHT",
        "SHARE",
        "READY",
        "ROUTED",
        "ENDPOINT",
    ]
    assert [line.split()[1] for line in table[1:]] == ["canary", "stable"]


def test_the_namespace_flag_may_come_before_or_after_the_command() -> None:
    before = build_parser().parse_args(["-n", "prod", "promote", "canary"])
    after = build_parser().parse_args(["promote", "canary", "-n", "prod", "--wait=0"])
    neither = build_parser().parse_args(["status"])
    assert (before.namespace, after.namespace, neither.namespace) == ("prod", "prod", None)
    assert (after.version, after.wait, after.force) == ("canary", 0.0, False)

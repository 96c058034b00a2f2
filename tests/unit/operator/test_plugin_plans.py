"""What `kubectl modelroll set-weight`, `promote` and `rollback` patch, and when they refuse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelroll_operator.plugin.cli import build_parser
from modelroll_operator.plugin.plans import (
    Change,
    Memory,
    Plan,
    PluginError,
    Version,
    plan_promote,
    plan_rollback,
    plan_set_weight,
    render_notes,
    render_table,
)
from modelroll_operator.spec import ANNOTATION_BEFORE_PROMOTE

BEFORE = ANNOTATION_BEFORE_PROMOTE


def body(
    name: str, weight: int, ready: bool = True, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A ModelVersion as the API server returns it (after the operator reported on it)."""
    return {
        "metadata": {
            "name": name,
            "namespace": "prod",
            "generation": 1,
            "annotations": dict(annotations or {}),
        },
        "spec": {"model": "sentiment", "weight": weight, "endpoint": f"http://{name}:8000"},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "ReplicasReady" if ready else "ReplicasNotReady",
                    "message": "1 of 1 replicas ready" if ready else "0 of 1 replicas ready",
                },
                {"type": "Routed", "status": "True", "reason": "Routed"},
            ],
            **({"routedWeight": weight} if ready else {}),
        },
    }


def mv(
    name: str,
    weight: int,
    ready: bool = True,
    remembers: dict[str, int] | str | None = None,
) -> Version:
    """``remembers``: the weights of a promote of this version (a dict), or the raw annotation."""
    annotations = {}
    if isinstance(remembers, dict):
        annotations[BEFORE] = json.dumps({"model": "sentiment", "weights": remembers})
    elif remembers is not None:
        annotations[BEFORE] = remembers
    return Version.from_body(body(name, weight, ready, annotations))


class Model:
    """A model's versions as stored, changed the way the API server applies the plan's patches.

    The patches are JSON merge patches (RFC 7386): a null removes a key. The real API server
    runs the same plans in tests/integration/test_plugin.py.
    """

    def __init__(self, **weights: int) -> None:
        self.bodies = {name: body(name, weight) for name, weight in weights.items()}

    def split(self, name: str) -> tuple[Version, list[Version]]:
        versions = [Version.from_body(b) for b in self.bodies.values()]
        target = next(v for v in versions if v.name == name)
        return target, [v for v in versions if v.name != name]

    def apply(self, plan: Plan) -> None:
        for change in plan.changes:
            merge(self.bodies[change.version], change.patch())

    def weights(self) -> dict[str, int]:
        return {name: b["spec"]["weight"] for name, b in self.bodies.items()}

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.bodies[name]["metadata"].get("annotations") or {})


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            merge(target.setdefault(key, {}), value)
        else:
            target[key] = value


def test_promote_gives_the_version_the_models_whole_weight_and_remembers_every_weight() -> None:
    plan = plan_promote(
        mv("canary", 1), [mv("stable", 9), mv("dark", 0)], force=False, at="2025-01-02T03:04:05Z"
    )
    assert [(c.version, c.before, c.after) for c in plan.changes] == [
        ("canary", 1, 10),
        ("stable", 9, 0),
    ]
    remembered = plan.changes[0].patch()["metadata"]["annotations"][BEFORE]
    assert json.loads(remembered) == {
        "model": "sentiment",
        "at": "2025-01-02T03:04:05Z",
        "weights": {"canary": 1, "dark": 0, "stable": 9},
    }
    assert plan.changes[1].patch() == {"spec": {"weight": 0}}


def test_promote_twice_changes_and_remembers_nothing_the_second_time() -> None:
    promoted = mv("canary", 10, remembers={"canary": 1, "stable": 9})
    assert plan_promote(promoted, [mv("stable", 0)], force=False).changes == []


def test_promote_refuses_a_version_that_is_not_ready() -> None:
    with pytest.raises(PluginError, match=r"canary is not Ready \(ReplicasNotReady"):
        plan_promote(mv("canary", 1, ready=False), [mv("stable", 9)], force=False)
    forced = plan_promote(mv("canary", 1, ready=False), [mv("stable", 9)], force=True)
    assert [c.after for c in forced.changes] == [10, 0]


def test_promote_caps_the_weight_at_the_crds_maximum() -> None:
    plan = plan_promote(mv("canary", 600), [mv("stable", 900)], force=False)
    assert plan.changes[0].after == 1000


def test_promote_takes_the_memory_of_an_older_promote_away_from_every_other_version() -> None:
    """Even from a version already at 0, which needs no new weight: else it could be rolled
    back to the state before that older promote."""
    plan = plan_promote(
        mv("v3", 0),
        [mv("v1", 5), mv("v2", 0, remembers={"v1": 9, "v2": 1})],
        force=False,
    )
    assert [(c.version, c.after) for c in plan.changes] == [("v3", 5), ("v1", 0), ("v2", 0)]
    assert plan.changes[2].patch() == {
        "spec": {"weight": 0},
        "metadata": {"annotations": {BEFORE: None}},
    }
    assert plan.changes[2].describe() == f"modelversion/v2 weight 0 (unchanged), removed {BEFORE}"


def test_rollback_after_two_promotes_restores_the_state_right_before_the_last_one() -> None:
    model = Model(v1=9, v2=1, v3=0)
    model.apply(plan_promote(*model.split("v2"), force=False))
    assert model.weights() == {"v1": 0, "v2": 10, "v3": 0}
    model.apply(plan_promote(*model.split("v3"), force=False))
    assert model.weights() == {"v1": 0, "v2": 0, "v3": 10}
    assert BEFORE not in model.annotations("v2")

    plan = plan_rollback(*model.split("v3"), force=False)
    assert [(c.version, c.before, c.after) for c in plan.changes] == [
        ("v2", 0, 10),
        ("v3", 10, 0),
    ]
    model.apply(plan)
    assert model.weights() == {"v1": 0, "v2": 10, "v3": 0}  # v1 stays at 0, as it was
    assert [BEFORE in model.annotations(n) for n in ("v1", "v2", "v3")] == [False, False, False]
    # v2's promote is forgotten: rolling v2 back now cannot bring v1's 9 back.
    with pytest.raises(PluginError, match="no Ready version that has weight"):
        plan_rollback(*model.split("v2"), force=False)


def test_rollback_restores_exactly_the_weights_from_before_the_promote() -> None:
    plan = plan_rollback(
        mv("canary", 10, remembers={"canary": 1, "stable": 9}), [mv("stable", 0)], force=False
    )
    assert plan.changes == [
        Change("stable", 0, 9),
        Change("canary", 10, 1, forget=(BEFORE,)),  # its own weight too: 90/10 again
    ]
    assert plan.changes[1].patch() == {
        "spec": {"weight": 1},
        "metadata": {"annotations": {BEFORE: None}},
    }


def test_rollback_of_a_canary_that_was_never_promoted_only_drops_it() -> None:
    plan = plan_rollback(mv("canary", 1), [mv("stable", 9)], force=False)
    assert plan.changes == [Change("canary", 1, 0)]
    assert plan.notes == []


def test_rollback_refuses_to_leave_the_model_without_traffic() -> None:
    with pytest.raises(PluginError, match="no Ready version that has weight") as refused:
        plan_rollback(mv("canary", 10), [mv("stable", 0)], force=False)
    assert "Nothing was changed" in str(refused.value)
    assert "kubectl modelroll -n prod set-weight VERSION WEIGHT" in str(refused.value)
    not_ready = mv("stable", 0, ready=False)
    with pytest.raises(PluginError, match="no Ready version that has weight"):
        plan_rollback(mv("canary", 10, remembers={"stable": 9}), [not_ready], force=False)
    forced = plan_rollback(mv("canary", 10, remembers={"stable": 9}), [not_ready], force=True)
    assert [(c.version, c.after) for c in forced.changes] == [("stable", 9), ("canary", 0)]


def test_rollback_leaves_versions_created_deleted_or_changed_since_the_promote_and_says_so() -> (
    None
):
    canary = mv("canary", 10, remembers={"canary": 1, "stable": 9, "old": 3, "other": 2})
    siblings = [mv("stable", 0), mv("other", 4), mv("new", 2)]  # "old" was deleted
    plan = plan_rollback(canary, siblings, force=False)
    assert [(c.version, c.after) for c in plan.changes] == [("stable", 9), ("canary", 1)]
    assert plan.notes == [
        "old (weight 3 before the promote) no longer exists: skipped",
        "other keeps weight 4: it was changed after the promote of canary (it had 2 before it)",
        "new keeps weight 2: it was created after the promote of canary",
    ]


@pytest.mark.parametrize(
    ("annotation", "why"),
    [
        ("abc", "not JSON (Expecting value: line 1 column 1 (char 0))"),
        ("-5", "expected a JSON object, found -5"),
        ("99999", "expected a JSON object, found 99999"),
        ('{"weights": {"stable": -5}}', "the weight of stable is -5, outside 0..1000"),
        ('{"weights": {"stable": 99999}}', "the weight of stable is 99999, outside 0..1000"),
        ('{"weights": {"stable": "abc"}}', 'the weight of stable is "abc", not an integer'),
        ('{"weights": {"stable": 9.5}}', "the weight of stable is 9.5, not an integer"),
        ('{"weights": {"stable": true}}', "the weight of stable is true, not an integer"),
        ('{"weights": {}}', 'expected "weights": an object of version names to weights, found {}'),
        ('{"model": 7, "weights": {"stable": 9}}', '"model" and "at" must be strings'),
        ("[" * 100_000, "not JSON (nested too deeply)"),
    ],
)
def test_an_unusable_memory_never_crashes_and_rollback_refuses_naming_version_and_annotation(
    annotation: str, why: str
) -> None:
    canary = mv("canary", 10, remembers=annotation)  # parsing it does not raise
    assert canary.memory is None
    assert canary.memory_error is not None
    assert canary.memory_error.startswith(why)
    with pytest.raises(PluginError) as refused:
        plan_rollback(canary, [mv("stable", 0)], force=True)  # --force does not override it
    message = str(refused.value)
    assert message.startswith(f"cannot roll back canary: its annotation {BEFORE}")
    assert why in message
    assert "Nothing was changed" in message
    assert f"kubectl annotate -n prod mv canary {BEFORE}-" in message
    assert "kubectl modelroll -n prod set-weight VERSION WEIGHT" in message
    assert "kubectl modelroll -n prod set-weight canary 0" in message

    [note] = render_notes([canary, mv("stable", 0)])
    assert note.startswith(f"warning: canary: annotation {BEFORE} is unusable: {why}")
    # A new promote replaces it; set-weight, the way out the message names, plans one patch
    # each: first a weight for the version that should serve, then canary's 0.
    model = [canary, mv("stable", 0)]
    assert plan_set_weight(model[1], model[:1], 9, force=False).changes == [Change("stable", 0, 9)]
    assert plan_set_weight(canary, [mv("stable", 9)], 0, force=False).changes == [
        Change("canary", 10, 0)
    ]
    replaced = plan_promote(mv("stable", 1), [canary], force=False)
    assert replaced.changes[1].patch()["metadata"] == {"annotations": {BEFORE: None}}


def test_two_versions_holding_a_memory_make_rollback_refuse() -> None:
    with pytest.raises(PluginError, match=r"besides it, v2 of model sentiment also holds") as e:
        plan_rollback(
            mv("v3", 10, remembers={"v2": 10}), [mv("v2", 0, remembers={"v1": 9})], force=False
        )
    assert f"kubectl annotate -n prod mv NAME {BEFORE}-" in str(e.value)


def test_rolling_back_a_version_without_memory_points_at_the_one_promoted_last() -> None:
    plan = plan_rollback(mv("v2", 3), [mv("v3", 10, remembers={"v2": 10})], force=False)
    assert plan.changes == [Change("v2", 3, 0)]
    assert plan.notes == [
        "v2 holds no memory of a promote; the last promote of model sentiment was of v3 "
        "(kubectl modelroll -n prod rollback v3 undoes it)"
    ]


def test_rollback_of_a_version_already_at_zero_only_forgets_its_used_up_memory() -> None:
    plan = plan_rollback(mv("canary", 0, remembers={"stable": 9}), [mv("stable", 9)], False)
    assert plan.changes == [Change("canary", 0, 0, forget=(BEFORE,))]
    assert plan_rollback(mv("canary", 0), [mv("stable", 9)], force=False).changes == []


def test_status_notes_show_what_the_last_promote_remembered() -> None:
    canary = mv("canary", 10, remembers={"canary": 1, "stable": 9})
    assert render_notes([mv("stable", 0), canary], all_namespaces=True) == [
        "prod/canary was promoted; the weights before: canary 1, stable 9. "
        "`kubectl modelroll -n prod rollback canary` gives them back."
    ]
    assert render_notes([mv("stable", 9)]) == []


def test_a_memory_round_trips_through_its_annotation() -> None:
    memory = Memory("sentiment", {"b": 0, "a": 1000}, "2025-01-02T03:04:05Z")
    text = memory.to_annotation()
    assert text == '{"model":"sentiment","at":"2025-01-02T03:04:05Z","weights":{"a":1000,"b":0}}'
    assert Memory.parse(text) == memory


def test_the_status_table_lists_versions_by_model_with_their_shares() -> None:
    """A share is computed from the weights the versions are routed by (their statuses)."""
    table = render_table([mv("stable", 9), mv("canary", 1), mv("cold", 5, False)]).splitlines()
    assert table[0].split() == [
        "MODEL",
        "VERSION",
        "WEIGHT",
        "SHARE",
        "READY",
        "ROUTED",
        "ENDPOINT",
    ]
    assert [line.split()[1:4] for line in table[1:]] == [
        ["canary", "1", "10.0%"],
        ["cold", "5", "-"],
        ["stable", "9", "90.0%"],
    ]


def test_the_namespace_flag_may_come_before_or_after_the_command() -> None:
    before = build_parser().parse_args(["-n", "prod", "promote", "canary"])
    after = build_parser().parse_args(["promote", "canary", "-n", "prod", "--wait=0"])
    neither = build_parser().parse_args(["status"])
    assert (before.namespace, after.namespace, neither.namespace) == ("prod", "prod", None)
    assert (after.version, after.wait, after.force) == ("canary", 0.0, False)
    forced = build_parser().parse_args(["set-weight", "stable", "0", "--force"])
    assert (forced.version, forced.weight, forced.force) == ("stable", 0, True)


NO_READY_WEIGHT = "would leave model sentiment with no Ready version that has weight"


def test_set_weight_refuses_to_take_the_models_last_ready_weighted_version_away() -> None:
    """The README's promise: `set-weight` never leaves the gateway answering 503 for a model."""
    with pytest.raises(PluginError, match=NO_READY_WEIGHT) as refused:
        plan_set_weight(mv("stable", 9), [mv("canary", 0)], 0, force=False)
    message = str(refused.value)
    assert message.startswith("setting stable's weight to 0 would leave model sentiment")
    assert "no version would have a weight above 0" in message
    assert "Nothing was changed" in message
    assert "kubectl modelroll -n prod set-weight VERSION WEIGHT" in message
    assert "--force" in message
    # Weight left only on a version that is not Ready counts as none.
    with pytest.raises(PluginError, match=NO_READY_WEIGHT) as refused:
        plan_set_weight(mv("stable", 9), [mv("canary", 1, ready=False)], 0, force=False)
    assert (
        "canary is not Ready (ReplicasNotReady: 0 of 1 replicas ready) and would have weight 1"
    ) in str(refused.value)
    assert plan_set_weight(mv("stable", 9), [mv("canary", 0)], 0, force=True).changes == [
        Change("stable", 9, 0)
    ]


def test_set_weight_goes_ahead_while_a_ready_version_keeps_weight() -> None:
    assert plan_set_weight(mv("canary", 1), [mv("stable", 9)], 0, False).changes == [
        Change("canary", 1, 0)
    ]
    # A version that is not Ready may get weight while a Ready one serves.
    cold = mv("cold", 0, ready=False)
    assert plan_set_weight(cold, [mv("stable", 9)], 5, False).changes == [Change("cold", 0, 5)]
    # Lowering, not removing, the last Ready weight is fine.
    assert plan_set_weight(mv("stable", 9), [], 1, False).changes == [Change("stable", 9, 1)]
    # A weight that does not change moves no traffic: never refused.
    lonely = mv("lonely", 0, ready=False)
    assert plan_set_weight(lonely, [], 0, False).changes == [Change("lonely", 0, 0)]
    # Weight on a not-Ready version while nothing else serves is refused too, saying so.
    with pytest.raises(PluginError, match=NO_READY_WEIGHT) as refused:
        plan_set_weight(mv("new", 0, ready=False), [], 5, force=False)
    assert "(it has no Ready version with weight now either)" in str(refused.value)


@pytest.mark.parametrize("command", ["set-weight", "promote", "rollback"])
def test_set_weight_promote_and_rollback_share_one_rule_and_one_force(command: str) -> None:
    """The same model, the same outcome (no Ready version with weight), the same refusal."""
    stable, canary = mv("stable", 9), mv("canary", 0, ready=False)

    def plan(force: bool) -> Plan:
        if command == "set-weight":
            return plan_set_weight(stable, [canary], 0, force)
        if command == "promote":
            return plan_promote(canary, [stable], force)
        return plan_rollback(stable, [canary], force)

    with pytest.raises(PluginError) as refused:
        plan(force=False)
    message = str(refused.value)
    assert NO_READY_WEIGHT + ", so the gateway would answer 503 for it" in message
    assert message.endswith(
        "Nothing was changed. Give a Ready version a weight first (kubectl modelroll -n prod "
        "set-weight VERSION WEIGHT; `kubectl modelroll status` shows which are Ready), or use "
        "--force to do it anyway."
    )
    assert plan(force=True).changes  # --force makes the same plan


def test_status_says_which_httproute_routes_a_model_and_whether_its_gateways_accept_it() -> None:
    stable, canary = body("stable", 9), body("canary", 1)
    for each in (stable, canary):
        each["status"]["httpRoute"] = "models"
        each["status"]["conditions"].append(
            {
                "type": "HTTPRouteAccepted",
                "status": "False",
                "reason": "NotAccepted",
                "message": "Gateway edge refuses HTTPRoute models: NotAllowedByListeners: no",
            }
        )
    notes = render_notes([Version.from_body(stable), Version.from_body(canary), mv("other", 1)])
    assert notes == [
        "Model sentiment is routed by HTTPRoute models; accepted by its Gateways: False: "
        "Gateway edge refuses HTTPRoute models: NotAllowedByListeners: no"
    ]


def test_status_notes_say_what_a_models_new_weights_wait_for() -> None:
    waiting = body("canary", 100, True, {})
    waiting["status"]["conditions"].append(
        {
            "type": "Capacity",
            "status": "False",
            "reason": "WaitingForReplicas",
            "message": "Waiting for 3 ready replicas before it takes 100.0% of model "
            "sentiment's traffic: 1 ready",
        }
    )
    assert render_notes([mv("stable", 0), Version.from_body(waiting)]) == [
        "canary: the weights of model sentiment wait: Waiting for 3 ready replicas before it "
        "takes 100.0% of model sentiment's traffic: 1 ready"
    ]

"""Which versions end up in a model's route, and what a route change tells the user."""

from __future__ import annotations

import json

from modelroll_common.routes import dump_model_route, parse_model_route
from modelroll_operator.routing import Candidate, compute_route, route_changes


def test_only_ready_versions_are_routed_and_the_document_is_in_name_order() -> None:
    route = compute_route(
        "sentiment",
        [
            Candidate("stable-v1", 9, "http://stable:8000", ready=True),
            Candidate("canary-v2", 1, "http://canary:8000", ready=True),
            Candidate("cold-v3", 5, "http://cold:8000", ready=False),
        ],
    )
    assert route is not None
    doc = json.loads(dump_model_route(route))
    assert doc == {
        "model": "sentiment",
        "versions": [
            {"name": "canary-v2", "weight": 1, "endpoint": "http://canary:8000"},
            {"name": "stable-v1", "weight": 9, "endpoint": "http://stable:8000"},
        ],
    }
    assert route.shares() == {"canary-v2": 0.1, "stable-v1": 0.9}


def test_the_same_versions_in_any_order_write_the_same_text() -> None:
    versions = [
        Candidate("b", 2, "http://b:8000", ready=True),
        Candidate("a", 1, "http://a:8000", ready=True),
        Candidate("c", 0, "http://c:8000", ready=True),
    ]
    texts = set()
    for order in (versions, versions[::-1], versions[1:] + versions[:1]):
        route = compute_route("m", order)
        assert route is not None
        texts.add(dump_model_route(route))
    assert len(texts) == 1
    # The gateway reads back what the operator writes.
    assert parse_model_route("m", texts.pop()).total_weight == 3


def test_a_model_whose_versions_are_all_unready_keeps_an_empty_route() -> None:
    route = compute_route("m", [Candidate("a", 1, "http://a:8000", ready=False)])
    assert route is not None
    assert route.versions == ()  # the gateway answers 503 for it, not 404


def test_a_model_without_versions_has_no_route() -> None:
    assert compute_route("m", []) is None  # its ConfigMap key goes away


def test_a_dark_version_is_listed_with_weight_zero_so_it_can_be_pinned() -> None:
    route = compute_route(
        "m",
        [Candidate("a", 1, "http://a:8000", ready=True), Candidate("b", 0, "http://b:8000", True)],
    )
    assert route is not None
    assert [(v.name, v.weight) for v in route.versions] == [("a", 1), ("b", 0)]
    assert route.shares()["b"] == 0.0


def test_changes_name_each_version_whose_share_moved() -> None:
    before = compute_route("m", [Candidate("stable", 9, "http://s:8000", ready=True)])
    after = compute_route(
        "m",
        [
            Candidate("stable", 9, "http://s:8000", ready=True),
            Candidate("canary", 1, "http://c:8000", ready=True),
        ],
    )
    changes = {c.version: c for c in route_changes(before, after)}
    assert changes["canary"].reason() == "Routed"
    assert changes["canary"].message("m") == (
        "Now routed: 10.0% of model m's traffic (weight 1 of 10) to http://c:8000"
    )
    assert changes["stable"].message("m") == (
        "Routing changed: 100.0% -> 90.0% of model m's traffic (weight 9 of 10)"
    )
    removed = route_changes(after, before)
    assert [(c.version, c.reason()) for c in removed] == [
        ("canary", "Unrouted"),
        ("stable", "Routed"),
    ]
    assert removed[0].message("m") == "No longer routed: removed from the routes of model m"


def test_an_unchanged_route_reports_no_changes() -> None:
    route = compute_route("m", [Candidate("a", 1, "http://a:8000", ready=True)])
    assert route_changes(route, route) == []


def test_a_shadow_version_carries_its_percentage_into_the_route() -> None:
    route = compute_route(
        "sentiment",
        [
            Candidate("stable-v1", 1, "http://s:8000", ready=True),
            Candidate("shadow-v2", 0, "http://d:8000", ready=True, shadow=10),
        ],
    )
    assert route is not None
    versions = json.loads(dump_model_route(route))["versions"]
    assert [v.get("shadow") for v in versions] == [10, None]  # shadow-v2, then stable-v1


def test_the_cohort_header_is_the_heaviest_routed_version_that_names_one() -> None:
    def header(*candidates: Candidate) -> str | None:
        route = compute_route("chat", candidates)
        assert route is not None
        return route.cohort_header

    stable = Candidate("stable-v1", 80, "http://s:8000", ready=True, cohort_header="X-User")
    canary = Candidate("canary-v2", 20, "http://c:8000", ready=True)
    assert header(stable, canary) == "X-User"  # a canary that leaves it out changes nothing
    renamed = Candidate("canary-v2", 20, "http://c:8000", ready=True, cohort_header="X-Key")
    assert header(stable, renamed) == "X-User"
    promoted = Candidate("canary-v2", 100, "http://c:8000", ready=True, cohort_header="X-Key")
    assert header(stable, promoted) == "X-Key"
    unready = Candidate("stable-v1", 80, "http://s:8000", ready=False, cohort_header="X-User")
    assert header(unready, canary) is None
    tie = Candidate("a-v0", 80, "http://a:8000", ready=True, cohort_header="X-A")
    assert header(stable, tie) == "X-A"  # the first by name

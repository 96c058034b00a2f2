"""The routes document the operator writes and the gateway reads: what is accepted, what is not."""

from __future__ import annotations

import json

import pytest

from modelroll_common.routes import (
    ModelRoute,
    RoutesError,
    VersionRoute,
    configmap_delete_patch,
    configmap_patch,
    dump_model_route,
    format_share,
    parse_configmap_data,
    parse_model_route,
)


def _one(version: dict[str, object]) -> str:
    """A document for model "sentiment" with this one version."""
    return json.dumps({"model": "sentiment", "versions": [version]})


GOOD = {
    "model": "sentiment",
    "versions": [
        {"name": "stable-v1", "weight": 9, "endpoint": "http://stable-v1.ns.svc:8000"},
        {"name": "canary-v2", "weight": 1, "endpoint": "http://canary-v2.ns.svc:8000/"},
    ],
}


def test_a_document_round_trips_through_the_operator_api() -> None:
    route = parse_model_route("sentiment", json.dumps(GOOD))
    assert route.model == "sentiment"
    assert [(v.name, v.weight) for v in route.versions] == [("stable-v1", 9), ("canary-v2", 1)]
    assert route.version("canary-v2") == VersionRoute(
        "canary-v2", 1, "http://canary-v2.ns.svc:8000"
    )
    assert parse_model_route("sentiment", dump_model_route(route)).version("stable-v1") == (
        route.version("stable-v1")
    )


def test_serialisation_is_canonical_so_the_same_state_writes_the_same_configmap() -> None:
    a = ModelRoute("m", (VersionRoute("b", 1, "http://b:8000"), VersionRoute("a", 2, "http://a:1")))
    b = ModelRoute(
        "m", (VersionRoute("a", 2, "http://a:1/"), VersionRoute("b", 1, "http://b:8000"))
    )
    assert dump_model_route(a) == dump_model_route(b)
    assert json.loads(dump_model_route(a))["versions"][0]["name"] == "a"
    assert configmap_patch(a) == {"data": {"m": dump_model_route(a)}}
    assert configmap_delete_patch("m") == {"data": {"m": None}}


def test_a_cohort_header_round_trips_and_a_route_without_one_writes_none() -> None:
    keyed = parse_model_route("sentiment", {**GOOD, "cohortHeader": "X-User-Id"})
    assert keyed.cohort_header == "X-User-Id"
    again = parse_model_route("sentiment", dump_model_route(keyed))
    assert (again.cohort_header, dump_model_route(again)) == ("X-User-Id", dump_model_route(keyed))
    plain = parse_model_route("sentiment", GOOD)
    assert plain.cohort_header is None
    assert "cohortHeader" not in json.loads(dump_model_route(plain))


def test_a_standby_version_round_trips_and_others_write_no_standby() -> None:
    standby = {"name": "c", "weight": 0, "endpoint": "http://c", "standby": True}
    doc = {**GOOD, "versions": [*GOOD["versions"], standby]}
    route = parse_model_route("sentiment", doc)
    assert route.version("c") == VersionRoute("c", 0, "http://c", standby=True)
    written = json.loads(dump_model_route(route))["versions"]
    assert [(v["name"], v.get("standby")) for v in written] == [
        ("c", True),
        ("canary-v2", None),
        ("stable-v1", None),
    ]


def test_shares_follow_the_weights() -> None:
    route = parse_model_route("sentiment", GOOD)
    assert route.shares() == {"stable-v1": 0.9, "canary-v2": 0.1}
    assert format_share(route.shares()["canary-v2"]) == "10.0%"
    dark = ModelRoute("m", (VersionRoute("a", 0, "http://a:1"),))
    assert dark.shares() == {"a": 0.0}
    assert dark.total_weight == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{not json", "not JSON"),
        ("[]", "must be a JSON object"),
        (json.dumps({**GOOD, "model": "other"}), "not the data key"),
        (json.dumps({**GOOD, "extra": 1}), "unknown field(s) ['extra']"),
        (json.dumps({"model": "sentiment"}), "'versions' must be a list"),
        (json.dumps({"model": "sentiment", "versions": [1]}), "must be an object"),
        (_one({"name": "a", "weight": 1}), "missing field(s) ['endpoint']"),
        (_one({"name": "a", "weight": 1001, "endpoint": "http://a"}), "outside 0..1000"),
        (_one({"name": "a", "weight": -1, "endpoint": "http://a"}), "outside 0..1000"),
        (_one({"name": "a", "weight": 1.5, "endpoint": "http://a"}), "must be an integer"),
        (_one({"name": "a", "weight": True, "endpoint": "http://a"}), "must be an integer"),
        (_one({"name": "A_b", "weight": 1, "endpoint": "http://a"}), "not a DNS subdomain"),
        (_one({"name": "a", "weight": 1, "endpoint": "a:8000"}), "must be an http(s) URL"),
        (_one({"name": "a", "weight": 1, "endpoint": "http://a:x"}), "is not a URL"),
        (_one({"name": "a", "weight": 1, "endpoint": "http://u:p@a"}), "must not carry"),
        (_one({"name": "a", "weight": 0, "endpoint": "http://a", "shadow": 101}), "percentage"),
        (_one({"name": "a", "weight": 0, "endpoint": "http://a", "shadow": "10"}), "percentage"),
        (_one({"name": "a", "weight": 0, "endpoint": "http://a", "standby": 1}), "true or false"),
        (_one({"name": "a", "weight": 2, "endpoint": "http://a", "standby": True}), "weight 0"),
        (json.dumps({**GOOD, "cohortHeader": "X User"}), "is not an HTTP header name"),
        (json.dumps({**GOOD, "cohortHeader": ""}), "is not an HTTP header name"),
        (json.dumps({**GOOD, "cohortHeader": 7}), "is not an HTTP header name"),
        (json.dumps({**GOOD, "cohortHeader": "x-modelroll-version"}), "is the version header"),
        (
            json.dumps(
                {
                    "model": "sentiment",
                    "versions": [
                        {"name": "a", "weight": 1, "endpoint": "http://a"},
                        {"name": "a", "weight": 2, "endpoint": "http://b"},
                    ],
                }
            ),
            "listed twice",
        ),
    ],
)
def test_invalid_documents_are_rejected_with_a_message_naming_the_fault(
    value: str, expected: str
) -> None:
    with pytest.raises(RoutesError) as info:
        parse_model_route("sentiment", value)
    assert expected in str(info.value)
    assert "sentiment" in str(info.value)


def test_a_bad_model_name_is_rejected() -> None:
    with pytest.raises(RoutesError, match="not a DNS label"):
        parse_model_route("Bad_Name", json.dumps({**GOOD, "model": "Bad_Name"}))


def test_configmap_data_is_parsed_key_by_key() -> None:
    routes, errors = parse_configmap_data(
        {"sentiment": json.dumps(GOOD), "broken": "{", "empty": '{"model":"empty","versions":[]}'}
    )
    assert set(routes) == {"sentiment", "empty"}
    assert routes["empty"].versions == ()
    assert set(errors) == {"broken"}
    assert parse_configmap_data(None) == ({}, {})

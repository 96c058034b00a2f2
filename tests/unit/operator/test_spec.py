"""Reading a ModelVersion: the CRD's defaults, and errors that name the field."""

from __future__ import annotations

import pytest

from modelroll_operator.spec import Batching, SpecError, parse_spec
from modelroll_operator.state import VersionInfo

from .conftest import mv_body


def test_an_external_version_with_only_required_fields_gets_the_crds_defaults() -> None:
    spec = parse_spec({"model": "sentiment", "endpoint": "http://s:8000/"})
    assert spec.weight == 0
    assert spec.replicas == 1
    assert spec.batching == Batching(32, 10, 1024, 0, 30000, 1)
    assert spec.endpoint == "http://s:8000"  # normalised like the gateway does
    assert not spec.managed


def test_an_empty_endpoint_next_to_a_server_means_managed_mode() -> None:
    spec = parse_spec({"model": "m", "endpoint": "", "server": {"image": "m:1"}})
    assert spec.managed
    assert spec.server is not None
    assert spec.server.port == 8080


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"endpoint": "http://s"}, "spec.model is required"),
        ({"model": "m"}, "exactly one of spec.server and spec.endpoint"),
        ({"model": "m", "endpoint": "http://s", "weight": -1}, "spec.weight must be within"),
        ({"model": "m", "server": {}}, "spec.server.image is required"),
        (
            {"model": "m", "server": {"image": "x"}, "batching": {"maxBatchSize": "big"}},
            "spec.batching.maxBatchSize must be an integer",
        ),
    ],
)
def test_a_spec_the_operator_cannot_use_is_reported_by_field(
    spec: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_an_unparseable_version_is_still_indexed_under_its_model() -> None:
    body = mv_body("broken", endpoint="http://s", server={"image": "m:1"})
    info = VersionInfo.from_body(body)
    assert info is not None
    assert info.model_key == ("prod", "sentiment")
    assert info.spec is None
    assert info.spec_error is not None


def test_a_version_without_a_model_is_not_indexed() -> None:
    body = mv_body("nameless", endpoint="http://s")
    del body["spec"]["model"]
    assert VersionInfo.from_body(body) is None

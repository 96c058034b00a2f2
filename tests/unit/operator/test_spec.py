"""Reading a ModelVersion: the CRD's defaults, and errors that name the field."""

from __future__ import annotations

import pytest

from modelroll_operator.snapshots import VersionInfo
from modelroll_operator.spec import Batching, SpecError, parse_batching, parse_spec
from tests.support.specs import mv_body


def test_an_external_version_with_only_required_fields_gets_the_crds_defaults() -> None:
    spec = parse_spec({"model": "sentiment", "endpoint": "http://s:8000/"})
    assert spec.weight == 0
    assert spec.replicas == 1
    assert spec.batching == Batching(32, 10, 1024, 0, 30000, 1)
    assert (spec.batching.batch_by, spec.batching.wait_policy) == ("Length", "Auto")
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
        (
            {"model": "m", "server": {"image": "x"}, "batching": {"batchBy": "Sorted"}},
            "spec.batching.batchBy must be one of Length, Arrival, got 'Sorted'",
        ),
        (  # the sidecar's flag takes any case; the CRD's enum, and so the operator, do not
            {"model": "m", "server": {"image": "x"}, "batching": {"waitPolicy": "adaptive"}},
            "spec.batching.waitPolicy must be one of Auto, Fixed, Adaptive, got 'adaptive'",
        ),
        (
            {"model": "m", "server": {"image": "x"}, "batching": {"batchBy": 1}},
            "spec.batching.batchBy must be one of Length, Arrival, got 1",
        ),
        (
            {"model": "m", "endpoint": "http://s", "shadow": {"percent": 0}},
            "spec.shadow.percent must be within 1..100, got 0",
        ),
        (
            {"model": "m", "endpoint": "http://s", "cohortHeader": "X-Modelroll-Version"},
            "spec.cohortHeader: cohort header 'X-Modelroll-Version' is the version header",
        ),
        (  # stored before the CRD's rule: only an OpenInference server is called by this name
            {"model": "m", "server": {"image": "x", "servedModelName": "iris"}},
            "spec.server.servedModelName needs spec.protocol OpenInference",
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


def test_batch_by_and_wait_policy_become_flags_only_when_not_their_default() -> None:
    """The API server fills in the defaults, Length and Auto, on every stored object: those must
    add no flag, so that the sidecar's own defaults and the CRD's give the same Deployment."""
    ints = Batching().sidecar_flags()
    assert not any(f.startswith(("--batch-by", "--wait-policy")) for f in ints)
    defaulted = parse_batching({"batchBy": "Length", "waitPolicy": "Auto"})
    assert defaulted == Batching()
    assert defaulted.sidecar_flags() == ints
    assert defaulted.changed() == []

    fifo = parse_batching({"batchBy": "Arrival"})
    assert (fifo.batch_by, fifo.wait_policy) == ("Arrival", "Auto")
    assert fifo.sidecar_flags() == [*ints, "--batch-by=arrival"]
    assert fifo.changed() == ["spec.batching.batchBy"]

    both = parse_batching({"maxWaitMs": 20, "batchBy": "Arrival", "waitPolicy": "Adaptive"})
    assert both.sidecar_flags()[-2:] == ["--batch-by=arrival", "--wait-policy=adaptive"]
    assert "--max-wait-ms=20" in both.sidecar_flags()
    assert both.changed() == [
        "spec.batching.maxWaitMs",
        "spec.batching.batchBy",
        "spec.batching.waitPolicy",
    ]


def test_an_external_version_names_the_batching_policies_it_ignores() -> None:
    spec = parse_spec(
        {
            "model": "m",
            "endpoint": "http://s:8000",
            "batching": {"batchBy": "Length", "waitPolicy": "Adaptive"},
        }
    )
    assert spec.ignored_settings() == ["spec.batching.waitPolicy"]

"""spec.analysis parsed by the operator: the CRD's defaults, and clear errors for the rest."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.analysis.spec import DEFAULT_ERROR_CODES, AnalysisSpec, parse_analysis
from modelroll_operator.spec import SpecError
from tests.unit.operator.test_crd_schema import load


def crd_analysis() -> dict[str, Any]:
    (version,) = load()["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    analysis: dict[str, Any] = spec["properties"]["analysis"]
    return analysis


def parsed(raw: dict[str, Any]) -> AnalysisSpec:
    spec = parse_analysis(raw)
    assert spec is not None
    return spec


def test_the_operators_defaults_are_the_crds() -> None:
    fields = crd_analysis()["properties"]
    spec = parsed({"steps": [{"weight": 10}]})
    for key, attr in (
        ("intervalSeconds", "interval_seconds"),
        ("warmupSeconds", "warmup_seconds"),
        ("warmupRequests", "warmup_requests"),
        ("minSeconds", "min_seconds"),
        ("minRequests", "min_requests"),
        ("maxSeconds", "max_seconds"),
        ("onInconclusive", "on_inconclusive"),
        ("falseRollbackBudget", "false_rollback_budget"),
    ):
        assert fields[key]["default"] == getattr(spec, attr), key
    checks = fields["checks"]["properties"]
    assert spec.errors is not None
    assert spec.latency is not None
    assert checks["errors"]["properties"]["maxRatio"]["default"] == spec.errors.max_ratio
    assert checks["latency"]["properties"]["maxRatio"]["default"] == spec.latency.max_ratio
    assert checks["latency"]["properties"]["quantile"]["default"] == spec.latency.quantile
    guard = parsed({"steps": [{"weight": 1}], "checks": {"guardrail": {}}}).guardrail
    assert guard is not None
    guard_fields = checks["guardrail"]["properties"]
    assert guard_fields["maxErrorRatio"]["default"] == guard.max_error_ratio
    assert guard_fields["minRequests"]["default"] == guard.min_requests
    assert spec.errors.codes == DEFAULT_ERROR_CODES
    assert all(
        code in checks["errors"]["properties"]["codes"]["description"]
        for code in ("5xx", "422", "429")
    )


def test_a_checks_block_judges_only_what_it_names() -> None:
    spec = parsed({"steps": [{"weight": 10}], "checks": {"latency": {"quantile": 0.9}}})
    assert list(spec.checks()) == ["latency"]
    assert spec.errors is None


def test_the_metrics_source() -> None:
    default = parsed({"steps": [{"weight": 10}]}).metrics
    assert default.selector == {
        "app.kubernetes.io/name": "modelroll",
        "app.kubernetes.io/component": "gateway",
    }
    assert default.port == 9090  # the gateway's admin port, where it serves /metrics
    prom = parsed(
        {"steps": [{"weight": 10}], "metrics": {"prometheus": {"url": "http://p:9090"}}}
    ).metrics
    assert prom.prometheus_url == "http://p:9090"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"steps": []}, "spec.analysis.steps must list at least 1 item"),
        ({"steps": [{"weight": 0}]}, "spec.analysis.steps[0].weight must be within 1..99"),
        ({"steps": [{"weight": 5}], "onInconclusive": "Maybe"}, "spec.analysis.onInconclusive"),
        ({"steps": [{"weight": 5}], "minSeconds": "5"}, "spec.analysis.minSeconds must be"),
    ],
)
def test_a_spec_the_crd_would_refuse_is_refused_with_the_field_named(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_analysis(raw)

"""spec.analysis parsed by the operator: the CRD's defaults, and clear errors for the rest."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.analysis.spec import AnalysisSpec, parse_analysis
from modelroll_operator.spec import SpecError


def parsed(raw: dict[str, Any]) -> AnalysisSpec:
    spec = parse_analysis(raw)
    assert spec is not None
    return spec


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

"""Reading both versions' counters from gateway /metrics text: sums over replicas."""

from __future__ import annotations

import math

import pytest

from modelroll_operator.canary_metrics import MetricsUnavailable, _Sums, add_exposition

ONE = """# HELP modelroll_gateway_requests_total Requests.
# TYPE modelroll_gateway_requests_total counter
modelroll_gateway_requests_total{model="m",version="canary",code="200"} 90.0
modelroll_gateway_requests_total{model="m",version="canary",code="422"} 10.0
modelroll_gateway_requests_total{model="m",version="stable",code="200"} 900.0
modelroll_gateway_requests_total{model="other",version="canary",code="200"} 5.0
# TYPE modelroll_gateway_request_duration_seconds histogram
modelroll_gateway_request_duration_seconds_bucket{le="0.01",model="m",version="canary"} 40.0
modelroll_gateway_request_duration_seconds_bucket{le="+Inf",model="m",version="canary"} 100.0
modelroll_gateway_request_duration_seconds_count{model="m",version="canary"} 100.0
modelroll_gateway_request_duration_seconds_sum{model="m",version="canary"} 1.5
"""


def test_two_replicas_are_summed_and_other_models_ignored() -> None:
    sums = _Sums()
    add_exposition(sums, ONE, "m", ("canary", "stable"))
    add_exposition(sums, ONE, "m", ("canary", "stable"))  # a second gateway replica
    snap = sums.snapshot(1.0, "canary", "stable")
    assert snap.canary.codes == {"200": 180.0, "422": 20.0}
    assert snap.canary.buckets == ((0.01, 80.0), (math.inf, 200.0))
    assert snap.baseline.codes == {"200": 1800.0}
    assert snap.baseline.buckets == ()


def test_text_that_is_not_the_exposition_format_is_unavailable() -> None:
    with pytest.raises(MetricsUnavailable, match="could not be parsed"):
        add_exposition(_Sums(), 'modelroll_gateway_requests_total{model="m" 1\n', "m", ("a",))


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-3.0"])
def test_a_counter_that_is_no_count_is_a_read_error_not_a_crash(value: str) -> None:
    """A NaN, infinite or negative counter holds the analysis (MetricsUnavailable, said in its
    condition) instead of reaching the judge."""
    broken = ONE.replace('code="422"} 10.0', f'code="422"}} {value}')
    with pytest.raises(MetricsUnavailable, match="not a count"):
        add_exposition(_Sums(), broken, "m", ("canary", "stable"))

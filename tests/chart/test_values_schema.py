"""values.schema.json (written with values.yaml from hack/values.py) rejecting unknown keys and
wrong types."""

from __future__ import annotations

import pytest

from tests.support.chart import CHART, Helm


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("replica=2", "replica"),
        ("operator.replica=2", "replica"),
        ("gateway.service.nodePort=30080", "nodePort"),
        ("monitoring.podMonitor.enable=true", "enable"),
        ("monitoring.prometheusRule.errorRatio.treshold=0.1", "treshold"),
        ("monitoring.prometheusRule.timeToFirstToken.p99Seconds=1", "p99Seconds"),
    ],
)
def test_schema_rejects_unknown_keys(helm: Helm, setting: str, key: str) -> None:
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert key in result.stderr, result.stderr


@pytest.mark.parametrize(
    "setting",
    [
        "gateway.port=http",
        "operator.image.pullPolicy=Sometimes",
        "monitoring.podMonitor.interval=5",
    ],
)
def test_schema_rejects_wrong_types_and_values(helm: Helm, setting: str) -> None:
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr

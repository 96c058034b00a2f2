"""The PrometheusRule (prometheusrule.yaml): alert thresholds from values, and the chart README's
table of alerts."""

from __future__ import annotations

import re

import yaml

from tests.support.chart import CHART, FULL_VALUES, Helm, one


def test_alert_thresholds_come_from_values(helm: Helm) -> None:
    rule = one(helm.template(values=[FULL_VALUES]), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == {
        "ModelrollVersionErrorRatioHigh",
        "ModelrollVersionLatencyHigh",
        "ModelrollVersionTimeToFirstTokenHigh",
        "ModelrollVersionQueueSaturated",
    }
    assert alerts["ModelrollVersionErrorRatioHigh"]["expr"].endswith("> 0.01")
    assert alerts["ModelrollVersionErrorRatioHigh"]["for"] == "2m"
    assert alerts["ModelrollVersionLatencyHigh"]["expr"].endswith("> 0.25")
    ttft = alerts["ModelrollVersionTimeToFirstTokenHigh"]
    assert ttft["expr"].endswith("> 0.5")
    assert (ttft["for"], ttft["labels"]["severity"]) == ("5m", "critical")
    assert "0.5s SLO" in ttft["annotations"]["description"]
    assert "> 500" in alerts["ModelrollVersionQueueSaturated"]["expr"]
    for alert in alerts.values():
        assert alert["labels"]["team"] == "ml-platform"
        assert "{{ $labels.version }}" in alert["annotations"]["summary"]
    records = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r]
    assert all("[10m]" in expr for expr in records)
    assert any('code=~"5..|422|429"' in expr for expr in records)


def test_the_readme_lists_every_alert_with_its_values_and_defaults(helm: Helm) -> None:
    """The chart README's alert table: one row per alert the chart renders, each naming its
    values under monitoring.prometheusRule with their defaults."""
    rule = one(helm.template("--set", "monitoring.prometheusRule.enabled=true"), "PrometheusRule")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    readme = (CHART / "README.md").read_text()
    rows = re.findall(r"^\| `(Modelroll\w+)` \|[^|]+\| (.+) \|$", readme, re.MULTILINE)
    assert [name for name, _ in rows] == alerts
    values = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["prometheusRule"]
    for name, cell in rows:
        group = ""
        for key, default in re.findall(r"`([\w.]+)` \(([^)]+)\)", cell):
            if not key.startswith("."):
                group, key = key.split(".")
            assert str(values[group][key.lstrip(".")]) == default, (name, group, key)
    assert f"`window` ({values['window']})" in readme

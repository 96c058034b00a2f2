"""Helpers the chart's test files share: the values files in tests/chart/values/, Chart.yaml,
and reading rendered objects (a role's rules, a container's arguments)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.chart import CHART, REPO, Manifest, one

VALUES = REPO / "tests" / "chart" / "values"
MONITORING_ON = VALUES / "monitoring-on.yaml"
"""Every monitoring object on: PodMonitors, ServiceMonitor, PrometheusRule, dashboard."""
KEDA_ON = VALUES / "keda-on.yaml"
"""KEDA installed with the chart (autoscaling.keda.install), and the Prometheus it queries."""


def chart_meta() -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return meta


def rules_of(doc: Manifest) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role or ClusterRole grants."""
    return {
        (group, resource, verb)
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def container_args(docs: list[Manifest], suffix: str) -> list[str]:
    """The arguments of the first container of the Deployment whose name ends with ``suffix``."""
    container = one(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]
    args: list[str] = container["args"]
    return args


def operator_args(docs: list[Manifest]) -> list[str]:
    return container_args(docs, "-operator")

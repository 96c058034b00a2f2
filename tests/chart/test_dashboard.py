"""The Grafana dashboard (dashboard-configmap.yaml and dashboards/modelroll.json, which
`make generate` writes from hack/dashboard.py): provisionable, every panel keeping versions apart.

tests/chart/test_promql.py runs its queries against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import CollectorRegistry

from modelroll_common import metric_names as names
from modelroll_gateway.shadow import SHADOW_OUTCOMES
from modelroll_operator.analysis.exporter import PHASES, AnalysisMetrics
from modelroll_sidecar.metrics import (
    CLOSE_REASONS,
    LENGTH_UNITS,
    STREAM_OUTCOMES,
    LLMMetrics,
    SidecarMetrics,
)
from tests.support.chart import CHART, Helm, one
from tests.support.rendering import MONITORING_ON


def test_dashboard_configmap_holds_the_dashboard_file_unchanged(helm: Helm) -> None:
    configmap = one(helm.template(values=[MONITORING_ON]), "ConfigMap", "-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART / "dashboards" / "modelroll.json").read_text()
    assert configmap["data"]["modelroll.json"] == shipped.rstrip("\n")
    elsewhere = helm.template(
        "--set", "monitoring.dashboard.namespace=grafana", values=[MONITORING_ON]
    )
    assert one(elsewhere, "ConfigMap", "-dashboard")["metadata"]["namespace"] == "grafana"


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads((CHART / "dashboards" / "modelroll.json").read_text())
    return board


def dashboard_targets(board: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (panel["title"], target) for panel in board["panels"] for target in panel.get("targets", [])
    ]


def test_dashboard_is_provisionable_with_a_fixed_uid() -> None:
    board = dashboard()
    assert board["uid"] == "modelroll-versions"
    assert "__inputs" not in board
    assert "__requires" not in board
    assert board.get("id") is None


def test_dashboard_variables_are_datasource_namespace_model_and_multi_version() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "model", "version"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["version"]["multi"] is True
    assert variables["version"]["includeAll"] is True
    for name in ("namespace", "model", "version"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"


def test_every_dashboard_query_keeps_versions_apart_and_uses_rate_interval() -> None:
    targets = dashboard_targets(dashboard())
    assert len(targets) >= 12
    for title, target in targets:
        expr = target["expr"]
        assert target["datasource"]["uid"] == "${datasource}", title
        assert re.search(r"by \((version\b[^)]*)\)", expr), f"{title}: not split by version"
        ranges = re.findall(r"\[([^\]]+)\]", expr)
        assert all(r == "$__rate_interval" for r in ranges), f"{title}: fixed range {ranges}"
        assert 'version=~"$version"' in expr, f"{title}: ignores the version variable"


def test_dashboard_covers_the_per_version_panels() -> None:
    board = dashboard()
    exprs = "\n".join(t["expr"] for _, t in dashboard_targets(board))
    for metric in (
        "modelroll_requests_total",
        "modelroll_request_duration_seconds_bucket",
        "modelroll_queue_wait_seconds_bucket",
        "modelroll_batch_size_bucket",
        "modelroll_batch_size_sum",
        "modelroll_batches_total",
        "modelroll_batch_tokens_total",
        "modelroll_queue_depth",
        "modelroll_rejected_total",
        "modelroll_client_timeouts_total",
        "modelroll_gateway_weight",
        "modelroll_gateway_requests_total",
        "modelroll_gateway_upstream_errors_total",
        "modelroll_gateway_upstream_connections",
        "modelroll_gateway_upstream_waiting",
        "modelroll_gateway_llm_time_to_first_token_seconds_bucket",
        "modelroll_gateway_llm_requests_total",
        *llm_metric_names(),
        *analysis_metric_names(),
    ):
        assert metric in exprs, f"no panel shows {metric}"
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}," in exprs
    repeated = [p for p in board["panels"] if p.get("repeat") == "version"]
    assert repeated, "no panel is repeated per version"
    for panel in repeated:
        # Grafana lays a panel's copies side by side across the whole row.
        assert panel["repeatDirection"] == "h"
        assert panel["gridPos"]["w"] == 24, f"{panel['title']} shares its row"
    # No two panels overlap on the grid.
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))


def llm_metric_names() -> list[str]:
    """Every series name of the sidecar's `--protocol openai` metrics that a panel queries (a
    histogram through its buckets), as Prometheus stores it."""
    registry = CollectorRegistry()
    LLMMetrics(SidecarMetrics("m", "v", registry), "m", "v")
    suffix = {"counter": "_total", "histogram": "_bucket", "gauge": ""}
    names = [
        m.name + suffix[m.type] for m in registry.collect() if m.name.startswith("modelroll_llm_")
    ]
    assert len(names) == 6, names
    return names


def test_the_llm_row_shows_chat_versions_apart_before_the_canary_analyses() -> None:
    board = dashboard()
    titles = [p["title"] for p in board["panels"]]
    row = titles.index("LLM versions")
    assert board["panels"][row]["type"] == "row"
    end = titles.index("Canary analyses")
    below = board["panels"][row + 1 : end]
    assert below, "the row is empty"
    assert all(p["type"] != "row" for p in below)
    for panel in below:
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert re.search(r"\bmodelroll_(gateway_)?llm_", target["expr"]), panel["title"]
            assert target["legendFormat"].startswith("{{version}}"), panel["title"]
    ttft = [p for p in below if p["title"].startswith("Time to first token")]
    assert len(ttft) == 1
    assert [t["expr"][: t["expr"].index(",")] for t in ttft[0]["targets"]] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.99",
    ]
    assert ttft[0]["fieldConfig"]["defaults"]["unit"] == "s"
    # The outcomes panel says what each outcome the sidecar counts means.
    [outcomes] = [p for p in below if p["title"] == "Generation outcomes by version"]
    for outcome in STREAM_OUTCOMES:
        assert re.search(rf"\b{outcome} \(", outcomes["description"]), outcome


def analysis_metric_names() -> list[str]:
    """Every series name of the operator's analysis metrics, as Prometheus stores it."""
    registry = CollectorRegistry()
    AnalysisMetrics(registry)
    return [m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()]


def row_panels(board: dict[str, Any], row: int) -> list[dict[str, Any]]:
    """The panels of the row at index ``row``: up to the next row, or to the end."""
    panels: list[dict[str, Any]] = board["panels"][row + 1 :]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    return panels[: rows[0]] if rows else panels


def test_the_shadow_row_shows_agreement_and_copies_per_shadow_version() -> None:
    board = dashboard()
    titles = [p["title"] for p in board["panels"]]
    below = row_panels(board, titles.index("Shadow traffic"))
    assert [p["title"] for p in below] == [
        "Shadow agreement by version",
        "Shadow copies by outcome",
    ]
    for panel in below:
        [target] = panel["targets"]
        assert "modelroll_gateway_shadow_" in target["expr"], panel["title"]
        assert target["legendFormat"].startswith("{{version}}"), panel["title"]
    # The copies panel says what each outcome the gateway counts means.
    for outcome in SHADOW_OUTCOMES:
        assert re.search(rf"\b{outcome}\b", below[1]["description"]), outcome


def test_the_canary_analyses_row_shows_each_canary_apart() -> None:
    board = dashboard()
    titles = [p["title"] for p in board["panels"]]
    assert "Canary analyses" in titles
    row = titles.index("Canary analyses")
    assert board["panels"][row]["type"] == "row"
    below = row_panels(board, row)
    assert below, "the row is empty"
    exprs = [t["expr"] for p in below for t in p["targets"]]
    assert all("modelroll_operator_analysis_" in e for e in exprs)
    for panel in below:
        for target in panel["targets"]:
            assert re.search(r"by \(version\b", target["expr"]), panel["title"]
            # A check's series are per check (and per arm): the legend says which.
            if "check" in target["expr"] and panel["type"] == "timeseries":
                assert "{{check}}" in target["legendFormat"], panel["title"]
    # The phase timeline maps every phase the operator exports to its name.
    [timeline] = [p for p in below if p["type"] == "state-timeline"]
    mapped = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert sorted(o["text"] for o in mapped.values()) == sorted(PHASES)
    expr = timeline["targets"][0]["expr"]
    for value, option in mapped.items():
        if value != "0":  # the first phase is what the sum of the others leaves
            assert f'phase="{option["text"]}"}}) * {value}' in expr, option


def test_the_batching_panels_show_padding_efficiency_and_every_close_reason() -> None:
    panels = {p["title"]: p for p in dashboard()["panels"]}
    padding = panels["Padding efficiency by version"]
    defaults = padding["fieldConfig"]["defaults"]
    assert (defaults["unit"], defaults["min"], defaults["max"]) == ("percentunit", 0, 1)
    assert padding["description"]
    (target,) = padding["targets"]
    useful, padded = target["expr"].split("\n/\n")
    assert 'kind="useful"' in useful
    assert useful.replace('kind="useful"', 'kind="padded"') == padded
    # The close reasons panel says what each reason the sidecar counts means.
    described = panels["Batch close reasons: $version"]["description"]
    for reason in CLOSE_REASONS:
        assert re.search(rf"\b{reason} \(", described), reason


POLICY_SERIES = (
    f"{names.BATCH_COST_TERM}{{",
    f"{names.BATCH_COST_ERROR}{{",
    f"{names.BATCH_COST_OBSERVED_OVER_PREDICTED}_bucket{{",
    f"{names.BATCH_COST_TRUSTED}{{",
    f"{names.BATCH_HOLD}_bucket{{",
    f"{names.BATCH_HOLD}_sum{{",
    f"{names.BATCH_SIZE}_sum{{",
    f"{names.BATCH_TOKENS}{{",
    f"{names.LENGTH_UNIT}{{",
)
"""What the row "Batching policy" shows: the fitted cost terms, predicted against observed,
trust, hold times, batch size, padding and the length unit."""


def test_the_batching_policy_row_shows_what_the_policy_learned_and_chose() -> None:
    board = dashboard()
    titles = [p["title"] for p in board["panels"]]
    row = titles.index("Batching policy")
    assert board["panels"][row]["type"] == "row"
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows[rows.index("Batching policy") - 1] == "Batching per version"
    below = row_panels(board, row)
    exprs = "\n".join(t["expr"] for p in below for t in p["targets"])
    for metric in POLICY_SERIES:
        assert metric in exprs, f"no panel of the row shows {metric}"
    for panel in below:
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["legendFormat"].startswith("{{version}}"), panel["title"]
    panels = {p["title"]: p for p in below}
    # Every term of the fitted surface has its own line, on a log scale.
    terms = panels["Fitted batch cost terms by version"]
    assert "by (version, term)" in terms["targets"][0]["expr"]
    assert terms["targets"][0]["legendFormat"] == "{{version}} {{term}}"
    assert terms["fieldConfig"]["defaults"]["custom"]["scaleDistribution"]["type"] == "log"
    for term in ("call", "row", "token", "token_squared"):
        assert re.search(rf"\b{term}\b", terms["description"]), term
    observed = panels["Observed over predicted batch cost p50 / p90 by version"]["targets"]
    assert [t["expr"][: t["expr"].index(",")] for t in observed] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.9",
    ]
    held = [t["legendFormat"] for t in panels["Batch hold time mean / p95 by version"]["targets"]]
    assert held == ["{{version}} mean", "{{version}} p95"]
    # The length unit's timeline names each unit the sidecar exports, and the unknown state.
    unit = panels["Length unit by version"]
    assert unit["type"] == "state-timeline"
    mapped = unit["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {o["text"] for o in mapped.values()} == {"not known yet", *LENGTH_UNITS}
    expr = unit["targets"][0]["expr"]
    assert mapped["1"]["text"] == "words"
    assert mapped["2"]["text"] == "tokens"
    assert 'unit="tokens"}) * 2\n+ max by (version) (' in expr
    assert expr.endswith('unit="words"})')

"""The Grafana dashboard the chart ships (charts/modelroll/dashboards/modelroll.json), as code.

``make generate`` (hack/generate.py) writes it from :func:`dashboard`. Panels are built with the
grafana-foundation-sdk for Grafana 11.0; :func:`dashboard` adds what its models cannot hold (the
query variables' ``definition``). Every query keeps versions apart (``by (version ...)``) and
follows the namespace, model and version variables. Panels are laid out in order from their
sizes: a panel goes right of the one before it, on a new line once a line's 24 columns are full.
Each panel keeps a fixed id, so that links to it (``viewPanel=``) keep working.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from string import ascii_uppercase
from typing import Any

import yaml
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import heatmap, prometheus, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from modelroll_common.metric_names import (
    BATCH_COST_ERROR,
    BATCH_COST_OBSERVED_OVER_PREDICTED,
    BATCH_COST_TERM,
    BATCH_COST_TRUSTED,
    BATCH_HOLD,
    BATCH_SIZE,
    BATCH_TOKENS,
    BATCHES,
    CLIENT_TIMEOUTS,
    GATEWAY_LLM_REQUESTS,
    GATEWAY_LLM_TTFT,
    GATEWAY_REQUEST_DURATION,
    GATEWAY_REQUESTS,
    GATEWAY_SHADOW_AGREEMENT,
    GATEWAY_SHADOW_REQUESTS,
    GATEWAY_UPSTREAM_CONNECTIONS,
    GATEWAY_UPSTREAM_ERRORS,
    GATEWAY_UPSTREAM_WAITING,
    GATEWAY_WEIGHT,
    LENGTH_UNIT,
    LLM_IN_FLIGHT,
    LLM_OUTPUT_TOKENS,
    LLM_PROMPT_TOKENS,
    LLM_REQUESTS,
    LLM_TPOT,
    LLM_TTFT,
    QUEUE_DEPTH,
    QUEUE_WAIT,
    REJECTED,
    REQUEST_DURATION,
    REQUESTS,
    REQUESTS_IN_FLIGHT,
)
from modelroll_common.server import PHASES as CUT_OFF_PHASES
from modelroll_gateway.metrics import UPSTREAM_ERROR_REASONS
from modelroll_operator.analysis.exporter import DECISIONS, PHASES, PREFIX
from modelroll_sidecar.metrics import CLOSE_REASONS, LENGTH_UNITS, STREAM_OUTCOMES

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "charts" / "modelroll" / "values.yaml"
UID = "modelroll-versions"
SCHEMA_VERSION = 39
"""Grafana 11.0's dashboard schema, which the SDK's Grafana 11.0 models describe."""
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
MODEL = 'namespace="$namespace", model="$model"'
"""The series of the chosen namespace and model, every version."""
VERSIONS = MODEL + ', version=~"$version"'
"""The series of the chosen namespace, model and versions."""
INTERVAL = "[$__rate_interval]"
QUANTILES = (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
"""The request latency quantiles a version's own panel shows, with their legends."""
FULL, HALF, THIRD = 24, 12, 8
"""Panel widths: the whole row, half of it, a third of it."""

# The operator's analysis series (operator/modelroll_operator/analysis/exporter.py).
ANALYSIS_PHASE = PREFIX + "phase"
ANALYSIS_INFO = PREFIX + "info"
ANALYSIS_STEP = PREFIX + "step"
ANALYSIS_WEIGHT = PREFIX + "weight"
ANALYSIS_STATISTIC = PREFIX + "statistic"
ANALYSIS_RATIO = PREFIX + "ratio"
ANALYSIS_VERDICT = PREFIX + "verdict"
ANALYSIS_JUDGED = PREFIX + "judged_requests"
ANALYSIS_JUDGED_BAD = PREFIX + "judged_bad_requests"
ANALYSIS_DECISIONS = PREFIX + "decisions_total"
ANALYSIS_READ_ERRORS = PREFIX + "metrics_read_errors_total"

CLOSE_REASON_MEANINGS = {
    "full": "max batch size",
    "timeout": "max wait",
    "tokens": "token budget",
    "idle": "--wait-policy auto or adaptive sent it early: a model slot was free and waiting "
    "for the next request would not pay",
    "drain": "shutdown",
}
UPSTREAM_ERROR_MEANINGS = {
    "connect": "no connection could be opened, 502",
    "timeout": "504",
    "protocol": "an invalid or ambiguous answer, 502",
    "closed": "the connection ended after the request was sent; never sent twice, 502",
}
CUT_OFF_MEANINGS = {
    "silent": "sent nothing",
    "head": "part of the head",
    "body": "part of the body",
}
OUTCOME_MEANINGS = {
    "completed": "ended with data: [DONE]",
    "error": "the engine sent an error event",
    "upstream_error": "the engine broke the stream off, the client getting an error event, or "
    "answered what cannot be passed on, a 502",
    "client_disconnect": "the client went away; the engine stopped generating",
    "client_stalled": "the client took nothing for the upstream timeout; it was cut off and the "
    "engine stopped",
    "cut": "still open when the drain on SIGTERM ran out; the client got an error event",
    "whole": "not streamed",
    "unreachable": "no connection to the engine, 503",
    "timeout": "the engine sent nothing for the upstream timeout, 504",
}
PHASE_MEANINGS = {
    "Pending": "no baseline yet",
    "Progressing": "",
    "Paused": "a step marked pause, or a weight changed by hand",
    "Holding": "no verdict by maxSeconds, or metrics unreadable",
    "Promoted": "",
    "RolledBack": "",
}
PHASE_COLORS = {
    "Pending": "text",
    "Progressing": "blue",
    "Paused": "yellow",
    "Holding": "orange",
    "Promoted": "green",
    "RolledBack": "red",
}
LAMBDA = "\N{GREEK CAPITAL LETTER LAMDA}"

Panel = Builder[model.Panel]


# --- PromQL ------------------------------------------------------------------------------------


def error_codes() -> str:
    """The `code` regex the chart's alerts count as errors by default (values.yaml)."""
    values = yaml.safe_load(VALUES.read_text())
    codes: str = values["monitoring"]["prometheusRule"]["errorCodes"]
    return codes


def series(metric: str, *matchers: str, selector: str = VERSIONS) -> str:
    """``metric`` of the chosen namespace, model and versions, narrowed by ``matchers``."""
    return f"{metric}{{{', '.join((selector, *matchers))}}}"


def rate(metric: str, *matchers: str, selector: str = VERSIONS) -> str:
    return f"rate({series(metric, *matchers, selector=selector)}{INTERVAL})"


def by(labels: str, aggregation: str, inner: str) -> str:
    """``inner`` aggregated per version (and the other ``labels``)."""
    return f"{aggregation} by ({labels}) ({inner})"


def quantile(q: str, histogram: str) -> str:
    """The ``q`` quantile of ``histogram`` per version."""
    return f"histogram_quantile({q}, {by('version, le', 'sum', rate(histogram + '_bucket'))})"


def ratio(numerator: str, denominator: str) -> str:
    return f"{numerator}\n/\n{denominator}"


def error_ratio(requests: str) -> str:
    """The share of each version's ``requests`` that failed."""
    failed = rate(requests, f'code=~"{error_codes()}"')
    return ratio(by("version", "sum", failed), by("version", "sum", rate(requests)))


def phase_number() -> str:
    """Each canary's phase as its index in PHASES: the first phase is what the others leave."""
    terms = []
    for index, phase in enumerate(PHASES):
        if index:
            current = by("version", "max", series(ANALYSIS_PHASE, f'phase="{phase}"'))
            terms.append(f"{current} * {index}")
    return "\n+ ".join(terms)


def explained(values: Iterable[str], meanings: Mapping[str, str]) -> str:
    """``value (meaning), ...`` for every value the code declares, in its order; a value with no
    meaning is named alone. Fails when the meanings do not cover exactly those values."""
    values = list(values)
    if set(values) != set(meanings):
        raise ValueError(f"describe exactly {values}, not {sorted(meanings)}")
    return ", ".join(f"{v} ({meanings[v]})" if meanings[v] else v for v in values)


# --- panels ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One PromQL target; ``legend`` is unused by tables."""

    expr: str
    legend: str = ""


def targets(queries: Iterable[Query], instant: bool = False) -> list[Builder[Dataquery]]:
    """The queries as Prometheus targets, their refIds A, B, C..."""
    built: list[Builder[Dataquery]] = []
    for index, query in enumerate(queries):
        target = prometheus.Dataquery().datasource(DATASOURCE).expr(query.expr)
        target.ref_id(ascii_uppercase[index])
        if instant:
            target.format(PromQueryFormat.TABLE).instant()
        else:
            target.legend_format(query.legend).range()
        built.append(target)
    return built


def legend(*calcs: str) -> common_b.VizLegendOptions:
    return (
        common_b.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .calcs(list(calcs))
        .show_legend(True)
    )


def graph(
    panel_id: int,
    title: str,
    description: str,
    unit: str,
    width: int,
    *queries: Query,
    floor: float | None = 0,
) -> timeseries.Panel:
    """A time series panel 8 high: thin lines, a table legend with the last and highest values,
    every series in the tooltip; ``floor`` is the y axis' minimum (None: from the data)."""
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .unit(unit)
        .draw_style(common.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(common_b.StackingConfig().mode(common.StackingMode.NONE).group("A"))
        .color_scheme(dashboard_b.FieldColor().mode(model.FieldColorModeId.PALETTE_CLASSIC))
        .legend(legend("lastNotNull", "max"))
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
        .targets(targets(queries))
    )
    if floor is not None:
        panel.min(floor)
    return panel


def per_version(panel: timeseries.Panel | heatmap.Panel) -> None:
    """Repeat ``panel`` for each chosen version, side by side, up to four on a line."""
    panel.repeat("version").repeat_direction("h").max_per_row(4)


@dataclass(frozen=True)
class Columns:
    """A merged table's columns: ``hidden`` values left out, the others in ``order``, values
    (``Value #<refId>``) renamed by ``names``."""

    hidden: tuple[str, ...]
    order: tuple[str, ...]
    names: Mapping[str, str]

    def organize(self) -> dict[str, object]:
        return {
            "excludeByName": {"Time": True} | {name: True for name in self.hidden},
            "indexByName": {name: index for index, name in enumerate(self.order)},
            "renameByName": dict(self.names),
        }


def analysis_table(
    panel_id: int, title: str, description: str, queries: list[Query], columns: Columns
) -> table.Panel:
    """A table 6 high of instant queries merged into one row per canary (or check)."""
    return (
        table.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(HALF)
        .height(6)
        .align(common.FieldTextAlignment.AUTO)
        .show_header(True)
        .cell_height(common.TableCellHeight.SM)
        .footer(common_b.TableFooterOptions().show(False).reducer(["sum"]))
        .targets(targets(queries, instant=True))
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            model.DataTransformerConfig(id_val="organize", options=columns.organize())
        )
    )


def row(panel_id: int, title: str) -> dashboard_b.Row:
    return dashboard_b.Row(title).id(panel_id).collapsed(False)


# --- rows --------------------------------------------------------------------------------------


def traffic() -> list[Panel]:
    sent = by("version", "sum", rate(GATEWAY_REQUESTS))
    routed = rate(GATEWAY_REQUESTS, 'version!=""', selector=MODEL)
    every_sent = f"sum({routed})"
    configured = by("version", "max", series(GATEWAY_WEIGHT))
    total_weight = f"sum({by('version', 'max', series(GATEWAY_WEIGHT, selector=MODEL))})"
    dashed = [
        model.DynamicConfigValue(
            id_val="custom.lineStyle", value=common.LineStyle(fill="dash", dash=[10, 10])
        ),
        model.DynamicConfigValue(id_val="custom.lineWidth", value=2),
    ]
    return [
        graph(
            2,
            "Request rate by version",
            "Requests each version's sidecars answered per second, any status.",
            "reqps",
            THIRD,
            Query(by("version", "sum", rate(REQUESTS)), "{{version}}"),
        ),
        graph(
            3,
            "Error ratio by version",
            "Share of each version's requests that failed: 5xx, or 422 (the model rejected the "
            "item). One line per version; never blended into one model-wide ratio.",
            "percentunit",
            THIRD,
            Query(error_ratio(REQUESTS), "{{version}}"),
        ),
        graph(
            4,
            "Configured weight share vs. traffic the gateway sent",
            "Dashed: each version's weight over the model's total weight, as the gateway has "
            "it. Solid: each version's share of the requests the gateway actually sent.",
            "percentunit",
            THIRD,
            Query(f"{configured}\n/ scalar({total_weight})", "{{version}} configured"),
            Query(f"{sent}\n/ scalar({every_sent})", "{{version}} sent"),
        )
        .max(1)
        .override_by_regexp(".* configured", dashed),
        graph(
            5,
            "Gateway error ratio by version",
            "Share of the gateway's requests to each version that failed, including 502/504 the "
            "gateway answered itself when the version could not be reached.",
            "percentunit",
            HALF,
            Query(error_ratio(GATEWAY_REQUESTS), "{{version}}"),
        ),
        graph(
            6,
            "Gateway p99 latency by version",
            "p99 of the time from a request's arrival at the gateway to its response, per version.",
            "s",
            HALF,
            Query(quantile("0.99", GATEWAY_REQUEST_DURATION), "{{version}}"),
        ),
        graph(
            41,
            "Weights each gateway replica routes by",
            "The weight in force for each version on each gateway replica (by its scrape "
            "target). A step of a canary analysis is judged only once every replica routes by its "
            "weights; until then the analysis holds with WeightsNotApplied, naming the replicas "
            "that lag.",
            "short",
            FULL,
            Query(
                f"max by (version, instance) ({GATEWAY_WEIGHT}{{{VERSIONS}}})",
                "{{version}} on {{instance}}",
            ),
        ),
    ]


def latency() -> list[Panel]:
    each = graph(
        8,
        "Request latency p50 / p95 / p99: $version",
        "Time from the sidecar receiving a request to answering it. One panel per version.",
        "s",
        FULL,
        *(Query(quantile(q, REQUEST_DURATION), "{{version}} " + name) for q, name in QUANTILES),
    )
    per_version(each)
    return [
        each,
        graph(
            9,
            "p99 request latency by version",
            "The versions' p99 latency side by side.",
            "s",
            HALF,
            Query(quantile("0.99", REQUEST_DURATION), "{{version}}"),
        ),
        graph(
            10,
            "Queue wait p99 by version",
            "p99 of the time a request waited in the sidecar's queue before its batch went to "
            "the model.",
            "s",
            HALF,
            Query(quantile("0.99", QUEUE_WAIT), "{{version}}"),
        ),
    ]


def batch_sizes() -> heatmap.Panel:
    """Batches per second by size bucket, as a heatmap of the histogram's buckets."""
    target = (
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .expr(by("version, le", "sum", rate(BATCH_SIZE + "_bucket")))
        .legend_format("{{le}}")
        .ref_id("A")
        .range()
        .format(PromQueryFormat.HEATMAP)
    )
    panel = (
        heatmap.Panel()
        .id(12)
        .title("Batch size distribution: $version")
        .description(
            "Batches per second by size bucket (requests per batch). One panel per version."
        )
        .datasource(DATASOURCE)
        .span(FULL)
        .height(8)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().axis_placement(common.AxisPlacement.LEFT).unit("short"))
        .cell_gap(1)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_model.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
            # Grafana's own defaults: the SDK would write an empty fill and a 0 exponent.
            .fill("dark-orange")
            .exponent(0.5)
        )
        .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE))
        .mode(common.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_legend()
        .with_target(target)
    )
    per_version(panel)
    return panel


def batching() -> list[Panel]:
    reasons = graph(
        13,
        "Batch close reasons: $version",
        f"What closed each batch: {explained(CLOSE_REASONS, CLOSE_REASON_MEANINGS)}. One panel "
        "per version.",
        "ops",
        FULL,
        Query(by("version, reason", "sum", rate(BATCHES)), "{{reason}}"),
    )
    reasons.fill_opacity(60).stacking(
        common_b.StackingConfig().mode(common.StackingMode.NORMAL).group("A")
    )
    per_version(reasons)
    return [batch_sizes(), reasons]


def mean_of(histogram: str) -> str:
    """The mean observation of ``histogram`` per version over the interval."""
    return ratio(
        by("version", "sum", rate(histogram + "_sum")),
        by("version", "sum", rate(histogram + "_count")),
    )


def length_unit() -> statetimeline.Panel:
    """The unit each version's sidecars count request lengths in: 0 while not known yet."""
    if LENGTH_UNITS != ("words", "tokens"):
        raise ValueError(f"map exactly the units words, tokens, not {LENGTH_UNITS}")
    words, tokens = (
        by("version", "max", series(LENGTH_UNIT, f'unit="{unit}"')) for unit in LENGTH_UNITS
    )
    return timeline(
        51,
        "Length unit by version",
        "What a request's length counts at each version's sidecars (spec.batching.lengthFrom): "
        "tokens of the model's own tokenizer, or whitespace words (the model serves no "
        "tokenizer at GET /v1/tokenizer, or lengthFrom Words). The unit of the padding, the "
        "token budget and the cost terms' token and token_squared. Not known yet: the sidecar "
        "has not had the model's answer.",
        THIRD,
        {0: ("not known yet", "text"), 1: ("words", "blue"), 2: ("tokens", "green")},
        Query(f"{tokens} * 2\n+ {words}", "{{version}}"),
    ).height(8)  # as high as the graphs beside it


def batching_policy() -> list[Panel]:
    """What the batching policy learned (the fitted cost of a batch, how well it predicts)
    and chose (how long it held batches, how large they were), so a small batch has its
    reasons beside it."""
    useful, padded = (
        by("version", "sum", rate(BATCH_TOKENS, f'kind="{kind}"')) for kind in ("useful", "padded")
    )
    terms = graph(
        46,
        "Fitted batch cost terms by version",
        "The cost surface each version's sidecars fitted from the batches they saw, averaged "
        "over the version's pods: a batch of n requests padded to length L is predicted to "
        "take call + row * n + token * n * L + token_squared * n * L^2 seconds. call is the "
        "fixed cost of a model call (large on a GPU, near zero on a CPU), token_squared the "
        "attention's growth with length. Log scale: the terms differ by orders of magnitude.",
        "s",
        HALF,
        Query(by("version, term", "avg", series(BATCH_COST_TERM)), "{{version}} {{term}}"),
        floor=None,
    )
    terms.scale_distribution(
        common_b.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)
    )
    return [
        graph(
            14,
            "Mean batch size by version",
            "Requests per batch, averaged over the interval.",
            "short",
            THIRD,
            Query(mean_of(BATCH_SIZE), "{{version}}"),
        ).decimals(1),
        graph(
            32,
            "Padding efficiency by version",
            "Useful tokens (the requests' own lengths) over padded tokens (batch size times the "
            "longest request's length, what a padding model computes) sent to each version's "
            "model over the interval: 100% means no padding. A request's length is in the unit "
            "of the Length unit panel (the model's tokens, or the whitespace words of a string "
            "payload), the items of a list, else 1. spec.batching.batchBy Length (--batch-by "
            "length) raises it when request lengths vary; when every request has the same "
            "length it is 100% whatever the setting. Weighted by tokens; "
            "modelroll_batch_padding_efficiency has the per-batch distribution.",
            "percentunit",
            THIRD,
            Query(ratio(useful, padded), "{{version}}"),
        )
        .decimals(1)
        .max(1)
        .legend(legend("lastNotNull", "min")),
        graph(
            47,
            "Batch hold time mean / p95 by version",
            "How long batches were held, a model slot free, for requests expected to join and "
            "pay for the wait (0 for a batch sent the moment it could go): a small batch held "
            "0 s went at once because waiting did not pay. Never longer than maxWaitMs.",
            "s",
            THIRD,
            Query(mean_of(BATCH_HOLD), "{{version}} mean"),
            Query(quantile("0.95", BATCH_HOLD), "{{version}} p95"),
        ),
        terms,
        graph(
            48,
            "Observed over predicted batch cost p50 / p90 by version",
            "Each batch's observed duration over the duration the fitted surface predicted for "
            "it: 1 is a perfect prediction, above 1 batches take longer than the policy "
            "expects (a second tenant on the core, a GC pause).",
            "short",
            HALF,
            Query(quantile("0.5", BATCH_COST_OBSERVED_OVER_PREDICTED), "{{version}} p50"),
            Query(quantile("0.9", BATCH_COST_OBSERVED_OVER_PREDICTED), "{{version}} p90"),
            floor=None,
        ).decimals(2),
        graph(
            49,
            "Batch cost prediction error by version",
            "A recent mean of |observed - predicted| / observed batch duration, averaged over "
            "each version's pods. While it is large the fit is not trusted.",
            "percentunit",
            THIRD,
            Query(by("version", "avg", series(BATCH_COST_ERROR)), "{{version}}"),
        ).decimals(1),
        graph(
            50,
            "Cost fit trusted by version",
            "Share of each version's sidecars whose fitted surface is trusted to decide waits. "
            "0: batches go at once, as soon as a model slot is free, until the fit earns trust "
            "again.",
            "percentunit",
            THIRD,
            Query(by("version", "avg", series(BATCH_COST_TRUSTED)), "{{version}}"),
        ).max(1),
        length_unit(),
    ]


def saturation() -> list[Panel]:
    return [
        graph(
            16,
            "Requests in flight and queued by version",
            "Summed over each version's sidecars: requests accepted and not yet answered "
            "(in flight, what spec.scaling.inFlight targets per replica), and those of "
            "them waiting for a batch (queued).",
            "short",
            HALF,
            Query(by("version", "sum", series(REQUESTS_IN_FLIGHT)), "{{version}} in flight"),
            Query(by("version", "sum", series(QUEUE_DEPTH)), "{{version}} queued"),
        ),
        graph(
            17,
            "Rejections by version and reason",
            "Requests refused or dropped before reaching the model: queue_full (429), deadline "
            "(504), disconnect, shutting_down (503).",
            "reqps",
            HALF,
            Query(by("version, reason", "sum", rate(REJECTED)), "{{version}} {{reason}}"),
        ),
        graph(
            18,
            "Gateway upstream errors by version and reason",
            "Requests the gateway could not get an answer for from a version: "
            f"{explained(UPSTREAM_ERROR_REASONS, UPSTREAM_ERROR_MEANINGS)}.",
            "reqps",
            HALF,
            Query(
                by("version, reason", "sum", rate(GATEWAY_UPSTREAM_ERRORS)),
                "{{version}} {{reason}}",
            ),
        ),
        graph(
            19,
            "Gateway connections to each version",
            "Connections the gateway holds to each version, open or opening (at most "
            "--upstream-max-connections), and requests waiting in line for one.",
            "short",
            HALF,
            Query(by("version", "sum", series(GATEWAY_UPSTREAM_CONNECTIONS)), "{{version}} open"),
            Query(by("version", "sum", series(GATEWAY_UPSTREAM_WAITING)), "{{version}} waiting"),
        ),
        graph(
            20,
            "Slow clients cut off by version and phase",
            "Clients that did not send their whole request to a version's sidecars within "
            "--read-timeout-ms, per second: "
            f"{explained(CUT_OFF_PHASES, CUT_OFF_MEANINGS)}. The gateway counts its own in "
            "modelroll_gateway_client_timeouts_total (no version: it cuts them off before "
            "routing).",
            "reqps",
            FULL,
            Query(by("version, phase", "sum", rate(CLIENT_TIMEOUTS)), "{{version}} {{phase}}"),
        ),
    ]


def llm() -> list[Panel]:
    def tokens(metric: str) -> str:
        return by("version", "sum", rate(metric))

    return [
        graph(
            34,
            "Time to first token p50 / p99 by version",
            "Chat LLM versions (spec.protocol: OpenAI): from the sidecar receiving a generation "
            "request to streaming back its first generated token, which is what a chat user "
            "waits for. The ModelrollVersionTimeToFirstTokenHigh alert fires on the p99.",
            "s",
            HALF,
            Query(quantile("0.5", LLM_TTFT), "{{version}} p50"),
            Query(quantile("0.99", LLM_TTFT), "{{version}} p99"),
        ),
        graph(
            35,
            "Gateway time to first token p99 by version",
            "The same p99, measured at the gateway from a request's arrival: the sidecar's "
            "figure plus the hop between them.",
            "s",
            HALF,
            Query(quantile("0.99", GATEWAY_LLM_TTFT), "{{version}}"),
        ),
        graph(
            36,
            "Time per output token p50 / p99 by version",
            "Per stream, from its first token to its last over the tokens after the first: the "
            "decode speed a reader sees once the answer has started.",
            "s",
            THIRD,
            Query(quantile("0.5", LLM_TPOT), "{{version}} p50"),
            Query(quantile("0.99", LLM_TPOT), "{{version}} p99"),
        ),
        graph(
            37,
            "Output and prompt tokens per second by version",
            "Tokens each version's engines generated (the streams' usage.completion_tokens, "
            "else their chunks with text) and prompt tokens they were given "
            "(usage.prompt_tokens, when the engine reports it), summed over its pods.",
            "short",
            THIRD,
            Query(tokens(LLM_OUTPUT_TOKENS), "{{version}} output"),
            Query(tokens(LLM_PROMPT_TOKENS), "{{version}} prompt"),
        ).decimals(1),
        graph(
            38,
            "Generation requests in flight by version",
            "Generation requests each version's engines are working on or streaming now, "
            "summed over its pods; spec.sidecar.maxInFlight caps each pod (more get 429).",
            "short",
            THIRD,
            Query(by("version", "sum", series(LLM_IN_FLIGHT)), "{{version}}"),
        ),
        graph(
            39,
            "Generation outcomes by version",
            "How each version's generation requests ended, at its sidecars: "
            f"{explained(STREAM_OUTCOMES, OUTCOME_MEANINGS)}.",
            "reqps",
            HALF,
            Query(by("version, outcome", "sum", rate(LLM_REQUESTS)), "{{version}} {{outcome}}"),
        ),
        graph(
            40,
            "Gateway generation outcomes by version",
            "How the OpenAI requests the gateway forwarded to each version ended, as its "
            "clients saw them (same outcomes as at the sidecars).",
            "reqps",
            HALF,
            Query(
                by("version, outcome", "sum", rate(GATEWAY_LLM_REQUESTS)),
                "{{version}} {{outcome}}",
            ),
        ),
    ]


def analyses_now() -> table.Panel:
    def arm(metric: str, which: str) -> Query:
        return Query(by("version", "max", series(metric, f'arm="{which}"')))

    return analysis_table(
        22,
        "Canary analyses now",
        "One row per canary (a version with spec.analysis), from the operator's metrics: its "
        "phase and why, the baseline it is judged against, its step (1-based) and the weights "
        "the analysis last set. Needs monitoring.operatorPodMonitor.",
        [
            Query(by("version, phase", "max", series(ANALYSIS_PHASE)) + " == 1"),
            Query(by("version, baseline, reason", "max", series(ANALYSIS_INFO))),
            Query(by("version", "max", series(ANALYSIS_STEP))),
            arm(ANALYSIS_WEIGHT, "canary"),
            arm(ANALYSIS_WEIGHT, "baseline"),
        ],
        Columns(
            hidden=("Value #A", "Value #B"),
            order=("version", "phase", "reason", "baseline", "Value #C", "Value #D", "Value #E"),
            names={
                "Value #C": "step",
                "Value #D": "canary weight",
                "Value #E": "baseline weight",
            },
        ),
    )


def checks_now() -> table.Panel:
    def per_check(metric: str, *matchers: str) -> Query:
        return Query(by("version, check", "max", series(metric, *matchers)))

    return analysis_table(
        23,
        "Checks now",
        "Each canary's checks in its current step: the verdict, the test statistic "
        f"{LAMBDA} (Fail at 1/alpha, Pass at 1 or below), the ratio of the canary's "
        "bad-request rate to the baseline's, and the requests and bad requests judged per arm. "
        "A step's checks start after its warm-up.",
        [
            Query(by("version, check, verdict", "max", series(ANALYSIS_VERDICT)) + " == 1"),
            per_check(ANALYSIS_STATISTIC),
            per_check(ANALYSIS_RATIO),
            per_check(ANALYSIS_JUDGED, 'arm="canary"'),
            per_check(ANALYSIS_JUDGED_BAD, 'arm="canary"'),
            per_check(ANALYSIS_JUDGED, 'arm="baseline"'),
            per_check(ANALYSIS_JUDGED_BAD, 'arm="baseline"'),
        ],
        Columns(
            hidden=("Value #A",),
            order=("version", "check", "verdict", *(f"Value #{r}" for r in "BCDEFG")),
            names={
                "Value #B": "statistic",
                "Value #C": "ratio",
                "Value #D": "canary requests",
                "Value #E": "canary bad",
                "Value #F": "baseline requests",
                "Value #G": "baseline bad",
            },
        ),
    )


def timeline(
    panel_id: int,
    title: str,
    description: str,
    width: int,
    states: Mapping[int, tuple[str, str]],
    query: Query,
) -> statetimeline.Panel:
    """A state timeline 5 high of ``query``, whose values are the keys of ``states``: each
    shown as its text in its colour."""
    mapping = model.ValueMap(
        options={
            str(value): model.ValueMappingResult(text=text, color=color, index=index)
            for index, (value, (text, color)) in enumerate(states.items())
        }
    )
    return (
        statetimeline.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(5)
        .fill_opacity(70)
        .line_width(0)
        .color_scheme(dashboard_b.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
        .thresholds(
            dashboard_b.ThresholdsConfig()
            .mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(value=None, color="text")])
        )
        .mappings([mapping])
        .show_value(common.VisibilityMode.AUTO)
        .merge_values(True)
        .align_value(common.TimelineValueAlignment.LEFT)
        .row_height(0.9)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(False)
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.SINGLE)
            .sort(common.SortOrder.NONE)
        )
        .targets(targets([query]))
    )


def phase_timeline() -> statetimeline.Panel:
    """Each canary's phase over time, a colour per phase."""
    if set(PHASE_COLORS) != set(PHASES):
        raise ValueError(f"colour exactly the phases {PHASES}, not {sorted(PHASE_COLORS)}")
    return timeline(
        24,
        "Analysis phase by canary",
        f"Each canary's phase over time: {explained(PHASES, PHASE_MEANINGS)}.",
        FULL,
        {index: (phase, PHASE_COLORS[phase]) for index, phase in enumerate(PHASES)},
        Query(phase_number(), "{{version}}"),
    )


def canary_analyses() -> list[Panel]:
    def per_check(metric: str, labels: str = "version, check") -> Query:
        legend_format = " ".join(f"{{{{{label}}}}}" for label in labels.split(", "))
        return Query(by(labels, "max", series(metric)), legend_format)

    statistic = graph(
        28,
        "Check statistic by canary and check",
        f"The test statistic {LAMBDA} of each check in the current step (log scale): the check "
        "fails when it reaches 1/alpha and passes at 1 or below. It starts at 1 with each "
        "step's judging.",
        "short",
        HALF,
        per_check(ANALYSIS_STATISTIC),
        floor=None,
    )
    statistic.scale_distribution(
        common_b.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)
    )
    return [
        analyses_now(),
        checks_now(),
        phase_timeline(),
        graph(
            25,
            "Analysis step by canary",
            "The step each canary's analysis is at (1-based; the last one once promoted).",
            "short",
            THIRD,
            Query(by("version", "max", series(ANALYSIS_STEP)), "{{version}}"),
        ).decimals(0),
        graph(
            26,
            "Weights the analyses set",
            "The canary's weight and its baseline's, as the analysis last set them (weights "
            "changed by hand pause the analysis).",
            "short",
            THIRD,
            per_check(ANALYSIS_WEIGHT, "version, arm"),
        ),
        graph(
            27,
            "Analysis decisions and metrics read errors",
            f"Decisions per interval ({', '.join(DECISIONS)}), and evaluations whose metrics "
            "could not be read (they hold the analysis, never roll it back).",
            "short",
            THIRD,
            Query(
                by("version, decision", "sum", f"increase({series(ANALYSIS_DECISIONS)}{INTERVAL})"),
                "{{version}} {{decision}}",
            ),
            Query(
                by("version", "sum", f"increase({series(ANALYSIS_READ_ERRORS)}{INTERVAL})"),
                "{{version}} metrics read errors",
            ),
        ),
        statistic,
        graph(
            29,
            "Canary to baseline bad-rate ratio by check",
            "The canary's rate of bad requests (errors; or slower than the baseline's quantile) "
            "over the baseline's, in the current step; absent while unknown (no bad baseline "
            "request yet).",
            "short",
            HALF,
            per_check(ANALYSIS_RATIO),
        ),
        graph(
            30,
            "Judged requests per arm",
            "Requests each check has judged in the current step, for the canary and its baseline.",
            "short",
            HALF,
            per_check(ANALYSIS_JUDGED, "version, check, arm"),
        ),
        graph(
            31,
            "Judged bad requests per arm",
            "Bad requests among those judged in the current step (errors for the errors check; "
            "slower than the bound for the latency check), for the canary and its baseline.",
            "short",
            HALF,
            per_check(ANALYSIS_JUDGED_BAD, "version, check, arm"),
        ),
    ]


# --- the dashboard -----------------------------------------------------------------------------


def variables() -> list[Builder[model.VariableModel]]:
    """The data source, then namespace, model and version, each listing what the one before
    it leaves; several versions (or all) can be chosen."""
    chosen: list[Builder[model.VariableModel]] = [
        dashboard_b.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .hide(model.VariableHide.DONT_HIDE)
        .multi(False)
        .include_all(False)
        .regex("")
    ]
    selectors = ("", 'namespace="$namespace"', 'namespace="$namespace", model="$model"')
    for name, selector in zip(("namespace", "model", "version"), selectors, strict=True):
        metric = f"{REQUESTS}{{{selector}}}" if selector else REQUESTS
        query = f"label_values({metric}, {name})"
        chosen.append(
            dashboard_b.QueryVariable(name)
            .label(name.capitalize())
            .datasource(DATASOURCE)
            .query(
                {
                    "qryType": 1,
                    "query": query,
                    "refId": "PrometheusVariableQueryEditor-VariableQuery",
                }
            )
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .hide(model.VariableHide.DONT_HIDE)
            .regex("")
            .options([])
            .multi(name == "version")
            .include_all(name == "version")
        )
    return chosen


def shadow() -> list[Panel]:
    def mean(labels: str) -> str:
        total = by(labels, "sum", rate(GATEWAY_SHADOW_AGREEMENT + "_sum"))
        return f"{total} / {by(labels, 'sum', rate(GATEWAY_SHADOW_AGREEMENT + '_count'))}"

    return [
        graph(
            43,
            "Shadow agreement by version",
            "Versions with spec.shadow get copies of a share of the model's requests; each copy "
            "answered is compared with the answer the client got from the primary version: 1 "
            "for equal outputs, 0 for different ones, the cosine similarity for vectors. The mean "
            "per shadow version and primary.",
            "none",
            HALF,
            Query(mean("version, primary"), "{{version}} vs {{primary}}"),
            floor=None,
        ).decimals(4),
        graph(
            44,
            "Shadow copies by outcome",
            "Copies per second by how they ended: compared, incomparable (a 200 that cannot be "
            "compared), too_large (an answer over the gateway's --shadow-max-compare-bytes, not "
            "compared), failed (another status, no answer, too slow), dropped (the gateway's "
            "--shadow-max-in-flight copies were open). No copy is ever queued.",
            "reqps",
            HALF,
            Query(
                by("version, outcome", "sum", rate(GATEWAY_SHADOW_REQUESTS)),
                "{{version}} {{outcome}}",
            ),
        ),
    ]


ROWS = (
    (1, "Traffic per version", traffic),
    (7, "Latency per version", latency),
    (11, "Batching per version", batching),
    (45, "Batching policy", batching_policy),
    (15, "Saturation per version", saturation),
    (33, "LLM versions", llm),
    (21, "Canary analyses", canary_analyses),
    (42, "Shadow traffic", shadow),
)


def builder() -> dashboard_b.Dashboard:
    """The dashboard, row by row."""
    board = (
        dashboard_b.Dashboard("modelroll / model versions")
        .uid(UID)
        .description(
            "Per-version traffic, errors, latency, batching and saturation of modelroll "
            "sidecars and the gateway, chat LLM versions' time to first token, tokens and "
            "outcomes, and the operator's canary analyses. Every panel keeps versions apart."
        )
        .tags(["modelroll"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .timezone("browser")
        .version(1)
        .refresh("30s")
        .time("now-1h", "now")
        .fiscal_year_start_month(0)
        .live_now(False)
        .links([])
        .annotation(
            dashboard_b.AnnotationQuery()
            .built_in(1)
            .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .name("Annotations & Alerts")
            .type("dashboard")
        )
        .variables(variables())
    )
    for panel_id, title, panels in ROWS:
        board.with_row(row(panel_id, title))
        for panel in panels():
            board.with_panel(panel)
    return board


def with_definitions(board: dict[str, Any]) -> dict[str, Any]:
    """``board`` with each query variable's ``definition``, the query Grafana shows for it in
    the dashboard's settings (the SDK's variable model has no such field)."""
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            variable["definition"] = variable["query"]["query"]
    return board


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana reads it."""
    built = builder().build()
    built.schema_version = SCHEMA_VERSION
    board: dict[str, Any] = json.loads(json.dumps(built, cls=JSONEncoder))
    return with_definitions(board)


def render() -> str:
    """The dashboard file's text."""
    return json.dumps(dashboard(), indent=2) + "\n"

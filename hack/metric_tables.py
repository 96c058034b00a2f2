"""The metric tables of docs/design.md and the components' READMEs, written from the metrics the
components register.

Each component's metrics are registered in a fresh registry, as the component does at start, and
each family becomes a row: its name as exposed (a counter's with ``_total``), its type, its
labels and its documentation string (the HELP line of /metrics). A label is shown with its values
when the code names them: the series it creates up front, and the values of
:data:`LATER_VALUES`, whose series exist only once they happen. Each table follows its marker
line and runs to the first line that is not a table row (``reference.splice``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from flag_tables import cell
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from reference import splice

from modelroll_common.calls import SharedHistogram
from modelroll_gateway.metrics import ROUTINGS, UPSTREAM_ERROR_REASONS, GatewayMetrics
from modelroll_gateway.shadow import SHADOW_OUTCOMES
from modelroll_operator.analysis.exporter import ARMS, DECISIONS, PHASES, VERDICTS, AnalysisMetrics
from modelroll_sidecar.cost_model import TERMS
from modelroll_sidecar.metrics import STREAM_OUTCOMES, LLMMetrics, SidecarMetrics

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"

UNLISTED = frozenset({"model", "version", "code"})
"""Labels whose values are the user's (names, HTTP codes), never listed."""


@runtime_checkable
class Describing(Protocol):
    """A collector that describes its families (every collector of modelroll does)."""

    def describe(self) -> Iterable[Metric]: ...


class RecordingRegistry(CollectorRegistry):
    """A registry that remembers its collectors, to read their label names."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self.collectors.append(collector)


def sidecar(registry: CollectorRegistry) -> None:
    """A sidecar's metrics, those of ``--protocol openai`` included."""
    LLMMetrics(SidecarMetrics("model", "version", registry), "model", "version")


@dataclass(frozen=True)
class Component:
    name: str
    register: Callable[[CollectorRegistry], object]
    readme: Path
    later_values: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    """By metric (as exposed), by label: values that exist only once they happen."""


COMPONENTS = (
    Component(
        "sidecar",
        sidecar,
        ROOT / "sidecar" / "README.md",
        {"modelroll_batch_cost_term_seconds": {"term": TERMS}},
    ),
    Component(
        "gateway",
        GatewayMetrics,
        ROOT / "gateway" / "README.md",
        {
            **{
                name: {"routing": ROUTINGS}
                for name in (
                    "modelroll_gateway_requests_total",
                    "modelroll_gateway_request_duration_seconds",
                    "modelroll_gateway_model_calls_total",
                    "modelroll_gateway_model_call_duration_seconds",
                    "modelroll_gateway_llm_time_to_first_token_seconds",
                    "modelroll_gateway_llm_time_per_output_token_seconds",
                )
            },
            "modelroll_gateway_upstream_errors_total": {"reason": UPSTREAM_ERROR_REASONS},
            "modelroll_gateway_shadow_requests_total": {"outcome": SHADOW_OUTCOMES},
            # The gateway relays streams as the sidecar does (modelroll_common.sse).
            "modelroll_gateway_llm_requests_total": {"outcome": STREAM_OUTCOMES},
        },
    ),
    Component(
        "operator",
        AnalysisMetrics,
        ROOT / "operator" / "README.md",
        {
            "modelroll_operator_analysis_phase": {"phase": PHASES},
            "modelroll_operator_analysis_weight": {"arm": ARMS},
            "modelroll_operator_analysis_verdict": {"verdict": VERDICTS},
            "modelroll_operator_analysis_judged_requests": {"arm": ARMS},
            "modelroll_operator_analysis_judged_bad_requests": {"arm": ARMS},
            "modelroll_operator_analysis_decisions_total": {"decision": DECISIONS},
        },
    ),
)


def marker(component: str) -> str:
    return f"<!-- make generate writes the table below from the {component}'s metrics -->"


@dataclass(frozen=True)
class Family:
    name: str
    """As exposed: a counter's ends in _total."""
    kind: str
    labels: tuple[tuple[str, tuple[str, ...]], ...]
    """Each label with the values listed for it."""
    documentation: str


def label_names(collector: Collector, described: Metric) -> tuple[str, ...]:
    if isinstance(collector, MetricWrapperBase):
        return tuple(collector._labelnames)
    if isinstance(collector, SharedHistogram):
        return collector.labelnames
    return tuple(getattr(described, "_labelnames", ()))  # a Collector's own families


def created_values(registry: CollectorRegistry) -> dict[str, dict[str, list[str]]]:
    """By family, by label: the values of the series that exist from the start."""
    found: dict[str, dict[str, list[str]]] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            for label, value in sample.labels.items():
                if label not in UNLISTED and label != "le":
                    values = found.setdefault(metric.name, {}).setdefault(label, [])
                    if value not in values:
                        values.append(value)
    return found


def families(component: Component) -> Iterator[Family]:
    registry = RecordingRegistry()
    component.register(registry)
    created = created_values(registry)
    for collector in registry.collectors:
        if not isinstance(collector, Describing):
            raise TypeError(f"{collector!r} describes no metric family")
        for described in collector.describe():
            name = described.name + ("_total" if described.type == "counter" else "")
            later = component.later_values.get(name, {})
            labels = tuple(
                (label, (*created.get(described.name, {}).get(label, ()), *later.get(label, ())))
                for label in label_names(collector, described)
            )
            yield Family(name, described.type, labels, described.documentation)


def labels_cell(family: Family) -> str:
    words = []
    for label, values in family.labels:
        shown = f"`{label}`"
        if values:
            shown += ": " + ", ".join(f"`{v}`" for v in dict.fromkeys(values))
        words.append(shown)
    return ", ".join(words)


def rows(component: Component) -> list[str]:
    table = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for family in families(component):
        cells = (f"`{family.name}`", family.kind, labels_cell(family), cell(family.documentation))
        table.append("| " + " | ".join(cells) + " |")
    return table


def outputs(documents: dict[Path, str]) -> dict[Path, str]:
    """``documents`` (path to text, read from disk when absent) with every metric table
    written: each component's in docs/design.md and in its README."""
    out = dict(documents)
    for component in COMPONENTS:
        table = rows(component)
        for path in (DESIGN, component.readme):
            text = out.get(path) or path.read_text()
            out[path] = splice(text, table, path, marker(component.name))
    return out

"""The documents keep up with the code.

docs/design.md holds the contracts (metrics; its CRD tables are generated); each component's
README holds its command-line flags. These tests read the code (the argparse parsers, the metrics
registered in a fresh CollectorRegistry) and fail, naming what is missing and where it
belongs, when something the code has is not documented:

- every long flag, on one line of its component's README together with its default (in backticks)
  and, for a command parsed by modelroll_common.flags.EnvArgumentParser, its MODELROLL_* variable;
  every `kubectl modelroll` subcommand;
- every metric family, on a row of docs/design.md that names each of its labels (and the `reason`
  and `phase` values that exist up front), and in its component's README;
- every relative link of README.md, docs/design.md, the guides in docs/ (guide, local-node, testing,
  troubleshooting), the chart's README and the component READMEs, to a file in the repository (and
  a heading in it).

Nothing is generated: add the missing row by hand, then run
`.venv/bin/python -m pytest tests/unit/test_docs.py -q`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from modelroll_common.calls import SharedHistogram
from modelroll_common.flags import EnvArgumentParser, env_name
from modelroll_gateway import cli as gateway_cli
from modelroll_gateway.metrics import UPSTREAM_ERROR_REASONS, GatewayMetrics
from modelroll_models import cli as encoder_cli
from modelroll_operator import cli as operator_cli
from modelroll_operator.analysis.exporter import PHASES, AnalysisMetrics
from modelroll_operator.plugin import cli as plugin_cli
from modelroll_sidecar import config as sidecar_config
from modelroll_sidecar.metrics import SidecarMetrics
from modelroll_standins import llm as demo_llm
from modelroll_standins import model as demo_model

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SIDECAR_README = ROOT / "sidecar" / "README.md"
GATEWAY_README = ROOT / "gateway" / "README.md"
OPERATOR_README = ROOT / "operator" / "README.md"
CRD = ROOT / "crds" / "modelversion.yaml"
LINKED_DOCUMENTS = (
    ROOT / "README.md",
    DESIGN,
    ROOT / "docs" / "guide.md",
    ROOT / "docs" / "local-node.md",
    ROOT / "docs" / "testing.md",
    ROOT / "docs" / "troubleshooting.md",
    ROOT / "charts" / "modelroll" / "README.md",
    SIDECAR_README,
    GATEWAY_README,
    OPERATOR_README,
    ROOT / "standins" / "README.md",
    ROOT / "models" / "README.md",
)
ENV_PREFIX = "MODELROLL_"


# -- reading the documents -------------------------------------------------------------------


def prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines: list[str] = []
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def mentions(line: str, word: str) -> bool:
    """Whether `word` (a flag, a metric name) occurs in `line` as a whole word."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", line) is not None


def quoted(value: str) -> str:
    return f"`{value}`"


def rows_with(path: Path, words: Sequence[str]) -> list[str]:
    """The lines of `path` that mention every one of `words`."""
    return [line for line in prose_lines(path) if all(mentions(line, w) for w in words)]


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# -- flags -----------------------------------------------------------------------------------


def _without_modelroll_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}


def sidecar_parser() -> argparse.ArgumentParser:
    return sidecar_config.build_parser(_without_modelroll_variables())


def gateway_parser() -> argparse.ArgumentParser:
    return gateway_cli.build_parser(_without_modelroll_variables())


def operator_parser() -> argparse.ArgumentParser:
    return operator_cli.build_parser(_without_modelroll_variables())


class _Caught(Exception):
    pass


def parser_built_by(parse_args: Callable[[list[str]], object]) -> argparse.ArgumentParser:
    """The parser a demo server's parse_args builds inside itself: taken from there."""
    caught: list[argparse.ArgumentParser] = []

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        caught.append(self)
        raise _Caught

    with (
        mock.patch.dict(os.environ, _without_modelroll_variables(), clear=True),
        mock.patch.object(argparse.ArgumentParser, "parse_args", catch),
        contextlib.suppress(_Caught),
    ):
        parse_args([])
    assert caught, f"{parse_args.__module__}.parse_args built no parser"
    return caught[0]


def demo_model_parser() -> argparse.ArgumentParser:
    return parser_built_by(demo_model.parse_args)


def demo_llm_parser() -> argparse.ArgumentParser:
    return parser_built_by(demo_llm.parse_args)


@dataclass(frozen=True)
class Command:
    name: str
    readme: Path
    build: Callable[[], argparse.ArgumentParser]


COMMANDS = (
    Command("modelroll-sidecar", SIDECAR_README, sidecar_parser),
    Command("modelroll-demo-model", ROOT / "standins" / "README.md", demo_model_parser),
    Command("modelroll-demo-llm", ROOT / "standins" / "README.md", demo_llm_parser),
    Command("modelroll-gateway", GATEWAY_README, gateway_parser),
    Command("modelroll-operator", OPERATOR_README, operator_parser),
    Command("kubectl modelroll", OPERATOR_README, plugin_cli.build_parser),
    Command("modelroll-encoder", ROOT / "models" / "README.md", encoder_cli.build_parser),
)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def options(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[argparse.ArgumentParser, argparse.Action]]:
    """Every option of the parser and of its subcommands (with the parser it belongs to), --help
    aside."""
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            yield parser, action
    for sub in subcommands(parser).values():
        yield from options(sub)


def variable(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    """The MODELROLL_* variable the option falls back on: every option of an EnvArgumentParser
    (modelroll_common.flags) has one; a plain ArgumentParser reads none."""
    if isinstance(parser, EnvArgumentParser) and action.default is not argparse.SUPPRESS:
        return env_name(action)
    return None


def shown_default(default: object) -> str | None:
    """A default as the docs write it (`30`, not `30.0`); None for no default worth showing."""
    if default is None or isinstance(default, bool) or default == argparse.SUPPRESS:
        return None
    if isinstance(default, list | tuple) and not default:
        return None
    if isinstance(default, int | float):
        number = float(default)
    elif isinstance(default, str):
        if not default:
            return None
        try:
            number = float(default)
        except ValueError:
            return default
        if not re.fullmatch(r"[0-9.]+", default):
            return default  # "inf", "1e3": shown as written
    else:
        return str(default)
    return str(int(number)) if number.is_integer() else str(number)


@dataclass(frozen=True)
class Flag:
    longs: tuple[str, ...]
    default: str | None
    env: str | None


def flags(command: Command) -> list[Flag]:
    """The command's long flags, each with its default and its MODELROLL_* variable."""
    found: dict[tuple[str, ...], Flag] = {}
    for parser, action in options(command.build()):
        longs = tuple(o for o in action.option_strings if o.startswith("--"))
        if not longs:
            continue
        flag = Flag(longs, shown_default(action.default), variable(parser, action))
        previous = found.get(longs)
        if previous is None or (previous.default is None and flag.default is not None):
            found[longs] = flag  # a subcommand's copy of -n/--kubeconfig has no default
    return list(found.values())


def flag_problems(command: Command) -> list[str]:
    problems = []
    for flag in flags(command):
        rows = rows_with(command.readme, flag.longs)
        named = ", ".join(flag.longs)
        if not rows:
            problems.append(f"{named} does not occur in {relative(command.readme)}")
            continue
        wanted = [quoted(w) for w in (flag.default, flag.env) if w is not None]
        if not any(all(w in row for w in wanted) for row in rows):
            problems.append(
                f"{named}: no line of {relative(command.readme)} shows it with "
                + " and ".join(wanted)
                + " (its default and variable, in backticks)"
            )
    return problems


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_every_flag_is_in_its_readme_with_its_default_and_variable(command: Command) -> None:
    problems = flag_problems(command)
    assert not problems, f"{command.name}:\n  " + "\n  ".join(problems)


def test_every_plugin_command_is_in_the_operator_readme() -> None:
    commands = subcommands(plugin_cli.build_parser())
    assert commands, "kubectl modelroll has no subcommands?"
    text = "\n".join(prose_lines(OPERATOR_README))
    missing = [name for name in commands if not re.search(rf"`{re.escape(name)}\b", text)]
    assert not missing, f"kubectl modelroll commands missing from operator/README.md: {missing}"


def test_the_flag_check_finds_what_is_missing(tmp_path: Path) -> None:
    """The check itself: a README without a flag's row, or with a wrong default, fails."""
    command = COMMANDS[0]
    lines = command.readme.read_text().splitlines()
    without = tmp_path / "without.md"
    without.write_text("\n".join(line for line in lines if "`--max-wait-ms`" not in line))
    problems = flag_problems(Command(command.name, without, command.build))
    assert f"--max-wait-ms does not occur in {without}" in problems, problems
    wrong = tmp_path / "wrong.md"
    wrong.write_text(command.readme.read_text().replace("| `32` |", "| `64` |"))
    problems = flag_problems(Command(command.name, wrong, command.build))
    assert any(p.startswith("--max-batch-size:") for p in problems), problems


# -- metrics ---------------------------------------------------------------------------------


class RecordingRegistry(CollectorRegistry):
    """A registry that remembers its collectors, to read their label names."""

    def __init__(self) -> None:
        super().__init__()
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self.collectors.append(collector)


@dataclass(frozen=True)
class Family:
    name: str
    """As exposed: counters end in _total."""
    labels: tuple[str, ...]
    values: frozenset[str]
    """The values of its `reason` and `phase` labels that the docs must list."""


ENUMERATED_LABELS = ("reason", "phase")
EXTRA_VALUES = {
    "modelroll_gateway_upstream_errors_total": frozenset(UPSTREAM_ERROR_REASONS),
    "modelroll_operator_analysis_phase": frozenset(PHASES),
}
"""Label values that exist only once they happen (no series up front)."""


def labelled(collector: Collector) -> list[tuple[Metric, Sequence[str]]]:
    """The families a collector describes, each with its label names."""
    if isinstance(collector, SharedHistogram):
        return [(d, collector.labelnames) for d in collector.describe()]
    if isinstance(collector, MetricWrapperBase):
        return [(d, collector._labelnames) for d in collector.describe()]
    # A Collector of its own describes families made with their label names.
    assert isinstance(collector, AnalysisMetrics), collector
    out: list[tuple[Metric, Sequence[str]]] = []
    for described in collector.describe():
        assert isinstance(described, GaugeMetricFamily | CounterMetricFamily), described
        out.append((described, described._labelnames))
    return out


def families(registry: RecordingRegistry) -> list[Family]:
    values: dict[str, set[str]] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            for label in ENUMERATED_LABELS:
                if label in sample.labels:
                    values.setdefault(metric.name, set()).add(sample.labels[label])
    found = []
    for collector in registry.collectors:
        for described, labelnames in labelled(collector):
            exposed = described.name + ("_total" if described.type == "counter" else "")
            wanted = values.get(described.name, set()) | EXTRA_VALUES.get(exposed, set())
            found.append(Family(exposed, tuple(labelnames), frozenset(wanted)))
    return found


def sidecar_families() -> list[Family]:
    registry = RecordingRegistry()
    SidecarMetrics("model", "version", registry)
    return families(registry)


def gateway_families() -> list[Family]:
    registry = RecordingRegistry()
    GatewayMetrics(registry)
    return families(registry)


def operator_families() -> list[Family]:
    registry = RecordingRegistry()
    AnalysisMetrics(registry)
    return families(registry)


def metric_problems(component: list[Family], readme: Path, design: Path = DESIGN) -> list[str]:
    problems = []
    for family in component:
        rows = [line for line in prose_lines(design) if quoted(family.name) in line]
        wanted = [quoted(w) for w in (*family.labels, *sorted(family.values))]
        if not rows:
            problems.append(f"{family.name} has no row in {relative(design)}")
        elif not any(all(w in row for w in wanted) for row in rows):
            problems.append(
                f"{family.name}: its row in {relative(design)} must name " + ", ".join(wanted)
            )
        if not any(mentions(line, family.name) for line in prose_lines(readme)):
            problems.append(f"{family.name} is not listed in {relative(readme)}")
    return problems


@pytest.mark.parametrize(
    ("families_of", "readme"),
    [
        (sidecar_families, SIDECAR_README),
        (gateway_families, GATEWAY_README),
        (operator_families, OPERATOR_README),
    ],
    ids=["sidecar", "gateway", "operator"],
)
def test_every_metric_is_documented_with_its_labels(
    families_of: Callable[[], list[Family]], readme: Path
) -> None:
    component = families_of()
    assert len(component) >= 5, "fewer metrics than expected: is the registry read right?"
    problems = metric_problems(component, readme)
    assert not problems, "\n  ".join(["metrics:", *problems])


def test_the_metric_check_finds_what_is_missing(tmp_path: Path) -> None:
    design = tmp_path / "design.md"
    design.write_text(
        "\n".join(
            line
            for line in DESIGN.read_text().splitlines()
            if "`modelroll_batches_total`" not in line
        )
    )
    problems = metric_problems(sidecar_families(), SIDECAR_README, design)
    assert problems == [f"modelroll_batches_total has no row in {design}"]
    wrong = tmp_path / "wrong.md"
    wrong.write_text(DESIGN.read_text().replace("`tokens`, `idle`, `drain`", "`tokens`"))
    problems = metric_problems(sidecar_families(), SIDECAR_README, wrong)
    assert problems == [
        f"modelroll_batches_total: its row in {wrong} must name "
        "`model`, `version`, `reason`, `drain`, `full`, `idle`, `timeout`, `tokens`"
    ]


# -- links -----------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path):
        match = HEADING.match(line)
        if match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@pytest.mark.parametrize("document", LINKED_DOCUMENTS, ids=relative)
def test_relative_links_point_into_the_repository(document: Path) -> None:
    problems = []
    for line in prose_lines(document):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (document.parent / path_part).resolve() if path_part else document
            if not resolved.is_relative_to(ROOT):
                problems.append(f"{target}: outside the repository (a dead link in a clone)")
            elif not resolved.exists():
                problems.append(f"{target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{target}: {relative(resolved)} has no heading #{anchor}")
    assert not problems, f"{relative(document)}:\n  " + "\n  ".join(problems)

"""The documents keep up with the code.

Most of what the documents say of the code is written from it by ``make generate`` (the flag
tables from the commands' parsers, hack/flag_tables.py; the metric tables from the components'
registries, hack/metric_tables.py), and ``make lint`` fails while a generated table is stale.
So are the CRD's tables in docs/design.md, from the generated CRD (hack/reference.py).
These tests check the generators on small parsers and registries of their own, and what is still
written by hand:

- every relative link of README.md, docs/design.md, the guides in docs/ (guide, local-node, testing,
  troubleshooting), the chart's README and the component READMEs, to a file in the repository (and
  a heading in it).

Run `.venv/bin/python -m pytest tests/unit/test_docs.py -q`.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from modelroll_common.flags import EnvArgumentParser, show_default

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SIDECAR_README = ROOT / "sidecar" / "README.md"
GATEWAY_README = ROOT / "gateway" / "README.md"
OPERATOR_README = ROOT / "operator" / "README.md"
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
HACK = ROOT / "hack"


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


def quoted(value: str) -> str:
    return f"`{value}`"


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# -- the generated tables --------------------------------------------------------------------


@pytest.fixture
def hack(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """A module of hack/, which make generate runs as scripts beside each other."""
    monkeypatch.syspath_prepend(str(HACK))
    return importlib.import_module


@pytest.fixture
def flag_rows(
    hack: Callable[[str], ModuleType], tmp_path: Path
) -> Callable[[argparse.ArgumentParser], list[str]]:
    """The rows hack/flag_tables.py writes for a parser."""
    flag_tables = hack("flag_tables")

    def rows(parser: argparse.ArgumentParser) -> list[str]:
        command = flag_tables.Command(parser.prog, tmp_path / "README.md", lambda: parser)
        written: list[str] = flag_tables.flag_rows(command)
        return written

    return rows


def test_a_flag_row_shows_the_flag_its_variable_its_default_and_its_help(
    flag_rows: Callable[[argparse.ArgumentParser], list[str]],
) -> None:
    parser = EnvArgumentParser(prog="modelroll-x", environ={})
    parser.add_argument("--max-wait-ms", type=float, default=10.0, help="at most | --max-size")
    show_default(
        parser.add_argument("-n", "--namespace", action="append", default=[], help="one"),
        "every namespace",
    )
    parser.add_argument("--dry-run", action="store_true", help="change nothing")
    assert flag_rows(parser) == [
        "| flag | variable | default | meaning |",
        "|---|---|---|---|",
        "| `--max-wait-ms` | `MODELROLL_MAX_WAIT_MS` | `10` | at most \\| `--max-size` |",
        "| `-n`, `--namespace` | `MODELROLL_NAMESPACE` (comma-separated) | every namespace | one |",
        "| `--dry-run` | `MODELROLL_DRY_RUN` (a switch) | off | change nothing |",
    ]


def test_a_plain_parser_gets_no_variable_and_its_help_default_a_cell(
    flag_rows: Callable[[argparse.ArgumentParser], list[str]],
) -> None:
    parser = argparse.ArgumentParser(prog="modelroll-y")
    parser.add_argument("--onnx", type=Path, help="the ONNX file (default: the package's)")
    parser.add_argument("--seed", type=int, default=0, help="seeds failures (default: 0)")
    assert flag_rows(parser) == [
        "| flag | default | meaning |",
        "|---|---|---|",
        "| `--onnx` | the package's | the ONNX file |",
        "| `--seed` | `0` | seeds failures |",
    ]


def test_subcommands_get_a_table_and_their_flags_say_where_they_go(
    hack: Callable[[str], ModuleType], flag_rows: Callable[[argparse.ArgumentParser], list[str]]
) -> None:
    parser = argparse.ArgumentParser(prog="kubectl x")
    parser.add_argument("--context", help="context")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--context", help="context", default=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command")
    show = commands.add_parser("show", parents=[common], help="show a model")
    show.add_argument("model", nargs="?")
    act = commands.add_parser("act", parents=[common], help="act on a version")
    act.add_argument("verb", choices=("go", "stop"), help="go: on; stop: off")
    act.add_argument("version")
    act.add_argument("--wait", type=float, default=30.0, help="seconds")
    flag_tables = hack("flag_tables")
    assert flag_tables.command_rows(parser) == [
        "| command | what it does |",
        "|---|---|",
        "| `show [MODEL]` | show a model |",
        "| `act {go,stop} VERSION` | act on a version; go: on; stop: off |",
    ]
    assert flag_rows(parser) == [
        "| flag | commands | default | meaning |",
        "|---|---|---|---|",
        "| `--context` | all, before or after the command |  | context |",
        "| `--wait` | `act` | `30` | seconds |",
    ]


def test_a_metric_row_shows_its_type_its_labels_with_their_values_and_its_help(
    hack: Callable[[str], ModuleType], tmp_path: Path
) -> None:
    def register(registry: CollectorRegistry) -> None:
        batches = Counter(
            "x_batches", "Batches | by --reason.", ["model", "reason"], registry=registry
        )
        batches.labels("m", "full")
        Gauge("x_weight", "Weights.", ["model", "arm"], registry=registry)

    metric_tables = hack("metric_tables")
    component = metric_tables.Component(
        "x", register, tmp_path / "README.md", {"x_weight": {"arm": ("canary", "baseline")}}
    )
    assert metric_tables.rows(component) == [
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
        "| `x_batches_total` | counter | `model`, `reason`: `full` | Batches \\| by `--reason`. |",
        "| `x_weight` | gauge | `model`, `arm`: `canary`, `baseline` | Weights. |",
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

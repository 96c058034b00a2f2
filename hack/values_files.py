"""The chart's files written from the values of ``hack/values.py``: ``values.yaml``,
``values.schema.json`` and the values table of the chart's README."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from values import DEFINITIONS, VALUES, Group, Node, Schema, Value  # hack/values.py

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "modelroll"
VALUES_YAML = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
README = CHART / "README.md"
MARKER = "<!-- make generate writes the table below from hack/values.py -->"
WIDTH = 96
"""Where values.yaml's comments wrap, their indentation included."""

# -- the schema ------------------------------------------------------------------------------


def node_schema(node: Node) -> Schema:
    if isinstance(node, Value):
        return {"description": node.description, **node.schema}
    schema: Schema = {"type": "object", "additionalProperties": False}
    if node.description:
        schema["description"] = node.description
    schema["properties"] = {child.key: node_schema(child) for child in node.children}
    if node.required:
        schema["required"] = list(node.required)
    return schema


def schema() -> str:
    """values.schema.json's text."""
    document = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "modelroll chart values",
        "type": "object",
        "additionalProperties": False,
        "properties": {node.key: node_schema(node) for node in VALUES},
        "definitions": DEFINITIONS,
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


# -- values.yaml -----------------------------------------------------------------------------

VALUES_HEADER = """\
# Default values for the modelroll chart. Every key is documented with a `# --` comment
# (helm-docs style); values.schema.json rejects keys that are not listed here. Written by
# `make generate` from hack/values.py, which declares each value once: edit that, not this file.
"""


def comment(text: str, indent: str, first: str = "# ") -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=f"{indent}{first}",
        subsequent_indent=f"{indent}# ",
        break_long_words=False,
        break_on_hyphens=False,
    )


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key, as in a hand-written values.yaml."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _string(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    """A string that would read as something else (``"1"``) in double quotes, like JSON."""
    style = '"' if data == "" or yaml.safe_load(data) != data or "|" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _string)


def scalar(value: Any) -> str:
    """A default on its key's line."""
    text: str = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=1000)
    return text.removesuffix("\n...\n").strip()


def value_lines(key: str, default: Any, indent: str) -> list[str]:
    if isinstance(default, dict | list) and default:
        block = yaml.dump(default, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
        return [f"{indent}{key}:", *(f"{indent}  {line}" for line in block.splitlines())]
    return [f"{indent}{key}: {scalar(default)}"]


def yaml_lines(node: Node, depth: int) -> Iterator[str]:
    """The node's lines; at the top, one that spans several lines is set apart by a blank."""
    indent = "  " * depth
    if isinstance(node, Value):
        if node.default is None:
            return
        above = comment(node.description, indent, "# -- ")
        body = value_lines(node.key, node.default, indent)
    else:
        above = comment(node.note, indent) if node.note else []
        body = [
            f"{indent}{node.key}:",
            *(line for child in node.children for line in yaml_lines(child, depth + 1)),
        ]
    if depth == 0 and len(body) > 1:
        yield ""
    yield from above
    yield from body


def values_yaml() -> str:
    lines = [line for node in VALUES for line in yaml_lines(node, 0)]
    return VALUES_HEADER + "\n" + "\n".join(lines) + "\n"


# -- the README's table ------------------------------------------------------------------------


def leaves(nodes: tuple[Node, ...], prefix: str = "") -> Iterator[tuple[str, Value]]:
    for node in nodes:
        if isinstance(node, Group):
            yield from leaves(node.children, f"{prefix}{node.key}.")
        elif node.default is not None:
            yield f"{prefix}{node.key}", node


def kind(default: Any) -> str:
    """helm-docs' name of a default's type."""
    for python, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "string")):
        if isinstance(default, python):
            return name
    return "list" if isinstance(default, list) else "object"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table_rows() -> list[str]:
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for path, value in leaves(VALUES):
        default = json.dumps(value.default, separators=(", ", ": "))
        rows.append(
            f"| `{path}` | {kind(value.default)} | `{cell(default)}` | {cell(value.description)} |"
        )
    return rows

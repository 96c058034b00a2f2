"""The reference tables written from modelroll's declarations: the ModelVersion fields that
``modelroll_common.settings`` declares (docs/design.md) and the sidecar flags they become
(sidecar/README.md), and the fields of ``spec.analysis`` and ``status.analysis`` as the CRD
declares them (docs/design.md).

Each table follows its marker line in its document and runs to the first line that is not a
table row; ``make generate`` (hack/generate.py) writes it, and the prose around it is edited by
hand.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from modelroll_common.settings import (
    BATCHING_CHOICES,
    BATCHING_SETTINGS,
    PROTOCOL,
    SIDECAR_SETTINGS,
    Choice,
    Setting,
)

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SIDECAR_README = ROOT / "sidecar" / "README.md"
MARKER = "<!-- make generate writes the table below from common/modelroll_common/settings.py -->"
CRD_MARKER = "<!-- make generate writes the table below from crds/modelversion.yaml -->"
ANALYSIS_MARKER = (
    "<!-- make generate writes the table below from crds/modelversion.yaml's spec.analysis -->"
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _values(words: tuple[str, ...]) -> str:
    return ", ".join(f"`{w}`" for w in words)


def field_rows() -> list[str]:
    """The design's rows: field, type, default, bounds, meaning."""
    rows = ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]

    def choice(prefix: str, c: Choice) -> None:
        values = _values(c.values)
        rows.append(
            f"| `{prefix}{c.key}` | string | `{c.default}` | {values} | {_cell(c.description)} |"
        )

    def integer(prefix: str, s: Setting, default: str) -> None:
        meaning = f"{s.description} Sidecar `{s.flag}`."
        rows.append(
            f"| `{prefix}{s.key}` | integer | {default} | {s.low}..{s.high} | {_cell(meaning)} |"
        )

    choice("spec.", PROTOCOL)
    for setting in BATCHING_SETTINGS:
        integer("spec.batching.", setting, f"`{setting.default}`")
    for option in BATCHING_CHOICES:
        choice("spec.batching.", option)
    for setting in SIDECAR_SETTINGS:
        default = setting.shown_default or f"the sidecar's, `{setting.default}`"
        integer("spec.sidecar.", setting, default)
    return rows


def flag_rows() -> list[str]:
    """The sidecar README's rows: flag, variable, default, meaning."""
    rows = ["| flag | variable | default | meaning |", "|---|---|---|---|"]

    def row(flag: str, default: str, meaning: str) -> None:
        variable = "MODELROLL_" + flag.removeprefix("--").upper().replace("-", "_")
        rows.append(f"| `{flag}` | `{variable}` | `{default}` | {_cell(meaning)} |")

    def integer(s: Setting, field: str) -> None:
        row(s.flag, str(s.default), f"{s.description} From {s.low} to {s.high} (`{field}`).")

    for setting in BATCHING_SETTINGS:
        integer(setting, f"spec.batching.{setting.key}")
    for option in (*BATCHING_CHOICES, PROTOCOL):
        field = f"spec.batching.{option.key}" if option is not PROTOCOL else "spec.protocol"
        meaning = (
            f"one of {_values(option.words)}, any case: {option.description} "
            f"(`{field}`: {_values(option.values)})"
        )
        row(option.flag, option.default.lower(), meaning)
    for setting in SIDECAR_SETTINGS:
        integer(setting, f"spec.sidecar.{setting.key}")
    return rows


def _type(schema: Mapping[str, Any]) -> str:
    kind = str(schema.get("type", "object"))
    return f"{_type(schema['items'])} array" if kind == "array" else kind


def _fields(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every field under ``schema`` as (path, its schema); array items as ``path[]``."""
    for name, child in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", child
        yield from _fields(child, f"{path}.{name}")
    if isinstance(items := schema.get("items"), Mapping):
        yield from _fields(items, f"{path}[]")


def _bounds(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return _values(tuple(str(v) for v in schema["enum"]))
    if "minimum" in schema and "maximum" in schema:
        return f"{schema['minimum']}..{schema['maximum']}"
    if "maxItems" in schema:
        return f"at most {schema['maxItems']}"
    return ""


def _default(schema: Mapping[str, Any]) -> str:
    if "default" not in schema:
        return ""
    value = schema["default"]
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _meaning(schema: Mapping[str, Any]) -> str:
    """The CRD's description, as a table cell continuing the field's name."""
    text = str(schema.get("description", ""))
    return _cell(text[:1].lower() + text[1:])


def analysis_spec_rows(crd: Mapping[str, Any]) -> list[str]:
    """The design's rows for ``spec.analysis``: field, type, default, bounds, meaning."""
    (version,) = crd["spec"]["versions"]
    analysis = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["analysis"]
    rows = ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    for path, schema in [("spec.analysis", analysis), *_fields(analysis, "spec.analysis")]:
        cells = (_type(schema), _default(schema), _bounds(schema), _meaning(schema))
        rows.append(f"| `{path}` | " + " | ".join(cells) + " |")
    return rows


def analysis_status_rows(crd: Mapping[str, Any]) -> list[str]:
    """The design's rows for ``status.analysis``: field, type, meaning (the CRD's description)."""
    (version,) = crd["spec"]["versions"]
    analysis = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "analysis"
    ]
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for path, schema in _fields(analysis, "status.analysis"):
        meaning = _cell(str(schema.get("description", "")))
        rows.append(f"| `{path}` | {_type(schema)} | {meaning} |")
    return rows


def splice(text: str, rows: list[str], where: Path, marker: str = MARKER) -> str:
    """``text`` with the table after its one ``marker`` line replaced by ``rows``."""
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line.strip() == marker]
    if len(at) != 1:
        raise ValueError(f"{where} must hold the line {marker!r} once, holds it {len(at)} times")
    start = at[0] + 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *rows, *lines[end:]])


def outputs(crd: Mapping[str, Any]) -> dict[Path, str]:
    """The two documents with their generated tables (``crd``: the CRD as generated)."""
    design = splice(DESIGN.read_text(), field_rows(), DESIGN)
    design = splice(design, analysis_spec_rows(crd), DESIGN, ANALYSIS_MARKER)
    return {
        DESIGN: splice(design, analysis_status_rows(crd), DESIGN, CRD_MARKER),
        SIDECAR_README: splice(SIDECAR_README.read_text(), flag_rows(), SIDECAR_README),
    }

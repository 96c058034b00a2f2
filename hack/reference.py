"""The reference tables written from modelroll's declarations: the ModelVersion fields that
``modelroll_common.settings`` declares (docs/design.md) and the sidecar flags they become
(sidecar/README.md), and the fields of ``spec.analysis`` and ``status.analysis`` as the CRD
declares them (docs/design.md).

Each table follows its marker line in its document and runs to the first line that is not a
table row; ``make generate`` (hack/generate.py) writes it, and the prose around it is edited by
hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
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
SPEC_MARKER = "<!-- make generate writes the table below from crds/modelversion.yaml's spec -->"
STATUS_MARKER = "<!-- make generate writes the table below from crds/modelversion.yaml's status -->"
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
    """Every field under ``schema`` as (path, its schema); array items as ``path[]``. A required
    field's schema says so under the key ``required`` (True)."""
    required = set(schema.get("required") or ())
    for name, child in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", {**child, "required": True} if name in required else child
        yield from _fields(child, f"{path}.{name}")
    if isinstance(items := schema.get("items"), Mapping):
        yield from _fields(items, f"{path}[]")


def _bounds(schema: Mapping[str, Any]) -> str:
    """What the CRD bounds a field by, in words."""
    said = []
    if "enum" in schema:
        said.append(_values(tuple(str(v) for v in schema["enum"])))
    if "minimum" in schema and "maximum" in schema:
        said.append(f"{schema['minimum']}..{schema['maximum']}")
    elif "minimum" in schema:
        said.append(f"at least {schema['minimum']}")
    if "maxLength" in schema:
        low = schema.get("minLength", 0)
        said.append(f"{low}..{schema['maxLength']} characters")
    elif "minLength" in schema:
        said.append(f"at least {schema['minLength']} characters")
    for key in ("maxItems", "maxProperties"):
        if key in schema:
            said.append(f"at most {schema[key]}")
    if keys := schema.get("x-kubernetes-list-map-keys"):
        said.append("a map keyed by " + " and ".join(f"`{k}`" for k in keys))
    return "; ".join(said)


def _default(schema: Mapping[str, Any]) -> str:
    if schema.get("required") is True:
        return "required"
    if "default" not in schema:
        return ""
    value = schema["default"]
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _meaning(schema: Mapping[str, Any]) -> str:
    """The CRD's description, as a table cell."""
    return _cell(str(schema.get("description", "")))


def _root(crd: Mapping[str, Any], top: str) -> Mapping[str, Any]:
    (version,) = crd["spec"]["versions"]
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]["properties"][top]
    return schema


SETTINGS_FIELDS = {
    "spec.protocol",
    *(f"spec.batching.{s.key}" for s in (*BATCHING_SETTINGS, *BATCHING_CHOICES)),
    *(f"spec.sidecar.{s.key}" for s in SIDECAR_SETTINGS),
}
"""The fields of the settings' own table (:func:`field_rows`)."""


def _spec_rows(fields: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    rows = ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    for path, schema in fields:
        cells = (_type(schema), _default(schema), _bounds(schema), _meaning(schema))
        rows.append(f"| `{path}` | " + " | ".join(cells) + " |")
    return rows


def spec_rows(crd: Mapping[str, Any]) -> list[str]:
    """The design's rows for ``spec`` but spec.analysis and the settings' fields: field,
    type, default, bounds, meaning (the CRD's description)."""
    fields = _fields(_root(crd, "spec"), "spec")
    return _spec_rows(
        (path, schema)
        for path, schema in fields
        if not path.startswith("spec.analysis") and path not in SETTINGS_FIELDS
    )


def analysis_spec_rows(crd: Mapping[str, Any]) -> list[str]:
    """The design's rows for ``spec.analysis``: field, type, default, bounds, meaning."""
    analysis = _root(crd, "spec")["properties"]["analysis"]
    return _spec_rows([("spec.analysis", analysis), *_fields(analysis, "spec.analysis")])


def _status_rows(fields: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for path, schema in fields:
        meaning = _cell(str(schema.get("description", "")))
        rows.append(f"| `{path}` | {_type(schema)} | {meaning} |")
    return rows


def status_rows(crd: Mapping[str, Any]) -> list[str]:
    """The design's rows for ``status`` but status.analysis: field, type, meaning."""
    fields = _fields(_root(crd, "status"), "status")
    return _status_rows(
        (path, schema) for path, schema in fields if not path.startswith("status.analysis")
    )


def analysis_status_rows(crd: Mapping[str, Any]) -> list[str]:
    """The design's rows for ``status.analysis``: field, type, meaning (the CRD's description)."""
    analysis = _root(crd, "status")["properties"]["analysis"]
    return _status_rows(_fields(analysis, "status.analysis"))


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
    design = splice(design, spec_rows(crd), DESIGN, SPEC_MARKER)
    design = splice(design, status_rows(crd), DESIGN, STATUS_MARKER)
    return {
        DESIGN: splice(design, analysis_status_rows(crd), DESIGN, CRD_MARKER),
        SIDECAR_README: splice(SIDECAR_README.read_text(), flag_rows(), SIDECAR_README),
    }

"""values.yaml and values.schema.json: every value documented for helm-docs, listed by the schema,
and the schema rejecting unknown keys and wrong types."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, Helm

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):")


def undocumented_keys(text: str) -> list[str]:
    """Keys of values.yaml that have no `# --` comment, on themselves or on all their children.

    helm-docs reads a `# --` comment block right above a key; a mapping documented as a whole
    (e.g. `podSecurityContext`) needs nothing more on its children.
    """
    nodes: list[tuple[int, str, bool]] = []  # (indent, dotted path, documented)
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = KEY_LINE.match(line)
        if not match:
            comment = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([p for _, p in stack] + [match["key"]])
        documented = any(c.startswith("# --") for c in comment)
        nodes.append((indent, path, documented))
        stack.append((indent, match["key"]))
        comment = []

    def ok(i: int) -> bool:
        _indent, path, documented = nodes[i]
        if documented:
            return True
        children = [
            j
            for j in range(i + 1, len(nodes))
            if nodes[j][1].startswith(path + ".") and nodes[j][1].count(".") == path.count(".") + 1
        ]
        return bool(children) and all(ok(j) for j in children)

    top = [i for i, (indent, _, _) in enumerate(nodes) if indent == 0]
    missing: list[str] = []

    def collect(i: int) -> None:
        if ok(i):
            return
        _, path, _ = nodes[i]
        children = [
            j
            for j in range(i + 1, len(nodes))
            if nodes[j][1].startswith(path + ".") and nodes[j][1].count(".") == path.count(".") + 1
        ]
        if not children:
            missing.append(path)
        for j in children:
            collect(j)

    for i in top:
        collect(i)
    return missing


def test_every_value_is_documented_with_a_helm_docs_comment() -> None:
    text = (CHART / "values.yaml").read_text()
    assert undocumented_keys(text) == []
    # The checker itself catches a key without a comment.
    assert undocumented_keys("a:\n  # -- fine\n  b: 1\n  c: 2\n") == ["a.c"]


def schema_gaps(values: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Keys present in values.yaml that the schema does not list (they would be rejected)."""
    gaps: list[str] = []
    if isinstance(values, dict) and "properties" in schema:
        for key, value in values.items():
            sub = schema["properties"].get(key)
            if sub is None:
                gaps.append(f"{path}{key}")
            else:
                gaps += schema_gaps(value, sub, f"{path}{key}.")
    return gaps


def test_schema_lists_every_default_value_and_closes_every_mapping() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema_gaps(values, schema) == []

    def open_objects(node: dict[str, Any], path: str = "") -> list[str]:
        found = []
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "(top)")
        for key, sub in node.get("properties", {}).items():
            found += open_objects(sub, f"{path}{key}.")
        return found

    assert open_objects(schema) == []


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("replica=2", "replica"),
        ("operator.replica=2", "replica"),
        ("gateway.service.nodePort=30080", "nodePort"),
        ("monitoring.podMonitor.enable=true", "enable"),
        ("monitoring.prometheusRule.errorRatio.treshold=0.1", "treshold"),
        ("monitoring.prometheusRule.timeToFirstToken.p99Seconds=1", "p99Seconds"),
    ],
)
def test_schema_rejects_unknown_keys(helm: Helm, setting: str, key: str) -> None:
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert key in result.stderr, result.stderr


@pytest.mark.parametrize(
    "setting",
    [
        "gateway.port=http",
        "operator.image.pullPolicy=Sometimes",
        "monitoring.podMonitor.interval=5",
    ],
)
def test_schema_rejects_wrong_types_and_values(helm: Helm, setting: str) -> None:
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr

"""The Pod Security rules of spec.server (``modelroll_operator.pod_security.RULES``) as CEL for
the chart's ValidatingAdmissionPolicy, and as the table of docs/design.md.

``make generate`` (hack/generate.py) writes ``charts/modelroll/admission/pod-security.yaml``,
the policy's ``validations`` (one per rule and place, each true when the field is unset or
allowed), which ``templates/admission-policy.yaml`` reads with ``.Files.Get``. Each refusal
says what the operator's own says, with the index of the first item at fault in a list and the
key in a map. A rule on a field the CRD does not let be set at a place (the model container has
no ``ports`` or ``lifecycle``) is left out there. Fields under one the CRD keeps as given
(x-kubernetes-preserve-unknown-fields: a security context, an init container) are read through
``dyn()``, so that the API server's type checking of the policy against the CRD (its
``status.typeChecking``) has nothing to warn about.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import reference  # hack/reference.py, beside this script

from modelroll_operator.pod_security import (
    CONTAINER_RULES,
    INIT_CONTAINERS,
    POD_RULES,
    RULES,
    SERVER,
    Allowed,
    Each,
    KeysStarting,
    Placed,
    Rule,
    Segment,
    shown,
)

ROOT = Path(__file__).resolve().parents[1]
VALIDATIONS = ROOT / "charts" / "modelroll" / "admission" / "pod-security.yaml"
HEADER = """\
# Written by `make generate` from operator/modelroll_operator/pod_security.py: the validations of
# the ValidatingAdmissionPolicy in templates/admission-policy.yaml. Edit the rules there.
"""
MARKER = (
    "<!-- make generate writes the table below from operator/modelroll_operator/pod_security.py -->"
)
ROOT_EXPRESSION = "object.?spec.?server"


def literal(text: str) -> str:
    """A CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def value_literal(value: bool | int | str) -> str:
    if isinstance(value, str):
        return literal(value)
    return json.dumps(value)  # true, false, a number


Schema = Mapping[str, Any] | None
"""A field's schema in the CRD; None under a field the CRD keeps as given
(x-kubernetes-preserve-unknown-fields): CEL's type checker knows nothing there."""


def child(schema: Schema, segment: Segment) -> tuple[bool, Schema]:
    """Whether a field at ``segment`` under ``schema`` can be set (the CRD declares it, or keeps
    whatever is given there), and its schema."""
    if schema is None:
        return True, None
    if isinstance(segment, Each):
        below = schema.get("items")
    elif isinstance(segment, KeysStarting):
        below = schema.get("additionalProperties")
    else:
        below = (schema.get("properties") or {}).get(segment)
    if isinstance(below, Mapping) and below:
        return True, below
    return bool(schema.get("x-kubernetes-preserve-unknown-fields")), None


@dataclass(frozen=True)
class Node:
    """A CEL expression for a place in the object: an optional (a field that may be unset) or
    a value (an item of a list, a value of a map), with its schema."""

    expression: str
    optional: bool
    schema: Schema

    def field(self, name: str) -> Node:
        """The field ``name`` under this one. One the CRD does not declare is read through
        ``dyn()``, which the type checker lets through."""
        _, below = child(self.schema, name)
        receiver = self.expression
        if self.schema is not None and below is None:
            receiver = f"dyn({receiver})"
        return Node(f"{receiver}.?{name}", optional=True, schema=below)

    def value(self, expression: str, segment: Segment) -> Node:
        """An item of this list, or a value of this map, as ``expression``."""
        return Node(expression, optional=False, schema=child(self.schema, segment)[1])

    def present(self, empty: str) -> str:
        """The value, or ``empty`` when unset."""
        return f"{self.expression}.orValue({empty})" if self.optional else self.expression


def admits(value: str, allowed: Allowed) -> str:
    """CEL: whether the value ``value`` is allowed."""
    tests = []
    if allowed.values:
        tests.append(f"{value} in [{', '.join(value_literal(v) for v in allowed.values)}]")
    tests += [
        f"(type({value}) == string && {value}.startsWith({literal(p)}))" for p in allowed.prefixes
    ]
    return " || ".join(tests) or "false"


def allows(node: Node, path: tuple[Segment, ...], allowed: Allowed, depth: int = 0) -> str:
    """CEL: whether everything at ``path`` under ``node`` is unset or allowed."""
    if not path:
        if not node.optional:
            return admits(node.expression, allowed)
        if not allowed.values:
            if not allowed.prefixes:
                return f"!{node.expression}.hasValue()"
            value = node.expression + ".value()"
            return f"!{node.expression}.hasValue() || {admits(value, allowed)}"
        # Unset reads as the first allowed value.
        return admits(node.present(value_literal(allowed.values[0])), allowed)
    head, rest = path[0], path[1:]
    if isinstance(head, Each):
        item = f"x{depth}"
        inner = allows(node.value(item, head), rest, allowed, depth + 1)
        return f"{node.present('[]')}.all({item}, {inner})"
    if isinstance(head, KeysStarting):
        key, found = f"k{depth}", node.present("{}")
        inner = allows(node.value(f"{found}[{key}]", head), rest, allowed, depth + 1)
        return f"{found}.all({key}, !{key}.startsWith({literal(head.prefix)}) || ({inner}))"
    return allows(node.field(head), rest, allowed, depth)


def where(node: Node, path: tuple[Segment, ...], allowed: Allowed, depth: int = 0) -> list[str]:
    """CEL: the pieces of the path of the first field at fault under ``node`` (literal text and
    expressions, to be joined by ``+``), from the field after ``node`` on."""
    if not path:
        return []
    head, rest = path[0], path[1:]
    if isinstance(head, Each):
        items, item = node.present("[]"), f"x{depth}"
        bad = f"!({allows(node.value(item, head), rest, allowed, depth + 1)})"
        first = f"{items}.filter({item}, {bad})[0]"
        after = where(node.value(first, head), rest, allowed, depth + 1)
        return [literal("["), f"string({items}.indexOf({first}))", literal("]"), *after]
    if isinstance(head, KeysStarting):
        found, key = node.present("{}"), f"k{depth}"
        bad = f"!({allows(node.value(f'{found}[{key}]', head), rest, allowed, depth + 1)})"
        first = f"{found}.filter({key}, {key}.startsWith({literal(head.prefix)}) && {bad})[0]"
        after = where(node.value(f"{found}[{first}]", head), rest, allowed, depth + 1)
        return [literal("['"), first, literal("']"), *after]
    return [literal(f".{head}"), *where(node.field(head), rest, allowed, depth)]


def joined(pieces: list[str]) -> str:
    """CEL pieces joined by ``+``, neighbouring literals merged."""
    merged: list[str] = []
    for piece in pieces:
        if merged and piece.startswith("'") and merged[-1].startswith("'"):
            merged[-1] = merged[-1][:-1] + piece[1:]
        else:
            merged.append(piece)
    return " + ".join(merged)


def validation(placed: Placed, server: Mapping[str, Any]) -> dict[str, str]:
    """One validation of the policy: the rule at its place, and its refusal (``server``: the
    schema of spec.server)."""
    root = Node(ROOT_EXPRESSION, optional=True, schema=server)
    allowed = placed.rule.allowed
    rule: dict[str, str] = {
        "expression": allows(root, placed.path, allowed),
        "message": placed.message(),
    }
    if any(not isinstance(segment, str) for segment in placed.path):
        pieces = [
            literal(SERVER),
            *where(root, placed.path, allowed),
            literal(placed.rule.message("")),
        ]
        rule["messageExpression"] = joined(pieces)
    return rule


def reaches(schema: Mapping[str, Any], path: tuple[Segment, ...]) -> bool:
    """Whether a field at ``path`` under ``schema`` can be set."""
    below: Schema = schema
    for segment in path:
        settable, below = child(below, segment)
        if not settable:
            return False
    return True


def server_schema(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    (version,) = crd["spec"]["versions"]
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["server"]
    return schema


def validations(crd: Mapping[str, Any]) -> list[dict[str, str]]:
    """The policy's validations, in the order of ``RULES``."""
    server = server_schema(crd)
    return [validation(placed, server) for placed in RULES if reaches(server, placed.path)]


def rows(crd: Mapping[str, Any]) -> list[str]:
    """docs/design.md's table: each rule, the containers or the pod it applies to, the field and
    what it allows once set."""
    server = server_schema(crd)
    table = ["| control | in | field | allowed once set |", "|---|---|---|---|"]
    for rule in CONTAINER_RULES:
        places = [
            name
            for name, path in (("model", rule.path), ("init", (*INIT_CONTAINERS, *rule.path)))
            if reaches(server, path)
        ]
        table.append(_row(rule, CONTAINERS[tuple(places)]))
    table += [_row(rule, "pod") for rule in POD_RULES]
    return table


CONTAINERS = {("model", "init"): "model and init containers", ("init",): "init containers"}


def _row(rule: Rule, places: str) -> str:
    allowed = ", ".join(f"`{value}`" for value in rule.allowed.shown()) or "nothing"
    return f"| {rule.control} | {places} | `{shown(rule.path)}` | {reference._cell(allowed)} |"

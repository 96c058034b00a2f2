"""Declaring fields once (modelroll_operator.schema): the schema, the reading and the writing
that one declared class gives, on a small class of this test's own."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from modelroll_operator.schema import (
    Api,
    Computed,
    FieldError,
    Json,
    Rule,
    api,
    decode,
    encode,
    schema_of,
)


class Color(enum.StrEnum):
    RED = "Red"
    BLUE = "Blue"


@dataclass(frozen=True)
class Part:
    """One part."""

    name: str = api("The part's name.", min_length=1, max_length=8)
    size: int = api("Its size.", default=1, defaulted=True, minimum=1, maximum=9)


@dataclass(frozen=True)
class Thing:
    RULES = (Rule("self.low <= self.high", "{path}.low must not exceed {path}.high"),)
    COMPUTED = (
        Computed("span", Api("high - low.", stored={"type": "integer"}), lambda t: t.high - t.low),
    )

    low: int = api("The low end.", default=0, defaulted=True, minimum=0, maximum=100)
    high: int = api("The high end.", default=10, defaulted=True, minimum=0, maximum=100)
    color: Color = api("Its color.", default=Color.RED, defaulted=True)
    label: str | None = api("A label.", default=None, empty_is_none=True)
    parts: tuple[Part, ...] = api("Its parts.", default=(), max_items=2)
    tags: Mapping[str, str] = api("Tags.", default_factory=dict, omit_empty=True)
    extra: Json | None = api("Kept as given.", default=None, nullable=True)
    host_ipc: bool = api("Named as Kubernetes names it.", default=False, name="hostIPC")

    def validate(self) -> None:
        if self.low > self.high:
            raise FieldError("thing.low must not exceed thing.high")


def test_the_schema_follows_the_types_and_the_declarations() -> None:
    schema = schema_of(Thing, "A thing.", "spec.thing")
    fields: dict[str, Any] = schema["properties"]
    assert "required" not in schema  # every field has a default
    assert fields["low"] == {
        "type": "integer",
        "description": "The low end.",
        "format": "int32",
        "default": 0,
        "minimum": 0,
        "maximum": 100,
    }
    assert fields["color"]["enum"] == ["Red", "Blue"]
    assert fields["color"]["default"] == "Red"
    assert fields["parts"]["items"]["required"] == ["name"]
    assert fields["parts"]["items"]["description"] == "One part."
    assert fields["tags"]["additionalProperties"] == {"type": "string"}
    assert fields["extra"] == {
        "type": "object",
        "description": "Kept as given.",
        "x-kubernetes-preserve-unknown-fields": True,
        "nullable": True,
    }
    assert "hostIPC" in fields
    assert fields["span"] == {"type": "integer", "description": "high - low."}
    assert schema["x-kubernetes-validations"] == [
        {
            "rule": "self.low <= self.high",
            "message": "spec.thing.low must not exceed spec.thing.high",
        }
    ]


def test_reading_applies_the_defaults_and_names_the_field_at_fault() -> None:
    thing = decode(Thing, {"high": 5, "label": "", "parts": [{"name": "a"}]}, "thing")
    assert thing == Thing(high=5, parts=(Part("a", 1),))
    assert decode(Thing, {"color": "Blue"}, "thing").color is Color.BLUE
    for raw, message in (
        ({"low": 101}, "thing.low must be within 0..100, got 101"),
        ({"low": "1"}, "thing.low must be an integer, got '1'"),
        ({"color": "Green"}, "thing.color must be one of Red, Blue, got 'Green'"),
        ({"parts": [{}]}, r"thing.parts\[0\].name is required"),
        ({"parts": [{"name": "a"}] * 3}, "thing.parts must list at most 2 items"),
        ({"low": 9, "high": 2}, "thing.low must not exceed thing.high"),
        ("a string", "thing must be an object"),
    ):
        with pytest.raises(FieldError, match=message):
            decode(Thing, raw, "thing")


def test_writing_leaves_out_what_is_unset_and_reads_back_the_same() -> None:
    thing = Thing(low=2, high=7, parts=(Part("a", 3),))
    written = encode(thing)
    assert written == {
        "low": 2,
        "high": 7,
        "color": "Red",
        "parts": [{"name": "a", "size": 3}],
        "extra": None,  # nullable: a merge patch removes what was there
        "hostIPC": False,
        "span": 5,
    }
    assert decode(Thing, written, "thing") == thing

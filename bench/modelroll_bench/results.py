"""Results to and from the JSON in bench/results/, for any dataclass: one generic pair of
functions, so that no result class writes its own ``to_dict``."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def to_json(value: Any) -> Any:
    """``value`` as JSON data: a dataclass as an object of its fields (recursively), a tuple as a
    list, a mapping's keys as strings; anything else as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def from_json(kind: type[T], data: Any) -> T:
    """The ``kind`` (a dataclass) that :func:`to_json` wrote as ``data``. Fields are converted by
    their annotations: dataclasses, lists, tuples, dicts, optionals and plain values."""
    return typing.cast(T, _convert(kind, data))


def _convert(kind: Any, data: Any) -> Any:
    if data is None:
        return None
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = typing.get_type_hints(kind)
        fields = {f.name for f in dataclasses.fields(kind) if f.init}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"{kind.__name__} has no field {', '.join(sorted(unknown))}")
        return kind(**{name: _convert(hints[name], value) for name, value in data.items()})
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        chosen = [a for a in args if a is not type(None)]
        return _convert(chosen[0], data) if len(chosen) == 1 else data
    if origin is list:
        return [_convert(args[0], v) for v in data]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in data)
        return tuple(_convert(a, v) for a, v in zip(args, data, strict=True))
    if origin is dict:
        return {_key(args[0], k): _convert(args[1], v) for k, v in data.items()}
    if kind is float and isinstance(data, int):
        return float(data)
    return data


def _key(kind: Any, key: str) -> Any:
    return kind(key) if kind in (int, float) else key


def dumps(value: Any) -> str:
    """``value`` as the indented JSON the results files hold."""
    return json.dumps(to_json(value), indent=2)


def write(value: Any, out: Path) -> None:
    """Write ``value`` as JSON to ``out``, making its folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(value))


def read(kind: type[T], path: Path) -> T:
    """The ``kind`` written to ``path`` by :func:`write`."""
    return from_json(kind, json.loads(path.read_text()))

"""Declaring a resource's fields once, in typed Python.

A declared class is a frozen dataclass whose fields carry :func:`api` metadata: the field's JSON
name, its description, bounds, enum and CEL rules, and whether the API server fills in its
default. Three things follow from the class and cannot drift apart:

- :func:`schema_of`: the OpenAPI v3 schema the CRD carries (``make generate`` writes it);
- :func:`decode`: a stored object read into the class, with the declared defaults and bounds
  applied (so an object stored before a default or a bound existed reads as the API server
  would now default it), the fields its class's ``derive(raw)`` gives taken from there (what
  an object stored by an earlier version reads as), its ``validate()`` run if it has one (the
  rules across its fields), and a :class:`FieldError` naming the field at fault;
- :func:`encode`: an instance written back as the JSON the API server stores.

The Python type of a field gives its JSON type: ``int``, ``float``, ``str``, ``bool``, a
``StrEnum`` (a string with those values), a declared class (an object), ``tuple[T, ...]`` (an
array), ``Mapping[str, str]`` (an object of strings) and :data:`Json` (an object the API server
keeps as given, for Kubernetes' own types such as a probe, which the API server checks when the
operator applies the Deployment). ``T | None`` is a field that may be left out. A field without
``api`` metadata is the class's own (derived while reading) and no part of the schema.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

Json = dict[str, Any]
"""An object the API server keeps as given (``x-kubernetes-preserve-unknown-fields``)."""


class FieldError(ValueError):
    """A stored object the operator cannot read; the message names the field."""


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule (``x-kubernetes-validations``) and the message it refuses with."""

    rule: str
    message: str
    field_path: str | None = None

    def to_json(self, path: str) -> Json:
        """The rule as the CRD writes it, ``{path}`` in its message the path of its field."""
        out: Json = {"rule": self.rule, "message": self.message.replace("{path}", path)}
        return out | ({"fieldPath": self.field_path} if self.field_path else {})


_NO = object()
"""Not given (a default of ``None`` is a value)."""


@dataclass(frozen=True)
class Api:
    """What the schema says of one field, beyond its Python type and default."""

    description: str
    name: str | None = None
    schema_default: Any = _NO
    """What the API server fills in when the field is left out (absent: nothing)."""
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    min_items: int | None = None
    max_items: int | None = None
    max_properties: int | None = None
    enum: tuple[str, ...] | None = None
    rules: tuple[Rule, ...] = ()
    format: str | None = None
    """The schema's format; for an ``int`` field, int32 unless given ("" for none)."""
    items: Json | None = None
    """The schema of an array's items, or of an object's values, where it is Kubernetes' own."""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Further schema keys, as the CRD spells them (``x-kubernetes-list-type``, say)."""
    empty_is_none: bool = False
    """An empty string reads as the field left out."""
    read: Callable[[Any, str], Any] | None = None
    """Reads the field's JSON value instead of its type (the value, the field's path)."""
    write: Callable[[Any], Any] | None = None
    """Writes the field's value as JSON instead of its type."""
    stored: Json | None = None
    """The JSON schema of a field stored in a shape of its own (``read`` and ``write`` convert
    it), instead of its type's; the field's description and bounds are added to it."""
    nullable: bool = False
    """None is written as null (so that a merge patch removes what was there), not left out."""
    omit_empty: bool = False
    """An empty value (an empty map, say) is left out when written."""
    inline: bool = False
    """A declared class whose fields are stored beside this class's own, not under a key."""

    def json_name(self, attr: str) -> str:
        return self.name or _camel(attr)


@dataclass(frozen=True)
class Computed:
    """A field written for the reader's sake and never read back (a ratio worked out from the
    stored counts, say): its JSON name, its declaration and how it is worked out (None: left
    out). A class lists them in ``COMPUTED``."""

    name: str
    api: Api
    value: Callable[[Any], Any]


def api(
    description: str,
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    defaulted: bool = False,
    **options: Any,
) -> Any:
    """A declared field. ``defaulted``: the API server fills in the Python default (a ``default``
    that cannot be written as JSON, or differs from what the CRD declares, goes in
    ``schema_default`` instead)."""
    meta = Api(description, **options)
    if defaulted:
        value = default if default is not MISSING else default_factory()
        meta = dataclasses.replace(meta, schema_default=_to_json(value))
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={"api": meta}
    )


def _camel(attr: str) -> str:
    head, *rest = attr.split("_")
    return head + "".join(word.title() for word in rest)


@dataclass(frozen=True)
class _Field:
    attr: str
    name: str
    type: Any
    """The Python type, ``None`` taken out of an optional one."""
    api: Api
    field: dataclasses.Field[Any]

    @property
    def has_default(self) -> bool:
        return self.field.default is not MISSING or self.field.default_factory is not MISSING


def fields_of(cls: type) -> tuple[_Field, ...]:
    """The declared fields of ``cls``, in their order."""
    return _fields_of(cls)


@cache
def _fields_of(cls: Any) -> tuple[_Field, ...]:
    hints = get_type_hints(cls)
    declared = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("api")
        if not isinstance(meta, Api):
            continue
        declared.append(_Field(f.name, meta.json_name(f.name), _unoptional(hints[f.name]), meta, f))
    return tuple(declared)


def _is_class(kind: Any) -> bool:
    """Whether a field's type is a declared class (an object in JSON)."""
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _unoptional(kind: Any) -> Any:
    """``T`` of ``T | None``; any other type as it is."""
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


# The schema.


def schema_of(cls: type, description: str, path: str) -> Json:
    """The OpenAPI schema of a declared class, as the object at ``path`` so described. Its
    object-level rules are its ``RULES``. A class that only the operator writes, always whole,
    sets ``WRITTEN_WHOLE``: its schema requires nothing, and reading it says what is missing."""
    properties: Json = {}
    for f in fields_of(cls):
        if f.api.inline:
            properties |= schema_of(f.type, "", path)["properties"]
        else:
            properties[f.name] = _field_schema(f, f"{path}.{f.name}")
    for c in getattr(cls, "COMPUTED", ()):
        properties[c.name] = {**c.api.stored, "description": c.api.description} | _bounds(c.api)
    required = [
        f.name
        for f in fields_of(cls)
        if not (f.has_default or f.api.inline or getattr(cls, "WRITTEN_WHOLE", False))
    ]
    schema: Json = {"type": "object", "description": description}
    if required:
        schema["required"] = required
    schema["properties"] = properties
    rules = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_json(path) for r in rules]
    return schema


def _field_schema(f: _Field, path: str) -> Json:
    meta = f.api
    rules = meta.rules
    if _is_class(f.type) and meta.stored is None:
        schema = schema_of(f.type, meta.description, path)
        head = {k: schema.pop(k) for k in ("type", "description")}
        head |= {"required": schema.pop("required")} if "required" in schema else {}
        schema = head | _bounds(meta) | schema
        rules = tuple(getattr(f.type, "RULES", ())) + rules
    else:
        kind = meta.stored if meta.stored is not None else _type_schema(f.type, meta, path)
        schema = {**kind, "description": meta.description}
        schema = {"type": schema.pop("type"), "description": schema.pop("description"), **schema}
        schema |= _bounds(meta)
    if rules:
        schema["x-kubernetes-validations"] = [r.to_json(path) for r in rules]
    return schema


def _bounds(meta: Api) -> Json:
    keys: Json = {"nullable": True} if meta.nullable else {}
    if meta.schema_default is not _NO:
        keys["default"] = meta.schema_default
    for key, value in (
        ("enum", list(meta.enum) if meta.enum else None),
        ("minimum", meta.minimum),
        ("maximum", meta.maximum),
        ("minLength", meta.min_length),
        ("maxLength", meta.max_length),
        ("pattern", meta.pattern),
        ("minItems", meta.min_items),
        ("maxItems", meta.max_items),
        ("maxProperties", meta.max_properties),
    ):
        if value is not None:
            keys[key] = value
    return keys | dict(meta.extra)


def _type_schema(kind: Any, meta: Api, path: str) -> Json:
    origin = get_origin(kind)
    if kind is bool:
        return {"type": "boolean"}
    if kind is int:
        fmt = "int32" if meta.format is None else meta.format
        return {"type": "integer"} | ({"format": fmt} if fmt else {})
    if kind is float:
        return {"type": "number"}
    if kind is str:
        return {"type": "string"} | ({"format": meta.format} if meta.format else {})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return {"type": "string", "enum": [member.value for member in kind]}
    if origin is tuple:
        items = meta.items or _item_schema(get_args(kind)[0], f"{path}[]")
        return {"type": "array", "items": items}
    if origin in (dict, Mapping) and get_args(kind)[1] is str:
        return {"type": "object", "additionalProperties": meta.items or {"type": "string"}}
    if kind == Json or origin in (dict, Mapping):
        if meta.items is not None:
            return {"type": "object"} | meta.items
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    raise TypeError(f"no JSON type for {kind!r}")


def _item_schema(kind: Any, path: str) -> Json:
    """The items of an array; of a declared class, described by the class's docstring."""
    if _is_class(kind):
        return schema_of(kind, _docstring(kind), path)
    return _type_schema(kind, Api(""), path)


def _docstring(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


# Reading.

_D = TypeVar("_D")


def decode(cls: type[_D], raw: object, where: str) -> _D:
    """``raw`` (a stored object) as ``cls``, or FieldError naming the field at fault."""
    if not isinstance(raw, Mapping):
        raise FieldError(f"{where} must be an object")
    derive = getattr(cls, "derive", None)
    derived: dict[str, Any] = derive(raw) if derive is not None else {}
    values: dict[str, Any] = {}
    for f in fields_of(cls):
        if f.attr in derived:
            continue
        if f.api.inline:
            values[f.attr] = decode(f.type, raw, where)
            continue
        value = raw.get(f.name)
        path = f"{where}.{f.name}"
        if value is None or (f.api.empty_is_none and value == ""):
            if not f.has_default:
                raise FieldError(f"{path} is required")
            continue  # the dataclass's default
        values[f.attr] = _read(f.type, f.api, value, path)
    values |= derived
    try:
        value = cls(**values)
    except (TypeError, ValueError) as exc:
        raise FieldError(f"{where}: {exc}") from None
    validate = getattr(value, "validate", None)
    if validate is not None:
        validate()  # the class's rules across its fields, as the CRD's CEL checks them
    return value


def _read(kind: Any, meta: Api, value: Any, path: str) -> Any:
    if meta.read is not None:
        return meta.read(value, path)
    origin = get_origin(kind)
    if kind is bool:
        if not isinstance(value, bool):
            raise FieldError(f"{path} must be true or false")
        return value
    if kind is int or kind is float:
        return _number(kind, meta, value, path)
    if kind is str:
        return _word(meta.enum, value, path)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(_word(tuple(m.value for m in kind), value, path))
    if _is_class(kind):
        return decode(kind, value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise FieldError(f"{path} must be a list")
        if meta.min_items is not None and len(value) < meta.min_items:
            raise FieldError(f"{path} must list at least {meta.min_items} item(s)")
        if meta.max_items is not None and len(value) > meta.max_items:
            raise FieldError(f"{path} must list at most {meta.max_items} items")
        item = get_args(kind)[0]
        return tuple(_read(item, Api(""), v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise FieldError(f"{path} must be an object")
        if get_args(kind)[1] is str:
            if not all(isinstance(v, str) for v in value.values()):
                raise FieldError(f"{path} must map names to strings")
            return {str(k): v for k, v in value.items()}
        return dict(value)
    raise TypeError(f"no reading of {kind!r}")


def _number(kind: type, meta: Api, value: Any, path: str) -> int | float:
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise FieldError(f"{path} must be an integer, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"{path} must be a number, got {value!r}")
    low, high = meta.minimum, meta.maximum
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"{_shown(low)}..{_shown(high)}" if low is not None and high is not None else ""
        bound = (
            f"within {span}"
            if span
            else (f"at least {_shown(low)}" if low is not None else f"at most {_shown(high)}")
        )
        raise FieldError(f"{path} must be {bound}, got {value}")
    return value if kind is int else float(value)


def _shown(bound: float | None) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _word(values: tuple[str, ...] | None, value: Any, path: str) -> str:
    if values is not None and value not in values:  # exact spelling, as the CRD's enum
        raise FieldError(f"{path} must be one of {', '.join(values)}, got {value!r}")
    if not isinstance(value, str):
        raise FieldError(f"{path} must be a string")
    return value


# Writing.


def encode(value: Any) -> Json:
    """A declared instance as the JSON the API server stores: fields that are None left out
    (or null, if nullable), then its computed fields."""
    out: Json = {}
    for f in fields_of(type(value)):
        item = getattr(value, f.attr)
        if f.api.inline:
            out |= encode(item)
        elif item is None:
            if f.api.nullable:
                out[f.name] = None
        elif not (f.api.omit_empty and not item):
            out[f.name] = f.api.write(item) if f.api.write is not None else _to_json(item)
    for c in getattr(type(value), "COMPUTED", ()):
        if (worked_out := c.value(value)) is not None:
            out[c.name] = worked_out
    return out


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encode(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    return value

"""How status.analysis stores counters: a map of counts as a list of ``{key, count}`` and a
histogram as a list of ``{le, count}``, in a fixed order; the schema of each and its reading and
writing, for the declarations of counts.py and state.py.

Lists, not maps keyed by code: the state is written with JSON merge patches, which would keep
keys a new map lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..schema import FieldError, Json, api

Histogram = tuple[tuple[float, float], ...]
"""Cumulative (le, count), ascending, the last le is +Inf."""

MAX_VALUES = 100
"""The most status codes, buckets or outcomes of one family and one version read from one
source: the CRD's bound on each list of ``status.analysis.sources`` (a gateway exports a few
dozen). More is a bad answer, rather than a status the API server refuses whole."""
MAX_LABEL = {"code": 16, "outcome": 64}
"""The longest status code and stream outcome ``status.analysis.sources`` holds."""


def counted(key: str, key_description: str, count_description: str) -> Json:
    """The schema of a map of counts stored as a list of ``{key, count}``."""
    key_max = MAX_LABEL[key]
    return {
        "type": "array",
        "items": {
            "type": "object",
            "description": f"One {'outcome' if key == 'outcome' else 'status code'}'s count.",
            "properties": {
                key: {"type": "string", "description": key_description, "maxLength": key_max},
                "count": {"type": "number", "description": count_description},
            },
        },
    }


def histogram(count_description: str) -> Json:
    """The schema of a histogram stored as a list of ``{le, count}``."""
    return {
        "type": "array",
        "items": {
            "type": "object",
            "description": "One bucket.",
            "properties": {
                "le": {
                    "type": "string",
                    "description": "The bucket's upper bound in seconds (+Inf for the last).",
                    "maxLength": 32,
                },
                "count": {"type": "number", "description": count_description},
            },
        },
    }


def counted_field(
    description: str, key: str, key_description: str, count_description: str, **options: Any
) -> Any:
    """A declared map of counts, stored as a list of ``{key, count}``."""
    return api(
        description,
        default_factory=dict,
        max_items=MAX_VALUES,
        stored=counted(key, key_description, count_description),
        read=read_counted(key),
        write=write_counted(key),
        **options,
    )


def histogram_field(description: str, count_description: str, **options: Any) -> Any:
    """A declared histogram, stored as a list of ``{le, count}``."""
    return api(
        description,
        default=(),
        max_items=MAX_VALUES,
        stored=histogram(count_description),
        read=read_histogram,
        write=write_histogram,
        **options,
    )


def write_counted(key: str) -> Callable[[Mapping[str, float]], list[Json]]:
    def write(counts: Mapping[str, float]) -> list[Json]:
        return [{key: k, "count": number(n)} for k, n in sorted(counts.items())]

    return write


def read_counted(key: str) -> Callable[[Any, str], dict[str, float]]:
    def read(raw: Any, where: str) -> dict[str, float]:
        try:
            return {str(c[key]): float(c["count"]) for c in raw}
        except (KeyError, TypeError, ValueError):
            raise FieldError(f"{where} must list {{{key}, count}} objects") from None

    return read


def write_histogram(buckets: Histogram) -> list[Json]:
    return [{"le": _le(le), "count": number(n)} for le, n in buckets]


def read_histogram(raw: Any, where: str) -> Histogram:
    try:
        return tuple((float(b["le"]), float(b["count"])) for b in raw)
    except (KeyError, TypeError, ValueError):
        raise FieldError(f"{where} must list {{le, count}} objects") from None


def write_sums(sums: Mapping[str, float]) -> Json:
    return {k: number(n) for k, n in sorted(sums.items())}


def read_sums(raw: Any, where: str) -> dict[str, float]:
    try:
        return {str(k): float(n) for k, n in raw.items()}
    except (AttributeError, TypeError, ValueError):
        raise FieldError(f"{where} must map names to numbers") from None


def number(value: float) -> int | float:
    """A count as JSON: an integer when it is one."""
    return int(value) if float(value).is_integer() else value


def seconds(value: float) -> float:
    """A time as the status keeps it, to the millisecond."""
    return round(value, 3)


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes it (``float()`` reads it back, "+Inf" included)."""
    return "+Inf" if math.isinf(bound) else repr(bound)

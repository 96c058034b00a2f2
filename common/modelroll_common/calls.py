"""Which requests shared a model call: the sidecar says it on every answer, the gateway counts it.

A batch's requests succeed or fail together and share its duration, so a canary analysis takes
the model call, not the request, as its unit of evidence (docs/analysis.md). Each answer carries
the number of requests the model call that decided it held; each request is then 1/n of a call.
"""

from __future__ import annotations

CALL_SIZE_HEADER = "X-Modelroll-Batch-Size"
"""Response header: the requests of the model call that decided this answer (1: no batch)."""

MAX_CALL_SIZE = 1 << 16
"""Larger values read as this: no sidecar batch is near it."""


def call_share(value: str | None) -> float:
    """The share of a model call one answer stands for: 1/n for a valid ``n``, else 1 (an
    answer without the header, or with one that is not a positive integer, is its own call)."""
    if value is None or not value.isdigit():
        return 1.0
    size = int(value)
    return 1.0 if size <= 1 else 1.0 / min(size, MAX_CALL_SIZE)

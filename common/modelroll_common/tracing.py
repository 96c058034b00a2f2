"""The request headers that follow a request through every hop (gateway, sidecar, model), so
that a request id or a trace started by the client is still the model's."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

REQUEST_ID = "X-Request-Id"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
PASSED_ON = (REQUEST_ID, TRACEPARENT, TRACESTATE)
"""Passed from each hop to the next as the client sent them. A client's Authorization is not:
it is meant for whatever authenticates clients in front of the gateway, never for an engine."""


def passed_on(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of ``headers`` that go on to the next hop."""
    return {name: value for name in PASSED_ON if (value := headers.get(name)) is not None}


_TRACEPARENT = re.compile(r"(?!ff)([0-9a-f]{2})-(?!0{32})([0-9a-f]{32})-[0-9a-f]{16}-([0-9a-f]{2})")
"""W3C Trace Context's traceparent: version (not ff), trace id (not all zeros), parent id,
flags."""


def new_span(traceparent: str) -> str | None:
    """``traceparent`` with a span (parent) id of its own: the same trace, version and flags,
    for a second request made on behalf of the same one; None for a value that is not a
    W3C traceparent."""
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace, flags = match.groups()
    return f"{version}-{trace}-{secrets.token_hex(8)}-{flags}"

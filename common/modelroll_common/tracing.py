"""The request headers that follow a request through every hop (gateway, sidecar, model), so
that a request id or a trace started by the client is still the model's."""

from __future__ import annotations

from collections.abc import Mapping

PASSED_ON = ("X-Request-Id", "traceparent", "tracestate")
"""Passed from each hop to the next as the client sent them. A client's Authorization is not:
it is meant for whatever authenticates clients in front of the gateway, never for an engine."""


def passed_on(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of ``headers`` that go on to the next hop."""
    return {name: value for name in PASSED_ON if (value := headers.get(name)) is not None}

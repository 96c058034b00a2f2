"""Errors in OpenAI's shape, as the sidecar and the gateway answer them on the OpenAI routes:
``{"error": {"message", "type", "param", "code"}}``, which the official clients turn into the
matching exception (BadRequestError, NotFoundError, RateLimitError, ...) with the message."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
"""The error ``type`` of the statuses that have their own; other 4xx are
``invalid_request_error``, 5xx ``server_error``."""


def error_type(status: int) -> str:
    if status in TYPES:
        return TYPES[status]
    return "invalid_request_error" if status < 500 else "server_error"


def openai_error(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An error answer in OpenAI's shape; ``code`` is the HTTP status."""
    body = {
        "error": {"message": message, "type": error_type(status), "param": None, "code": status}
    }
    return web.json_response(body, status=status, headers=dict(headers or {}))

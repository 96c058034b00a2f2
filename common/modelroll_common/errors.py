"""Error answers of the sidecar and the gateway, always JSON, in one of two shapes.

- modelroll's own, ``{"error": message}``, on the batch inference path and everything else;
- OpenAI's, ``{"error": {"message", "type", "param", "code"}}``, on the OpenAI routes, which the
  official clients turn into the matching exception (BadRequestError, NotFoundError,
  RateLimitError, ...) with the message.

:func:`json_errors` is the one middleware both servers install: routing errors (404, 405) and
unexpected exceptions become JSON answers there. Malformed HTTP never reaches an app; the
server answers it itself with :func:`error_body` (``modelroll_common.server``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
"""The error ``type`` of the statuses that have their own; other 4xx are
``invalid_request_error``, 5xx ``server_error``."""

JSON = "application/json"


def error_type(status: int) -> str:
    if status in TYPES:
        return TYPES[status]
    return "invalid_request_error" if status < 500 else "server_error"


def error_body(message: str) -> bytes:
    """modelroll's own error shape."""
    return json.dumps({"error": message}).encode()


def openai_error(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An error answer in OpenAI's shape; ``code`` is the HTTP status."""
    body = {
        "error": {"message": message, "type": error_type(status), "param": None, "code": status}
    }
    return web.json_response(body, status=status, headers=dict(headers or {}))


def error_answer(
    status: int, message: str, *, openai: bool, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An error answer in OpenAI's shape (``openai``) or modelroll's own."""
    if openai:
        return openai_error(status, message, headers)
    return web.Response(
        status=status, body=error_body(message), content_type=JSON, headers=dict(headers or {})
    )


def _never(_: str) -> bool:
    return False


def json_errors(component: str, openai_path: Callable[[str], bool] = _never) -> Middleware:
    """The middleware that answers every routing error and unexpected exception in JSON: a 404
    names the path, a 405 the methods allowed (in ``Allow`` too), anything raised is logged and
    answered 500 naming ``component``. On the paths ``openai_path`` accepts, in OpenAI's shape."""
    log = logging.getLogger(f"modelroll_{component}")

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            status, message, headers = _http_error(request, exc)
        except Exception:
            log.exception("Handling %s %s failed", request.method, request.path)
            status, message, headers = 500, f"internal error in the {component} (logged)", {}
        return error_answer(status, message, openai=openai_path(request.path), headers=headers)

    return middleware


def _http_error(request: web.Request, exc: web.HTTPException) -> tuple[int, str, dict[str, str]]:
    """What to say for an error aiohttp raised (its router's 404 and 405 among them)."""
    if isinstance(exc, web.HTTPMethodNotAllowed):
        # HEAD goes with GET; the methods a client would pick are the ones to name.
        allowed = ", ".join(sorted(m for m in exc.allowed_methods if m != "HEAD"))
        message = f"method {request.method} is not allowed on {request.path}; use {allowed}"
        return exc.status, message, {"Allow": allowed}
    if isinstance(exc, web.HTTPNotFound):
        return exc.status, f"no such path {request.path!r}", {}
    return exc.status, exc.reason, {}

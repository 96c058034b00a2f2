"""The model protocol: what any model server behind the sidecar implements, and a client for it.

``POST /v1/batch {"inputs": [...]}`` answers ``{"outputs": [...]}`` in the same order, with an
optional ``"errors": [null, "why", ...]`` per item. ``GET /readyz`` answers 200 once it serves.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from modelroll_common.sse import MAX_ANSWER_BYTES, AnswerTooLarge, read_whole

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a request (or a model's answer)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number is out of range (it overflows a double)")
    return value


def decode(raw: bytes) -> Any:
    """Parse JSON exactly: integers of any size stay integers (orjson would turn ones beyond
    64 bits into floats); NaN and Infinity, which are not JSON, and numbers that overflow a
    double (1e400), which a model server would read as infinite, are refused; so is nesting
    deeper than MAX_DEPTH. Every refusal is a ValueError whose message names no payload."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


class NotText(ValueError):
    """A JSON string that is not Unicode text: it holds a lone surrogate."""


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""What a JSON escape from \\ud800 to \\udfff that is not half of a pair (or such a code point
spelled in bytes, which Python's json module lets through) leaves in a string: no character at
all, which no model, tokenizer or UTF-8 encoder can take."""


def decode_request(raw: bytes) -> Any:
    """:func:`decode` a client's request, refusing strings that are not Unicode text (NotText,
    whose message names no payload)."""
    value = decode(raw)
    if _may_hold_surrogates(raw) and any(LONE_SURROGATE.search(text) for text in _strings(value)):
        raise NotText(
            "undecodable text: a string holds a lone surrogate (an escape from \\ud800 to "
            "\\udfff that is not half of a surrogate pair); send Unicode text"
        )
    return value


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a surrogate, which a string of the body may hold alone."""


def _may_hold_surrogates(raw: bytes) -> bool:
    """Whether a string of the body may hold a surrogate: only through an escape, or through a
    surrogate's bytes, which strict UTF-8 refuses. Most bodies have neither, and their strings
    need not be walked."""
    if SURROGATE_ESCAPE.search(raw):
        return True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _strings(value: Any) -> Iterator[str]:
    """Every string in ``value``, object keys included, without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar: 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        if depth > MAX_DEPTH:
            return depth
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def encode(value: Any) -> bytes:
    """Serialise to compact JSON: orjson, or the standard library for integers beyond 64 bits."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def payload_length(payload: object) -> int:
    """A request's length for padding and token budgets: whitespace tokens of a string, items of a
    list, otherwise 1. Never below 1, since even an empty input occupies a row of the batch."""
    if isinstance(payload, str):
        return max(1, len(payload.split()))
    if isinstance(payload, list):
        return max(1, len(payload))
    return 1


def padded_tokens(lengths: list[int]) -> int:
    """Padded cost of a batch: batch size times its longest length."""
    return len(lengths) * max(lengths, default=0)


class ModelError(Exception):
    """The model could not serve a whole batch. ``status`` is what each request in it gets."""

    status = 502


class ModelUnreachable(ModelError):
    """No connection to the model server could be made."""

    status = 503


class ModelFailed(ModelError):
    """The model answered badly, too slowly, or not at all after accepting the connection."""

    status = 502


class ModelRejected(ModelFailed):
    """The model refused the batch as bad input (HTTP 4xx): one of its inputs may be to blame,
    so the batcher splits it to find which (that request alone gets 422)."""

    status = 422


@dataclass(frozen=True, slots=True)
class BatchResult:
    outputs: list[Any]
    errors: list[str | None]


def parse_batch_response(body: Any, size: int) -> BatchResult:
    """Check a /v1/batch answer against the protocol; raise ModelFailed when it breaks it."""
    if not isinstance(body, dict) or not isinstance(body.get("outputs"), list):
        raise ModelFailed('model response has no "outputs" list')
    outputs: list[Any] = body["outputs"]
    if len(outputs) != size:
        raise ModelFailed(f"model returned {len(outputs)} outputs for {size} inputs")
    errors = body.get("errors")
    if errors is None:
        return BatchResult(outputs, [None] * size)
    if not isinstance(errors, list) or len(errors) != size:
        raise ModelFailed(f'model "errors" must be a list of {size} entries')
    return BatchResult(outputs, [None if e is None else str(e) for e in errors])


class ModelClient:
    """A pooled HTTP client for one model server."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        max_connections: int,
        ready_path: str = "/readyz",
        api_key: str | None = None,
        reuse_connections: bool = True,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._reuse_connections = reuse_connections
        """False: a new connection per call. llama-server closes its end after each streamed
        answer while announcing keep-alive, so a pooled connection taken at once is dead (502)."""
        self._ready_path = ready_path
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        """Sent with every call to the model: an engine started with an API key needs it."""
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.max_answer_bytes = MAX_ANSWER_BYTES
        """A larger answer fails its batch (502) unread: answers are read whole."""

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections + 2, force_close=not self._reuse_connections
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def base_url(self) -> str:
        return self._base

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("ModelClient used before start()")
        return self._session

    async def infer(self, inputs: list[Any]) -> BatchResult:
        """Run one batch. Raises ModelUnreachable or ModelFailed for whole-batch failures."""
        raw = await self.post("/v1/batch", encode({"inputs": inputs}))
        try:
            body = decode(raw)
        except ValueError as exc:
            raise ModelFailed(f"model response is not usable JSON: {exc}") from exc
        return parse_batch_response(body, len(inputs))

    async def post(self, path: str, data: bytes) -> bytes:
        """POST one batch's JSON to the model's ``path``; its 200 answer's body. A 4xx other
        than 408 and 429 raises ModelRejected (the batch's input is to blame), anything else
        that is not 200 ModelFailed, no connection ModelUnreachable."""
        try:
            async with self.session.post(
                self._base + path,
                data=data,
                headers={"Content-Type": "application/json"},
            ) as resp:
                raw = await read_whole(resp, self.max_answer_bytes)
                if 400 <= resp.status < 500 and resp.status not in (408, 429):
                    raise ModelRejected(f"model refused the input: HTTP {resp.status}")
                if resp.status != 200:
                    raise ModelFailed(f"model answered HTTP {resp.status} for the batch")
        except AnswerTooLarge as exc:
            raise ModelFailed(f"the model's answer is larger than {exc.limit} bytes") from exc
        except aiohttp.ClientConnectorError as exc:
            raise ModelUnreachable(f"model unreachable at {self._base}: {exc.os_error}") from exc
        except TimeoutError as exc:
            raise ModelFailed(f"model did not answer within {self._timeout.total:g}s") from exc
        except aiohttp.ClientError as exc:
            raise ModelFailed(f"model connection failed: {type(exc).__name__}") from exc
        return raw

    async def ready(self, timeout_s: float) -> bool:
        """Whether the model's readiness path (/readyz; an OpenAI engine's /health) answers
        200 right now."""
        try:
            async with self.session.get(
                self._base + self._ready_path, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

"""Shadow traffic: copies of a share of a model's requests, sent to a shadow version once the
client has its answer, and how far the two answers agree.

A version whose route names a ``shadow`` percentage gets a copy of that share of the model's
requests that other versions answered with a 200 (every n-th, by a credit that adds up the
percentage, so 10% is exactly one in ten). The copy is sent after the client's answer is
complete, on a connection pool of its own, and at most ``max_in_flight`` copies are open at
once: a copy beyond it is dropped and counted, never queued. So a shadow that is slow, fails or
sheds load changes nothing a client sees. Each copy answered with a 200 is compared with the
answer the client got (:func:`agreement`), in a thread of its own, one copy at a time, so that
the event loop goes on serving meanwhile; answers over ``max_compare_bytes`` are not compared
(parsing takes the interpreter's lock). A copy says it is one (``X-Modelroll-Shadow: 1``), and
has a request id and a trace span of its own (:func:`copy_headers`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from modelroll_common.tracing import REQUEST_ID, TRACEPARENT, TRACESTATE, new_span

from .metrics import GatewayMetrics
from .upstream import UpstreamError, UpstreamPool

log = logging.getLogger(__name__)

COMPARED, INCOMPARABLE, TOO_LARGE = "compared", "incomparable", "too_large"
FAILED, DROPPED = "failed", "dropped"
SHADOW_OUTCOMES = (COMPARED, INCOMPARABLE, TOO_LARGE, FAILED, DROPPED)
"""How a copy ended: compared with the client's answer; answered 200 but in a shape that cannot
be compared (not JSON with an ``output``, or, for an Open Inference Protocol request, not the
primary's output tensors); answered 200, but its answer or the client's is over
``max_compare_bytes``; failed (another status, no answer, too slow); dropped (``max_in_flight``
copies were open)."""

SHADOW_HEADER = "X-Modelroll-Shadow"
"""Sent with every shadow copy, as ``1``; the gateway passes no client's header of that name."""


def copy_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a shadow copy of a request forwarded with ``headers``: marked as a copy,
    with a request id of its own, and in the client's trace a span of its own (a traceparent
    that is not W3C's is left out, with its tracestate)."""
    copy = {k: v for k, v in headers.items() if k not in (REQUEST_ID, TRACEPARENT, TRACESTATE)}
    copy[SHADOW_HEADER] = "1"
    copy[REQUEST_ID] = str(uuid.uuid4())
    parent = headers.get(TRACEPARENT)
    span = new_span(parent) if parent is not None else None
    if span is not None:
        copy[TRACEPARENT] = span
        if (state := headers.get(TRACESTATE)) is not None:
            copy[TRACESTATE] = state
    return copy


@dataclass
class Mirror:
    """A shadow version of a model: where its copies go, and the share of requests they are."""

    name: str
    url: str
    """Where copies of requests on the batch path go."""
    percent: int
    oip_url: str
    """Where copies of Open Inference Protocol requests go."""
    _credit: int = field(default=0, repr=False)
    """Percent points owed; a copy pays 100 (integers: 10% is exactly 10 of 100)."""

    def take(self) -> bool:
        """Whether this request is one to copy: exactly ``percent`` of 100 in a row."""
        self._credit += self.percent
        if self._credit >= 100:
            self._credit -= 100
            return True
        return False


def _output(doc: Any) -> Any:
    """The ``output`` of a model protocol answer; raises ValueError for anything else."""
    if not isinstance(doc, dict) or "output" not in doc:
        raise ValueError("no output")
    return doc["output"]


@dataclass(frozen=True, slots=True)
class _Tensor:
    """An output tensor of an Open Inference Protocol answer, its data flattened."""

    datatype: str
    shape: tuple[int, ...]
    data: list[Any]

    def rows(self) -> list[list[Any]]:
        """The data split along the first (batch) dimension: one row for a scalar, none for a
        tensor without values."""
        if not self.data:
            return []
        if not self.shape:
            return [self.data]
        count = self.shape[0]
        size = len(self.data) // count if count else 0
        return [self.data[i * size : (i + 1) * size] for i in range(count)]


def _flat(data: Any) -> list[Any]:
    """A tensor's data in row-major order, nested or already flat."""
    if not isinstance(data, list):
        return [data]
    return [item for element in data for item in _flat(element)]


def _tensors(doc: Any) -> dict[str, _Tensor]:
    """The output tensors of an Open Inference Protocol answer, by name; raises ValueError for
    anything else (a tensor whose data does not fill its shape among them)."""
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(outputs, list) or not outputs:
        raise ValueError("no outputs")
    tensors: dict[str, _Tensor] = {}
    for output in outputs:
        if not isinstance(output, dict):
            raise ValueError("an output is not an object")
        name, datatype, shape = output.get("name"), output.get("datatype"), output.get("shape")
        if not isinstance(name, str) or name in tensors or not isinstance(datatype, str):
            raise ValueError("an output without a name of its own or a datatype")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(f"output {name!r} has no valid shape")
        data = _flat(output.get("data"))
        if len(data) != math.prod(shape):
            raise ValueError(f"output {name!r}: {len(data)} values for shape {shape}")
        tensors[name] = _Tensor(datatype, tuple(shape), data)
    return tensors


_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})


def _rows_agreement(a: _Tensor, b: _Tensor) -> float:
    """The mean over rows: for rows of several floats, their cosine similarity; else 1 for
    equal rows and 0 for different ones."""
    pairs = list(zip(a.rows(), b.rows(), strict=True))
    if not pairs:
        return 1.0
    scores = (
        _cosine(x, y)
        if a.datatype in _FLOATS and len(x) > 1 and _is_vector(x + y)
        else float(x == y)
        for x, y in pairs
    )
    return math.fsum(scores) / len(pairs)


def tensor_agreement(primary: Any, shadow: Any) -> float:
    """How far two Open Inference Protocol answers agree: the mean over their output tensors
    (:func:`_rows_agreement`). Raises ValueError unless both name the same tensors, of the
    same datatypes and shapes."""
    a, b = _tensors(primary), _tensors(shadow)
    if a.keys() != b.keys():
        raise ValueError(f"outputs {sorted(a)} and {sorted(b)}")
    for name, tensor in a.items():
        other = b[name]
        if (tensor.datatype, tensor.shape) != (other.datatype, other.shape):
            raise ValueError(f"output {name!r} differs in datatype or shape")
    return math.fsum(_rows_agreement(a[name], b[name]) for name in a) / len(a)


def _is_vector(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
    )


def _cosine(a: list[float], b: list[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    if norms == 0.0:
        return 1.0 if a == b else 0.0
    return max(-1.0, min(1.0, dot / norms))


def agreement(primary: bytes, shadow: bytes) -> float:
    """How far two answers to the same request agree, from -1 to 1. Answers of the Open
    Inference Protocol (with ``outputs``) by :func:`tensor_agreement`; of the model protocol
    (with an ``output``): for vectors of the same length (an embedding), their cosine
    similarity; for a list of such vectors (a batch of items), the mean of theirs; for anything
    else (a label, a score, text), 1 when equal and 0 when not. Raises ValueError when the
    shadow's answer is not in the shape of the primary's, or either in neither."""
    first, second = json.loads(primary), json.loads(shadow)
    if isinstance(first, dict) and "outputs" in first:
        return tensor_agreement(first, second)
    a, b = _output(first), _output(second)
    if _is_vector(a) and _is_vector(b) and len(a) == len(b):
        return _cosine(a, b)
    if (
        isinstance(a, list)
        and isinstance(b, list)
        and a
        and len(a) == len(b)
        and all(
            _is_vector(x) and _is_vector(y) and len(x) == len(y) for x, y in zip(a, b, strict=True)
        )
    ):
        return math.fsum(_cosine(x, y) for x, y in zip(a, b, strict=True)) / len(a)
    return 1.0 if a == b else 0.0


class ShadowSender:
    """Sends the copies and records how they went; its own pool, at most ``max_in_flight``."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        pool: UpstreamPool,
        timeout: float,
        max_in_flight: int,
        max_compare_bytes: int,
    ) -> None:
        self.metrics = metrics
        self.pool = pool
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.max_compare_bytes = max_compare_bytes
        self.compare: Callable[[bytes, bytes], float] = agreement
        """Scores two answers, in the comparing thread (:func:`agreement`)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._comparing = ThreadPoolExecutor(1, thread_name_prefix="shadow-compare")

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def send(
        self,
        model: str,
        mirror: Mirror,
        primary: str,
        body: bytes,
        headers: Mapping[str, str],
        answer: bytes,
        *,
        oip: bool = False,
    ) -> None:
        """Copy a request that ``primary`` answered with ``answer`` to ``mirror``, at the batch
        path or (``oip``) the Open Inference Protocol's, in the background (or drop it, counted,
        when ``max_in_flight`` copies are open); ``headers`` are those the request was
        forwarded with."""
        if len(self._tasks) >= self.max_in_flight:
            self.metrics.shadow_requests.labels(model, mirror.name, DROPPED).inc()
            return
        lines = UpstreamPool.encode_headers(copy_headers(headers))
        url = mirror.oip_url if oip else mirror.url
        copy = self._copy((model, mirror.name), url, primary, body, lines, answer)
        task = asyncio.get_running_loop().create_task(copy)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _copy(
        self,
        labels: tuple[str, str],
        url: str,
        primary: str,
        body: bytes,
        headers: bytes,
        answer: bytes,
    ) -> None:
        """Send one copy; ``labels``: its model and shadow version."""
        metrics, loop = self.metrics, self.pool.loop
        started = loop.time()
        try:
            reply = await self.pool.endpoint(url).post(body, headers, started + self.timeout)
        except UpstreamError as exc:
            log.debug("A shadow copy of model %s to %s failed: %s", *labels, exc)
            metrics.shadow_requests.labels(*labels, FAILED).inc()
            return
        metrics.shadow_duration.labels(*labels).observe(loop.time() - started)
        if reply.status != 200:
            metrics.shadow_requests.labels(*labels, FAILED).inc()
            return
        if max(len(answer), len(reply.body)) > self.max_compare_bytes:
            metrics.shadow_requests.labels(*labels, TOO_LARGE).inc()
            return
        try:
            score = await loop.run_in_executor(self._comparing, self.compare, answer, reply.body)
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deeply
            metrics.shadow_requests.labels(*labels, INCOMPARABLE).inc()
            return
        metrics.shadow_requests.labels(*labels, COMPARED).inc()
        metrics.shadow_agreement.labels(*labels, primary).observe(score)

    async def close(self) -> None:
        """Cancel the copies still open (the gateway is stopping) and close the pool."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._comparing.shutdown(wait=False, cancel_futures=True)
        await self.pool.close()

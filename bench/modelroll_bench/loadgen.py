"""Load generators: open loop (Poisson arrivals at a fixed rate) and closed loop (bounded
concurrency), and the summary every benchmark reports: p50/p95/p99, throughput, errors by status.

Open-loop latency is measured from each request's *scheduled* arrival time, so a generator that
falls behind still charges the wait to the system under test (no coordinated omission). Given
each request's length, the open loop records it with the request's latency, so latency can be
told by length (:func:`modelroll_bench.arithmetic.by_length_decile`). An open loop may stop
waiting a bounded time after its last arrival (``drain_s``): against a server past its
saturation the queue only grows, and the requests still unanswered then count as unanswered.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .figures import LoadSummary
from .results import to_json
from .stats import percentile

Body = Callable[[int], bytes]
Length = Callable[[int], int]
"""The length of the ``i``-th request's body."""
HEADERS = {"Content-Type": "application/json"}


def json_bodies(payloads: list[Any]) -> Body:
    """Request bodies ``{"payload": p}``, encoded once up front and cycled through."""
    encoded = [json.dumps({"payload": p}).encode() for p in payloads]
    return lambda i: encoded[i % len(encoded)]


@dataclass
class LoadResult:
    """What one load run saw. Latencies are of successful (2xx) requests only; when lengths are
    recorded, ``lengths[i]`` is the length of the request that took ``latencies_s[i]``, and
    ``sent_lengths`` holds the length of every request sent, answered or not. ``unanswered``:
    requests given up on when an open loop stopped waiting; they count as slower than any
    answered one. ``timeline``: an open loop's requests as (index, scheduled arrival in seconds
    from the start, latency or None when it failed or went unanswered)."""

    label: str
    duration_s: float
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    offered_rps: float | None = None
    lengths: list[int] = field(default_factory=list)
    sent_lengths: list[int] = field(default_factory=list)
    unanswered: int = 0
    timeline: list[tuple[int, float, float | None]] = field(default_factory=list)

    @property
    def ok(self) -> int:
        return sum(n for code, n in self.statuses.items() if 200 <= code < 300)

    @property
    def throughput_rps(self) -> float:
        return self.ok / self.duration_s if self.duration_s else 0.0

    def record(self, status: int, latency_s: float, length: int | None = None) -> None:
        self.statuses[status] += 1
        if length is not None:
            self.sent_lengths.append(length)
        if 200 <= status < 300:
            self.latencies_s.append(latency_s)
            if length is not None:
                self.lengths.append(length)

    def within_rps(self, slo_s: float) -> float:
        """Successful requests answered within ``slo_s``, per second of the run."""
        within = sum(1 for latency in self.latencies_s if latency <= slo_s)
        return within / self.duration_s if self.duration_s else 0.0

    def report(self) -> LoadSummary:
        """Counts and p50/p95/p99 in ms of the successful requests; a percentile that falls
        among the unanswered requests is None (slower than anything measured), and so is one of
        no requests."""
        ordered = sorted(self.latencies_s) + [math.inf] * self.unanswered
        errors = {str(c): n for c, n in sorted(self.statuses.items()) if not 200 <= c < 300}
        if self.unanswered:
            errors["unanswered"] = self.unanswered
        p50, p95, p99 = (_ms(percentile(ordered, q)) for q in (0.50, 0.95, 0.99))
        return LoadSummary(
            label=self.label,
            offered_rps=self.offered_rps,
            throughput_rps=round(self.throughput_rps, 1),
            requests=sum(self.statuses.values()) + self.unanswered,
            ok=self.ok,
            errors=errors,
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
        )

    def summary(self) -> dict[str, Any]:
        """:meth:`report` as JSON data, for the suites that keep their rows as dicts."""
        result: dict[str, Any] = to_json(self.report())
        return result


def _ms(seconds: float | None) -> float | None:
    """Seconds in ms to 2 decimals; None for none or for a request never answered."""
    return None if seconds is None or math.isinf(seconds) else round(seconds * 1000, 2)


def session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        timeout=aiohttp.ClientTimeout(total=120),
    )


async def _send(
    http: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str] = HEADERS
) -> int:
    """POST one request; its HTTP status, or 599 when no HTTP answer came at all."""
    try:
        async with http.post(url, data=body, headers=headers) as resp:
            await resp.read()
            return resp.status
    except (aiohttp.ClientError, TimeoutError):
        return 599


def poisson_times(rng: random.Random, rate: float, duration_s: float) -> Iterator[float]:
    """The times, in seconds from the start, of Poisson arrivals at ``rate`` per second for
    ``duration_s``: the same ``rng`` seed, the same times (the batching simulator replays the
    arrivals :func:`open_loop` sends)."""
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= duration_s:
            return
        yield at


async def poisson_arrivals(
    rng: random.Random, rate: float, start: float, duration_s: float
) -> AsyncIterator[tuple[int, float]]:
    """Poisson arrivals at ``rate`` per second from ``start`` (``time.perf_counter()``) for
    ``duration_s``: yields ``(i, due)`` at each one's scheduled time ``due``, from which its
    latency counts (a generator that falls behind still charges the wait to the server)."""
    for i, at in enumerate(poisson_times(rng, rate, duration_s)):
        due = start + at
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i, due


async def open_loop(
    url: str,
    body: Body,
    rate: float,
    duration_s: float,
    *,
    seed: int = 1,
    label: str = "",
    progress: Callable[[float], None] | None = None,
    length: Length | None = None,
    headers: Callable[[int], Mapping[str, str]] | None = None,
    drain_s: float | None = None,
) -> LoadResult:
    """Poisson arrivals at ``rate`` per second for ``duration_s``, then wait for every answer,
    or with ``drain_s`` for at most that long: the requests still unanswered then are given up
    (their connections closed) and counted in ``unanswered``. ``length``: the ``i``-th body's
    length, recorded with its latency; ``headers``: the ``i``-th request's headers (default:
    JSON's content type)."""
    rng = random.Random(seed)
    result = LoadResult(label, duration_s, offered_rps=rate)
    tasks: dict[asyncio.Task[None], tuple[int, float]] = {}
    async with session() as http:
        start = time.perf_counter()

        async def record(i: int, since: float) -> None:
            sent = HEADERS if headers is None else headers(i)
            status = await _send(http, url, body(i), sent)
            latency = time.perf_counter() - since
            result.record(status, latency, None if length is None else length(i))
            ok = 200 <= status < 300
            result.timeline.append((i, since - start, latency if ok else None))

        async for i, due in poisson_arrivals(rng, rate, start, duration_s):
            task = asyncio.create_task(record(i, due))
            tasks[task] = (i, due - start)
            task.add_done_callback(lambda t: tasks.pop(t, None))
            if progress is not None and (i + 1) % 64 == 0:
                progress((due - start) / duration_s)
        if tasks:
            await asyncio.wait(list(tasks), timeout=drain_s)
        given_up = list(tasks.items())
        for task, (i, at) in given_up:
            task.cancel()
            result.unanswered += 1
            result.timeline.append((i, at, None))
            if length is not None:
                result.sent_lengths.append(length(i))
        await asyncio.gather(*(task for task, _ in given_up), return_exceptions=True)
    return result


async def closed_loop(
    url: str,
    body: Body,
    concurrency: int,
    duration_s: float,
    *,
    label: str = "",
    warmup_s: float = 1.0,
    progress: Callable[[float], None] | None = None,
) -> LoadResult:
    """``concurrency`` clients, each sending its next request when the last one is answered.
    Only answers that arrive within the ``duration_s`` after ``warmup_s`` are counted."""
    result = LoadResult(label, duration_s)
    async with session(limit=concurrency) as http:
        counted_from = time.perf_counter() + warmup_s
        stop = counted_from + duration_s

        async def client(k: int) -> None:
            i = k
            while (started := time.perf_counter()) < stop:
                status = await _send(http, url, body(i))
                finished = time.perf_counter()
                if counted_from <= finished <= stop:  # answers within the measured window
                    result.record(status, finished - started)
                    if progress is not None and k == 0:
                        progress((finished - counted_from) / duration_s)
                i += concurrency

        await asyncio.gather(*(client(k) for k in range(concurrency)))
    return result

"""Streaming load for OpenAI-compatible chat servers: open loop (Poisson arrivals), closed loop
(a fixed number of streams back to back), and what each stream's timing says.

Per request: the time to the first token (TTFT: to the first SSE chunk that carries generated
text, as the sidecar's own metric counts it, :class:`modelroll_common.sse.GenerationWatch`), the
end-to-end time (to ``data: [DONE]``) and the output tokens (the stream's ``usage``, which the
requests ask for with ``stream_options.include_usage``). As in :mod:`.loadgen`, open-loop times
run from each request's *scheduled* arrival, so a generator that falls behind still charges the
wait to the server (no coordinated omission).

A run cannot wait for ever for a server that has fallen behind (a static batcher above its
capacity): after the arrivals, streams get ``drain_s`` to finish, then are cut. A cut stream's
TTFT or end-to-end time is not known, only that it is at least the time it had waited; the
percentiles keep such lower bounds in (dropping them would flatter the slowest server) and say
when a figure is only a lower bound (:func:`percentile_bound`).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from modelroll_common.sse import EventScanner, EventTooLong, GenerationWatch

from .loadgen import HEADERS, Body, poisson_arrivals
from .stats import rank_index

T = TypeVar("T")
Route = Callable[[int], tuple[str, str]]
"""The ``i``-th request's path label and URL."""
READ_TIMEOUT_S = 120.0
"""The longest silence allowed within one stream (a queued request's headers come at once)."""
OK, CUT, FAILED = "ok", "cut", "failed"


def chat_bodies(
    prompts: Sequence[str], model: str, max_tokens: int, options: Mapping[str, Any] | None = None
) -> Body:
    """Streaming chat completion requests, one per prompt, encoded once and cycled through;
    ``options`` are more fields of every body (``temperature``, say)."""
    encoded = [
        json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                **(options or {}),
            }
        ).encode()
        for prompt in prompts
    ]
    return lambda i: encoded[i % len(encoded)]


def prompts(count: int, words: int) -> list[str]:
    """``count`` distinct prompts of ``words`` words each. The demo engine derives a generation's
    length from its prompt (and its seed), so distinct prompts draw distinct output lengths."""
    return [" ".join([f"request-{i}", *(["lorem"] * (words - 1))]) for i in range(count)]


def fixed(label: str, url: str) -> Route:
    return lambda i: (label, url)


def interleave(paths: Sequence[tuple[str, str]], seed: int) -> Route:
    """Each block of ``len(paths)`` consecutive requests goes to every path once, in a seeded
    random order: the paths share the arrivals, and so the server's state, evenly, with no path
    always right behind another."""
    order: list[list[int]] = []
    rng = random.Random(seed)

    def route(i: int) -> tuple[str, str]:
        block = i // len(paths)
        while len(order) <= block:
            perm = list(range(len(paths)))
            rng.shuffle(perm)
            order.append(perm)
        return paths[order[block][i % len(paths)]]

    return route


@dataclass(frozen=True)
class Sample:
    """One request. Times are seconds from ``started_at`` (its scheduled arrival in an open loop,
    its send in a closed one); ``waited_s`` is how long it was watched (to its end, or to the
    cut). ``outcome``: ok (``[DONE]``, no error), cut (the run ended first), failed."""

    path: str
    started_at: float
    outcome: str
    ttft_s: float | None
    e2e_s: float | None
    waited_s: float
    output_tokens: int
    error: str | None = None
    tokens_in_window: int = 0

    @property
    def ended_at(self) -> float:
        return self.started_at + self.waited_s


class StreamTimer:
    """Follows one answer's bytes as they arrive (any split into chunks) and times its events;
    counts apart the tokens that arrived within ``window`` (from, to)."""

    def __init__(
        self, started_at: float, path: str = "", window: tuple[float, float] | None = None
    ) -> None:
        self.started_at = started_at
        self.path = path
        self.window = window
        self.status = 0
        self.ended_at: float | None = None
        self.failure: str | None = None
        self.in_window = 0
        self.watch = GenerationWatch()
        self._scanner = EventScanner()

    def feed(self, chunk: bytes, now: float) -> None:
        before = self.watch.tokens
        for data in self._scanner.feed(chunk):
            self.watch.saw(data, now)
        if self.window is not None and self.window[0] <= now <= self.window[1]:
            self.in_window += self.watch.tokens - before
        if self.watch.done and self.ended_at is None:
            self.ended_at = now

    def fail(self, reason: str, now: float) -> None:
        if self.ended_at is None:
            self.failure, self.ended_at = reason, now

    def end(self, now: float) -> None:
        """The answer's body ended: complete only if ``[DONE]`` came, without an error event."""
        if self.watch.error is not None:
            self.fail(f"error event: {self.watch.error}", now)
        elif not self.watch.done:
            self.fail("the stream ended without data: [DONE]", now)

    def sample(self, cut_at: float) -> Sample:
        """The request as it stood at ``cut_at`` (the stream is cut then if it had not ended)."""
        watch, start = self.watch, self.started_at
        ttft = None if watch.first_token_at is None else watch.first_token_at - start
        tokens, window = watch.output_tokens, self.in_window
        if self.ended_at is None:
            return Sample(self.path, start, CUT, ttft, None, cut_at - start, tokens, None, window)
        waited = self.ended_at - start
        if self.failure is not None:
            failure = self.failure
            return Sample(self.path, start, FAILED, ttft, None, waited, tokens, failure, window)
        return Sample(self.path, start, OK, ttft, waited, waited, tokens, None, window)


def session(fresh_connections: bool = False) -> aiohttp.ClientSession:
    """The load's client; ``fresh_connections``: one connection per request, for a client that
    sends its next request the moment an answer ends, which llama-server may have closed."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=fresh_connections),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=READ_TIMEOUT_S),
    )


async def stream(http: aiohttp.ClientSession, url: str, body: bytes, timer: StreamTimer) -> None:
    """POST one streaming request and feed its answer to ``timer`` as it arrives."""
    try:
        async with http.post(url, data=body, headers=HEADERS) as resp:
            timer.status = resp.status
            if resp.status != 200 or resp.content_type != "text/event-stream":
                await resp.read()
                timer.fail(f"HTTP {resp.status}", time.perf_counter())
                return
            async for chunk in resp.content.iter_any():
                timer.feed(chunk, time.perf_counter())
            timer.end(time.perf_counter())
    except (aiohttp.ClientError, TimeoutError, EventTooLong) as exc:
        timer.fail(type(exc).__name__, time.perf_counter())


async def _cut(tasks: set[asyncio.Task[None]]) -> float:
    """Cancel the streams still going (their connections close); the moment they were cut."""
    cut_at = time.perf_counter()
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return cut_at


@dataclass
class StreamRun:
    """What one run saw: every request sent, answered or not; the run's extent (from its start
    to its last answer, or to the cut); and how long the window was whose tokens
    :attr:`Sample.tokens_in_window` counts."""

    label: str
    samples: list[Sample]
    elapsed_s: float
    offered_rps: float | None = None
    window_s: float = 0.0

    def summary(self) -> StreamSummary:
        return summarize(self.samples, self.elapsed_s, self.window_s, self.label, self.offered_rps)


async def open_streams(
    route: Route,
    body: Body,
    rate: float,
    duration_s: float,
    *,
    seed: int = 1,
    drain_s: float = 30.0,
    label: str = "",
    ramp: float = 0.25,
) -> StreamRun:
    """Poisson arrivals at ``rate`` per second for ``duration_s``; then ``drain_s`` for the
    streams still going, and the rest are cut. Tokens are counted apart (the run's
    ``output_tps``) over the arrivals after their first ``ramp`` share: from an idle server,
    streams take a while to pile up to the steady state."""
    rng = random.Random(seed)
    timers: list[StreamTimer] = []
    tasks: set[asyncio.Task[None]] = set()
    async with session() as http:
        start = time.perf_counter()
        window = (start + ramp * duration_s, start + duration_s)
        async for i, due in poisson_arrivals(rng, rate, start, duration_s):
            path, url = route(i)
            timer = StreamTimer(due, path, window)
            timers.append(timer)
            task = asyncio.create_task(stream(http, url, body(i), timer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(list(tasks), timeout=drain_s)
        cut_at = await _cut(tasks)
    samples = [t.sample(cut_at) for t in timers]
    extent = run_extent(samples, start)
    return StreamRun(label, samples, extent, rate, window[1] - window[0])


async def closed_streams(
    url: str,
    body: Body,
    concurrency: int,
    during: Awaitable[T],
    window: tuple[float, float] | None = None,
) -> tuple[T, list[Sample]]:
    """``concurrency`` clients, each sending its next stream when its last one has ended, for as
    long as ``during`` runs (the measurement); then the streams in flight are cut. Client ``k``
    sends bodies ``k``, ``k + concurrency``, ... ; tokens within ``window`` (perf_counter
    times) are counted apart, as in :func:`open_streams`. Each request has its own connection."""
    timers: list[StreamTimer] = []

    async def client(http: aiohttp.ClientSession, k: int) -> None:
        i = k
        while True:
            timer = StreamTimer(time.perf_counter(), window=window)
            timers.append(timer)
            await stream(http, url, body(i), timer)
            i += concurrency

    async with session(fresh_connections=True) as http:
        clients = {asyncio.create_task(client(http, k)) for k in range(concurrency)}
        try:
            result = await during
        finally:
            cut_at = await _cut(clients)
    return result, [t.sample(cut_at) for t in timers]


def run_extent(samples: Sequence[Sample], start: float) -> float:
    """From ``start`` to the last request's end (its answer, or the cut)."""
    return max((s.ended_at for s in samples), default=start) - start


# -- figures ----------------------------------------------------------------------------------


def percentile_bound(values: Sequence[tuple[float, bool]], q: float) -> tuple[float, bool] | None:
    """Nearest-rank percentile ``q`` of ``(value, exact)`` pairs, where an inexact value is only a
    lower bound of the true one (a request cut before it got there). Returns the percentile and
    whether it is exact: it is when no lower bound sorts at or below it (the true values of those
    above can only be larger, which leaves the rank alone); otherwise it is itself only a lower
    bound. None for no values."""
    if not values:
        return None
    ordered = sorted(values)  # at a tie, a lower bound (False) sorts first: the cautious side
    at = rank_index(len(ordered), q)
    return ordered[at][0], all(exact for _, exact in ordered[: at + 1])


QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}


def ttft_values(samples: Sequence[Sample]) -> list[tuple[float, bool]]:
    """TTFTs of the requests that were not failed: exact when the first token came, else (cut
    before it) at least the time waited."""
    values: list[tuple[float, bool]] = []
    for s in samples:
        if s.outcome == FAILED:
            continue
        if s.ttft_s is not None:
            values.append((s.ttft_s, True))
        elif s.outcome == CUT:
            values.append((s.waited_s, False))
    return values


def e2e_values(samples: Sequence[Sample]) -> list[tuple[float, bool]]:
    """End-to-end times of the requests that were not failed; a cut one's is a lower bound."""
    return [
        (s.e2e_s, True) if s.e2e_s is not None else (s.waited_s, False)
        for s in samples
        if s.outcome != FAILED
    ]


def tpot_s(sample: Sample) -> float | None:
    """Time per output token after the first, of a completed stream of two tokens or more."""
    if sample.e2e_s is None or sample.ttft_s is None or sample.output_tokens < 2:
        return None
    return (sample.e2e_s - sample.ttft_s) / (sample.output_tokens - 1)


@dataclass(frozen=True)
class StreamSummary:
    """What a run's streams saw: counts; output tokens per second, of the tokens received within
    the window (None without one); TTFT and end-to-end p50/p95/p99 in ms and the median time per
    output token; and ``at_least``: the figures (by field name) that are only lower bounds
    because of cut streams."""

    requests: int
    ok: int
    cut: int
    failed: int
    errors: dict[str, int]
    output_tokens: int
    output_tps: float | None
    elapsed_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p95_ms: float | None
    e2e_p99_ms: float | None
    tpot_p50_ms: float | None
    at_least: list[str]
    label: str = ""
    offered_rps: float | None = None

    def value(self, key: str) -> float | None:
        """The figure named ``key`` (a field of this class, such as ``ttft_p99_ms``)."""
        found = getattr(self, key)
        return None if found is None else float(found)

    def exact(self, key: str) -> bool:
        """Whether the figure named ``key`` is exact rather than a lower bound."""
        return key not in self.at_least


def summarize(
    samples: Sequence[Sample],
    elapsed_s: float,
    window_s: float = 0.0,
    label: str = "",
    offered_rps: float | None = None,
) -> StreamSummary:
    """The figures of ``samples``, a run of ``elapsed_s`` whose tokens counted within a window of
    ``window_s``."""
    outcomes = Counter(s.outcome for s in samples)
    in_window = sum(s.tokens_in_window for s in samples)
    at_least: list[str] = []
    figures: dict[str, float | None] = {}
    for name, values in (("ttft", ttft_values(samples)), ("e2e", e2e_values(samples))):
        for tag, q in QUANTILES.items():
            key = f"{name}_{tag}_ms"
            found = percentile_bound(values, q)
            figures[key] = None if found is None else round(found[0] * 1000, 2)
            if found is not None and not found[1]:
                at_least.append(key)
    tpots = [t for s in samples if (t := tpot_s(s)) is not None]
    return StreamSummary(
        requests=len(samples),
        ok=outcomes[OK],
        cut=outcomes[CUT],
        failed=outcomes[FAILED],
        errors=dict(Counter(s.error for s in samples if s.error is not None).most_common(5)),
        output_tokens=sum(s.output_tokens for s in samples),
        output_tps=round(in_window / window_s, 1) if window_s > 0 else None,
        elapsed_s=round(elapsed_s, 2),
        ttft_p50_ms=figures["ttft_p50_ms"],
        ttft_p95_ms=figures["ttft_p95_ms"],
        ttft_p99_ms=figures["ttft_p99_ms"],
        e2e_p50_ms=figures["e2e_p50_ms"],
        e2e_p95_ms=figures["e2e_p95_ms"],
        e2e_p99_ms=figures["e2e_p99_ms"],
        tpot_p50_ms=round(statistics.median(tpots) * 1000, 2) if tpots else None,
        at_least=at_least,
        label=label,
        offered_rps=offered_rps,
    )


def by_path(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    paths: dict[str, list[Sample]] = {}
    for s in samples:
        paths.setdefault(s.path, []).append(s)
    return paths

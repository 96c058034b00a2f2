"""Continuous load through the gateway, every response recorded with the version that answered.

The load comes in rounds: ``window`` requests sent together, the next round once all of them
have answered (and no sooner than ``1 / rounds_per_second`` after the previous one started).
While this is the gateway's only client, the requests of one round are ``window`` consecutive
picks of its smooth weighted round-robin, so with weights 9 and 1 every round of 10 holds
exactly 9 and 1: the split can be checked exactly under concurrent load.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar

import aiohttp

from modelroll_common.routes import VERSION_HEADER


@dataclass(frozen=True, slots=True)
class Response:
    """One request through the gateway. Times are ``time.monotonic()`` seconds."""

    round: int
    sent: float
    done: float
    status: int
    """HTTP status; 0 when no HTTP answer came (connection refused or reset, timeout)."""
    version: str
    """The ``X-Modelroll-Version`` the gateway answered with ('' when none)."""
    error: str = ""

    @property
    def latency(self) -> float:
        return self.done - self.sent


def payloads(n: int = 24) -> list[str]:
    """Texts of 1..n words: requests of different lengths, so padding costs something."""
    return [" ".join(["token"] * (1 + i)) for i in range(n)]


class Timed(Protocol):
    @property
    def sent(self) -> float: ...


R = TypeVar("R", bound=Timed)


class BackgroundLoad(Generic[R]):
    """Load from a background thread running its own event loop (:meth:`_run`), each answer
    recorded in ``records`` as it comes. ``with load:`` runs it."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.records: list[R] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def since(self, started: float, until: float | None = None) -> list[R]:
        """Answers to requests sent at or after ``started`` (and before ``until``)."""
        snapshot = self.records[:]
        return [r for r in snapshot if r.sent >= started and (until is None or r.sent < until)]

    def wait_for(self, count: int, after: float, timeout: float = 30.0) -> list[R]:
        """Wait until ``count`` answers to requests sent after ``after`` have come."""
        deadline = time.monotonic() + timeout
        while len(got := self.since(after)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(got)} of {count} answers within {timeout:g}s")
            time.sleep(0.05)
        return got


class Traffic(BackgroundLoad[Response]):
    """Load on ``POST {gateway}/v1/models/{model}/infer`` from a background thread.

    ``with Traffic(url, model) as traffic:`` runs it; ``traffic.responses`` grows as answers come
    (read it with :meth:`since`). Request ``i`` sends ``texts[i % len(texts)]`` (by default
    :func:`payloads`).
    """

    def __init__(
        self,
        gateway: str,
        model: str,
        *,
        window: int = 10,
        rounds_per_second: float = 20.0,
        timeout: float = 10.0,
        texts: Sequence[str] | None = None,
    ) -> None:
        super().__init__(timeout)
        self.url = f"{gateway}/v1/models/{model}/infer"
        self.window = window
        self.period = 1.0 / rounds_per_second
        self._bodies = [{"payload": p} for p in (payloads() if texts is None else texts)]
        if not self._bodies:
            raise ValueError("Traffic needs at least one text to send")

    @property
    def responses(self) -> list[Response]:
        return self.records

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=self.window)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            n = 0
            while not self._stop.is_set():
                started = time.monotonic()
                calls = (self._call(session, n, n * self.window + i) for i in range(self.window))
                self.responses.extend(await asyncio.gather(*calls))
                n += 1
                rest = self.period - (time.monotonic() - started)
                if rest > 0:
                    await asyncio.sleep(rest)

    async def _call(self, session: aiohttp.ClientSession, number: int, i: int) -> Response:
        body = self._bodies[i % len(self._bodies)]
        sent = time.monotonic()
        try:
            async with session.post(self.url, json=body) as resp:
                data: Any = await resp.json(content_type=None)
                error = str(data.get("error", "")) if isinstance(data, dict) else ""
                version = resp.headers.get(VERSION_HEADER, "")
                return Response(number, sent, time.monotonic(), resp.status, version, error)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return Response(number, sent, time.monotonic(), 0, "", f"{type(exc).__name__}: {exc}")


# -- figures -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass(frozen=True)
class VersionFigures:
    """What the client saw of one version over some responses."""

    requests: int
    errors: int
    p99: float

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def by_version(responses: Iterable[Response]) -> dict[str, VersionFigures]:
    """Requests, non-200 answers and p99 latency per answering version."""
    latencies: dict[str, list[float]] = {}
    errors: Counter[str] = Counter()
    for r in responses:
        latencies.setdefault(r.version, []).append(r.latency)
        if r.status != 200:
            errors[r.version] += 1
    return {
        v: VersionFigures(len(lat), errors[v], percentile(lat, 0.99))
        for v, lat in sorted(latencies.items())
    }


def rounds(responses: Iterable[Response]) -> list[Counter[str]]:
    """Per complete round, in order: how many of its requests each version answered."""
    grouped: dict[int, Counter[str]] = {}
    for r in responses:
        grouped.setdefault(r.round, Counter())[r.version] += 1
    return [grouped[k] for k in sorted(grouped)]


def whole_rounds(responses: Sequence[Response], window: int) -> list[Response]:
    """Only the responses of rounds that are complete in ``responses``."""
    sizes = Counter(r.round for r in responses)
    return [r for r in responses if sizes[r.round] == window]

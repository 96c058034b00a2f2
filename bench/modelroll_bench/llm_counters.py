"""The demo engine's counters (``modelroll-demo-llm``'s ``GET /v1/stats``), read around a run:
what the engine did meanwhile, and how much of the capacity it charged went on sequences that had
already ended.

``slot_steps`` counts the sequence slots the engine charged, iteration by iteration; ``tokens``
the slots that produced a token. Continuous batching retires a sequence the iteration it ends, so
the two are equal; a static batch keeps charging its finished sequences until its longest one
ends, and ``1 - tokens / slot_steps`` is the share of its work that early finishers wasted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

COUNTERS = ("iterations", "slot_steps", "tokens", "sequences", "cancelled", "failed", "busy_s")
POLL_S = 0.02
"""How often the counters are read while looking for a static batch's start."""


@dataclass(frozen=True)
class Snapshot:
    """The engine's counters (``GET /v1/stats``) read at ``at`` (``time.perf_counter``)."""

    at: float
    counters: dict[str, float]
    running: int = 0
    waiting: int = 0


@dataclass(frozen=True)
class EngineWork:
    """What the engine did between two snapshots."""

    seconds: float
    iterations: float = 0.0
    slot_steps: float = 0.0
    tokens: float = 0.0
    sequences: float = 0.0
    cancelled: float = 0.0
    busy_s: float = 0.0

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot) -> EngineWork:
        d = {k: after.counters.get(k, 0.0) - before.counters.get(k, 0.0) for k in COUNTERS}
        return cls(
            after.at - before.at,
            d["iterations"],
            d["slot_steps"],
            d["tokens"],
            d["sequences"],
            d["cancelled"],
            d["busy_s"],
        )

    @property
    def wasted_fraction(self) -> float | None:
        """Of the sequence slots charged, the share that produced no token."""
        return 1 - self.tokens / self.slot_steps if self.slot_steps > 0 else None

    def per_s(self, count: float) -> float | None:
        return count / self.seconds if self.seconds > 0 else None

    def summary(self) -> EngineSummary:
        def r(x: float | None, digits: int = 1) -> float | None:
            return None if x is None else round(x, digits)

        return EngineSummary(
            seconds=round(self.seconds, 2),
            output_tps=r(self.per_s(self.tokens)),
            requests_per_s=r(self.per_s(self.sequences), 2),
            wasted_fraction=r(self.wasted_fraction, 4),
            busy_fraction=r(self.per_s(self.busy_s), 3),
            mean_batch=r(self.slot_steps / self.iterations if self.iterations else None),
            slot_steps_per_s=r(self.per_s(self.slot_steps)),
            tokens=self.tokens,
            slot_steps=self.slot_steps,
            finished=self.sequences,
            cancelled=self.cancelled,
        )


@dataclass(frozen=True)
class EngineSummary:
    """The demo engine's own counters between two reads, per second where it says so."""

    seconds: float
    output_tps: float | None
    requests_per_s: float | None
    wasted_fraction: float | None
    """Of the sequence slots charged, the share that produced no token."""
    busy_fraction: float | None
    mean_batch: float | None
    slot_steps_per_s: float | None
    tokens: float
    slot_steps: float
    finished: float
    cancelled: float


async def read_stats(http: aiohttp.ClientSession, engine: str) -> Snapshot:
    async with http.get(engine + "/v1/stats") as resp:
        resp.raise_for_status()
        body = await resp.json()
    counters = {k: float(body.get(k, 0)) for k in COUNTERS}
    return Snapshot(time.perf_counter(), counters, int(body["running"]), int(body["waiting"]))


def batch_started(before: int, now: int, max_seqs: int) -> bool:
    """Whether a static batch started between two readings of the running sequences: the count
    only falls within a batch, and jumps when the next one is admitted."""
    return now - before >= max(1, max_seqs // 2)


async def edge(
    http: aiohttp.ClientSession, engine: str, scheduler: str, max_seqs: int, timeout_s: float
) -> Snapshot:
    """A window's edge: now for continuous batching; for static, the start of the next batch
    (or now, if none starts within ``timeout_s``)."""
    last = await read_stats(http, engine)
    if scheduler != "static":
        return last
    deadline = last.at + timeout_s
    while last.at < deadline:
        await asyncio.sleep(POLL_S)
        now = await read_stats(http, engine)
        if batch_started(last.running, now.running, max_seqs):
            return now
        last = now
    return last


async def until_idle(http: aiohttp.ClientSession, engine: str, timeout_s: float = 60.0) -> None:
    """Wait until nothing runs or waits in the engine (cut streams are retired at its next
    iterations), twice in a row."""
    deadline = time.perf_counter() + timeout_s
    quiet = 0
    while quiet < 2 and time.perf_counter() < deadline:
        snap = await read_stats(http, engine)
        quiet = quiet + 1 if snap.running == 0 and snap.waiting == 0 else 0
        await asyncio.sleep(0.05)

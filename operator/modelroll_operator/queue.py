"""A de-duplicated work queue drained by a few workers, with retries and a periodic resync.

A key asked for many times before its turn is processed once; a key whose processing raises is
queued again after an exponential backoff; every ``resync_s`` each known key is queued again.
What processing a key means is the caller's: the queue only schedules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger("modelroll_operator")

K = TypeVar("K")


@dataclass(frozen=True)
class Backoff:
    """Delay before the n-th retry in a row: ``initial_s * 2**n``, at most ``max_s``."""

    initial_s: float
    max_s: float

    def delay(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * 2.0**failures)


class WorkQueue(Generic[K]):
    """Processes keys with ``process``; ``failed(key, exc, delay)`` reports a retry to come, and
    ``resync()`` says which keys to process again every ``resync_s``."""

    def __init__(
        self,
        process: Callable[[K], Awaitable[None]],
        failed: Callable[[K, Exception, float], None],
        *,
        workers: int,
        backoff: Backoff,
        resync_s: float,
        resync: Callable[[], Iterable[K]],
        name: str,
    ) -> None:
        self._process = process
        self._failed = failed
        self._workers_wanted = workers
        self._backoff = backoff
        self._resync_s = resync_s
        self._resync_keys = resync
        self._name = name
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._failures: dict[K, int] = {}
        self._retries: dict[K, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._active = 0

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"{self._name}-{i}")
            for i in range(self._workers_wanted)
        ]
        self._tasks.append(asyncio.create_task(self._resync(), name=f"{self._name}-resync"))

    async def stop(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        for task in self._tasks:
            task.cancel()
        # Whatever a worker died of, shutting down must not fail (kopf would retry the cleanup).
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def add(self, key: K) -> None:
        """Process ``key`` soon (once, however often it is added before its turn)."""
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    @property
    def pending(self) -> int:
        """Keys queued, waiting for a retry, or being processed right now."""
        return len(self._queued) + len(self._retries) + self._active

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self._resync_s)
            for key in list(self._resync_keys()):
                self.add(key)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active += 1
            try:
                await self._process(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                try:
                    self._retry(key, exc)
                except Exception:  # never let a worker die: the queue would stall
                    log.exception("Scheduling a retry of %r failed", key)
            else:
                self._failures.pop(key, None)
            finally:
                self._active -= 1

    def _retry(self, key: K, exc: Exception) -> None:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = self._backoff.delay(failures)
        self._failed(key, exc, delay)
        if old := self._retries.pop(key, None):
            old.cancel()
        self._retries[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)

    def _fire(self, key: K) -> None:
        self._retries.pop(key, None)
        self.add(key)

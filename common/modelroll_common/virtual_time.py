"""An event loop whose clock the tests control: whenever nothing is ready to run, loop time jumps
straight to the next timer instead of waiting for it. Code under test that sleeps, waits with a
timeout or schedules with ``call_at`` runs exactly as it would, in loop time, and a test asserts
exact times (``loop.time()``) in milliseconds of real time. Sockets still work (a loop with
nothing scheduled waits for them in real time).

Every test in tests/unit/clocked/ runs in one (its conftest.py gives it to pytest-asyncio), and
so does the batching simulator (``modelroll-bench simulate``), which runs the sidecar's batcher
on it against a model that sleeps for a cost surface's duration.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


class _JumpingSelector(selectors.BaseSelector):
    """The default selector, except that a wait for a timer returns at once, the clock moved on
    to when the timer is due, unless some file object is ready right now."""

    def __init__(self, clock: _Clock) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout is None:
            return ready or self._inner.select(None)
        self._clock.now += max(timeout, 0.0)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _Clock()
        super().__init__(_JumpingSelector(self._virtual))

    def time(self) -> float:
        return self._virtual.now

"""The dynamic batcher: a bounded queue, and one task that closes batches and sends them.

A batch closes on whichever comes first: it holds ``max_batch_size`` rows (``full``; a request
brings one row, but for a request of the Open Inference Protocol, which brings its tensors' first
dimension, and a request of more rows than that goes alone); its oldest request has waited
``max_wait`` since its own arrival (``timeout``); the next request would push rows x longest
length over ``max_batch_tokens`` (``tokens``); under the adaptive and auto
waits, a model slot is free and waiting for the next arrival would not pay (``idle``); or
shutdown drains the queue (``drain``). A batch is sent the moment it closes and one of
``max_concurrent_batches`` slots is free; while every slot is busy the open batch keeps filling,
so a saturated model gets full batches. Every accepted request is answered exactly once: by the
model, by its deadline (504: before its batch was sent, or while a batch the model refused was
split to find the request at fault), or by a shutdown that ran out of time (503).

Which requests make up the batch: the oldest ones (``batch_by="arrival"``), or the oldest one and
the queued requests that serve the queue for the least model time by the learned cost surface
(``"length"``, :mod:`.forming`); in either case only requests with the oldest one's ``key`` (the
options a model call is made with), the others waiting for a later batch.

How long a batch that could go is held, a model slot free, for company: until its oldest request
has waited ``max_wait`` (``wait_policy="fixed"``); while arrivals are dense enough that waiting
saves the waiting requests time, by the learned cost (``"adaptive"``); or for the expected gap to
the next arrival when the model time that arrival would save by joining exceeds that gap, and
only while the cost surface predicts batches well (``"auto"``, :func:`.cost_model.hold_pays`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Hashable
from enum import Enum
from typing import Any, NamedTuple, Protocol

from . import forming
from .cost_model import Arrivals, CostSurface, hold_pays, worth_waiting
from .metrics import SidecarMetrics
from .protocol import (
    BatchResult,
    ModelError,
    ModelFailed,
    ModelRejected,
    payload_length,
)

log = logging.getLogger(__name__)

# Loop passes for the former to wake (1) and for the next batch's task to start sending (2).
YIELDS_BEFORE_ANSWERING = 2


class Outcome(NamedTuple):
    """How one request ends: an HTTP status with either the model's output or an error message,
    and how many requests the model call that decided it held (1 when no call did)."""

    status: int
    output: Any = None
    error: str | None = None
    call_size: int = 1


FAILED_INSIDE = Outcome(502, error="the batch failed inside the sidecar")
"""What a request gets when its batch failed in the sidecar itself, not in the model."""


class QueueFull(Exception):
    """The queue holds max_queue_size requests; the caller should retry later (429)."""


class ShuttingDown(Exception):
    """The batcher is draining for shutdown and accepts nothing new (503)."""


class BatcherNotRunning(Exception):
    """submit() before start(): the app's lifespan (cleanup_ctx) was never entered."""


class BatchModel(Protocol):
    async def infer(self, inputs: list[Any]) -> BatchResult: ...


class State(Enum):
    QUEUED = 1
    RUNNING = 2
    DONE = 3


class Pending:
    """One accepted request: its payload, when it arrived, the future its handler awaits, its
    key (only requests with equal keys share a batch) and the rows it brings to a batch."""

    __slots__ = ("arrived", "future", "key", "length", "payload", "rows", "state")

    def __init__(
        self,
        payload: Any,
        length: int,
        arrived: float,
        future: asyncio.Future[Outcome],
        key: Hashable = None,
        rows: int = 1,
    ):
        self.payload = payload
        self.length = length
        self.arrived = arrived
        self.future = future
        self.key = key
        self.rows = rows
        self.state = State.QUEUED


class Batcher:
    """Queues requests for one model version and runs them in dynamically formed batches."""

    def __init__(
        self,
        model: BatchModel,
        metrics: SidecarMetrics,
        *,
        max_batch_size: int,
        max_wait_s: float,
        max_queue_size: int,
        max_batch_tokens: int,
        timeout_s: float,
        max_concurrent_batches: int,
        batch_by: str,
        wait_policy: str,
    ) -> None:
        self._model = model
        self._metrics = metrics
        self._max_size = max_batch_size
        self._max_wait = max_wait_s
        self._max_queue = max_queue_size
        self._budget = max_batch_tokens
        self._timeout = timeout_s
        self._max_running = max_concurrent_batches
        self._by_length = batch_by == "length"
        self._wait_policy = wait_policy
        self._learns_arrivals = wait_policy != "fixed"
        self.cost = CostSurface()
        self.arrivals = Arrivals()
        self._held_since: float | None = None
        """When the batch about to go was first held, a slot free, for company."""
        self._queue: deque[Pending] = deque()
        self._live = 0  # queued requests still waiting (the deque may also hold finished ones)
        self._live_rows = 0  # their rows
        self._running = 0
        self._inflight: set[asyncio.Task[None]] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._former: asyncio.Task[None] | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        metrics.queue_depth.set_function(lambda: self._live)
        metrics.watch_cost(self.cost)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._former is not None:
            raise RuntimeError("a Batcher cannot be restarted; build a new one")
        self._loop = asyncio.get_running_loop()
        self._former = self._loop.create_task(self._form_batches(), name="modelroll-batcher")
        self._former.add_done_callback(self._former_stopped)

    def _former_stopped(self, former: asyncio.Task[None]) -> None:
        if former.cancelled() or former.exception() is None:
            return
        log.error("The batcher failed", exc_info=former.exception())
        self._fail_queued(503, "the batcher failed; the request was not run")

    @property
    def alive(self) -> bool:
        """True while the batch-forming task runs (or has finished a clean drain)."""
        former = self._former
        if former is None:
            return False
        if not former.done():
            return True
        return not former.cancelled() and former.exception() is None

    @property
    def depth(self) -> int:
        return self._live

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting, send everything queued without waiting for max-wait, and wait for the
        batches in flight. Whatever is unfinished after ``timeout_s`` is answered with 503."""
        self._closing = True
        self._wake()
        try:
            await asyncio.wait_for(self._finished(), timeout_s)
        except TimeoutError:
            log.warning("Drain did not finish in %.1fs; answering the rest with 503", timeout_s)
        await self._abort("the sidecar shut down before the model ran this request")

    async def _finished(self) -> None:
        if self._former is not None:
            await asyncio.wait([self._former])  # a former that failed has answered its queue
        while self._inflight:
            await asyncio.wait(list(self._inflight))

    async def _abort(self, message: str) -> None:
        tasks = [t for t in (self._former, *self._inflight) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail_queued(503, message, reason="shutting_down")

    def _fail_queued(self, status: int, message: str, reason: str | None = None) -> None:
        while self._queue:
            pending = self._queue.popleft()
            if pending.state is State.QUEUED:
                self._dequeue(pending)
                if reason is not None:
                    self._metrics.rejected[reason].inc()
                self._resolve(pending, Outcome(status, error=message))

    # -- requests --------------------------------------------------------------------------

    def submit(
        self, payload: Any, *, length: int | None = None, key: Hashable = None, rows: int = 1
    ) -> Pending:
        """Queue one request of ``rows`` rows, ``length`` long (by default its payload's length),
        to share a batch only with requests of the same ``key``. Raises QueueFull, ShuttingDown
        or BatcherNotRunning."""
        loop = self._loop
        if loop is None or not self.alive:
            raise BatcherNotRunning("the batcher is not running (was the app's lifespan entered?)")
        if self._closing:
            self._metrics.rejected["shutting_down"].inc()
            raise ShuttingDown("the sidecar is shutting down")
        if self._live >= self._max_queue:
            self._metrics.rejected["queue_full"].inc()
            raise QueueFull(f"the queue is full ({self._max_queue} requests waiting)")
        now = loop.time()
        if length is None:
            length = payload_length(payload)
        pending = Pending(payload, length, now, loop.create_future(), key, rows)
        self._queue.append(pending)
        self._live += 1
        self._live_rows += rows
        if self._learns_arrivals:
            self.arrivals.arrived(now, length)
        # Wake the former only when this arrival can change its decision: the first queued
        # request sets its timers (max-wait, and its deadline even while every slot is busy);
        # later ones matter only while a slot is free.
        if self._live == 1 or (
            self._running < self._max_running
            and (self._live_rows >= self._max_size or self._budget or self._learns_arrivals)
        ):
            self._wake()
        return pending

    def abandon(self, pending: Pending) -> None:
        """The client went away. A queued request leaves the queue; a running one is ignored."""
        if pending.state is State.QUEUED:
            self._dequeue(pending)
            self._metrics.rejected["disconnect"].inc()

    def _expire(self, pending: Pending) -> None:
        self._dequeue(pending)
        self._metrics.rejected["deadline"].inc()
        waited_ms = self._timeout * 1000
        self._resolve(
            pending,
            Outcome(504, error=f"deadline of {waited_ms:g}ms passed before the model ran it"),
        )

    def _dequeue(self, pending: Pending) -> None:
        """Mark a queued request finished; the deque drops it lazily."""
        pending.state = State.DONE
        self._live -= 1
        self._live_rows -= pending.rows

    @staticmethod
    def _resolve(pending: Pending, outcome: Outcome) -> None:
        pending.state = State.DONE
        if not pending.future.done():  # a disconnected client's future is already cancelled
            pending.future.set_result(outcome)

    # -- batch formation -------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _sleep(self, until: float | None) -> None:
        """Wait for a wake-up (arrival, free slot, shutdown) or until the loop time ``until``."""
        assert self._loop is not None
        waiter = self._waiter = self._loop.create_future()
        timer = None if until is None else self._loop.call_at(until, self._wake)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _head(self, now: float) -> Pending | None:
        """The oldest queued request, after answering 504 to those whose deadline has passed.
        Every request gets the same timeout and the queue is FIFO, so deadlines expire in
        queue order and one timer (the former's) covers them all."""
        queue = self._queue
        while queue:
            head = queue[0]
            if head.state is not State.QUEUED:
                queue.popleft()
            elif head.arrived + self._timeout <= now:
                queue.popleft()
                self._expire(head)
            else:
                return head
        return None

    def _queued(self, limit: int) -> list[Pending]:
        """Up to ``limit`` queued requests, oldest first: the oldest, and those with its key."""
        found: list[Pending] = []
        for pending in self._queue:
            if pending.state is State.QUEUED and (not found or pending.key == found[0].key):
                found.append(pending)
                if len(found) == limit:
                    break
        return found

    def _choose(self) -> forming.Choice[Pending]:
        """The batch that would go now, and whether the token budget (rather than the size
        limit or the end of the queue) is what stopped it."""
        if self._by_length:
            candidates = self._queued(forming.LOOKAHEAD * self._max_size)
            cost = self.cost
            if not cost.known:
                return forming.by_length(candidates, self._max_size, self._budget)
            return forming.by_length(
                candidates, self._max_size, self._budget, cost.terms.call, cost.row_seconds
            )
        members = self._queued(self._max_size)
        longest = rows = 0
        for count, pending in enumerate(members):
            longer, more = max(longest, pending.length), rows + pending.rows
            if count and more > self._max_size:  # the oldest goes however many rows it has
                return forming.Choice(members[:count], False, longest)
            if self._budget and count and more * longer > self._budget:
                return forming.Choice(members[:count], True, longest)
            longest, rows = longer, more
        return forming.Choice(members, False, longest)

    def _hold_until(self, batch: forming.Choice[Pending], now: float, oldest_due: float) -> float:
        """Under the adaptive and auto waits: until when to hold ``batch``, a slot free, for
        company; ``now`` or earlier to send it now."""
        if self._running + 1 < self._max_running:
            return now  # another slot stays free for whatever arrives next
        rate = self.arrivals.per_second(now)
        size = forming.rows(batch.members)
        if self._wait_policy == "adaptive":
            return oldest_due if worth_waiting(self.cost, rate, size, batch.longest) else now
        hold = hold_pays(self.cost, rate, self.arrivals.mean_length, size, batch.longest)
        if not hold:
            return now
        held_since = now if self._held_since is None else self._held_since
        return min(oldest_due, held_since + hold)

    async def _hold(self, until: float) -> None:
        """Hold the batch that could go, a model slot free, until ``until`` or a wake-up."""
        if self._held_since is None:
            assert self._loop is not None
            self._held_since = self._loop.time()
        await self._sleep(until)

    async def _form_batches(self) -> None:
        assert self._loop is not None
        loop = self._loop
        while True:
            now = loop.time()
            head = self._head(now)
            if head is None:
                self._held_since = None  # what was held left the queue (deadline, disconnect)
                if self._closing:
                    return
                await self._sleep(None)
                continue
            if self._running >= self._max_running:
                await self._sleep(head.arrived + self._timeout)
                continue
            oldest_due = head.arrived + self._max_wait
            full = self._live_rows >= self._max_size
            fixed = self._wait_policy == "fixed"
            if not (full or self._budget or self._closing or not fixed or now >= oldest_due):
                await self._hold(oldest_due)  # nothing but the oldest's max-wait can close it
                continue
            batch = self._choose()
            if forming.rows(batch.members) >= self._max_size:
                reason = "full"
            elif batch.budget_hit:
                reason = "tokens"
            elif full:
                reason = "full"  # a full batch's worth was queued; by length, fewer went
            elif self._closing:
                reason = "drain"
            elif now >= oldest_due:
                reason = "timeout"
            elif fixed:
                await self._hold(oldest_due)
                continue
            elif (until := self._hold_until(batch, now, oldest_due)) <= now:
                reason = "idle"
            else:
                await self._hold(until)
                continue
            self._dispatch(batch.members, reason)

    def _dispatch(self, batch: list[Pending], reason: str) -> None:
        assert self._loop is not None
        now = self._loop.time()
        held_since, self._held_since = self._held_since, None
        self._metrics.batch_hold.observe(0.0 if held_since is None else now - held_since)
        wait = self._metrics.queue_wait
        for pending in batch:
            pending.state = State.RUNNING
            wait.observe(now - pending.arrived)
        self._live -= len(batch)
        self._live_rows -= forming.rows(batch)
        self._metrics.count_batch([(p.length, p.rows) for p in batch], reason)
        self._running += 1
        task = self._loop.create_task(self._execute(batch))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _execute(self, batch: list[Pending]) -> None:
        """Run one batch and answer each of its requests exactly once, whatever happens: the
        model's outcomes, the model's error, 503 when cancelled (shutdown), and 502 for anything
        else, including a failure while the answers are handed out (no request is left hanging
        past its deadline)."""
        assert self._loop is not None
        started = self._loop.time()
        outcomes: list[Outcome] = []
        try:
            try:
                outcomes = await self._run(batch)
                if outcomes:  # not a batch refused and split, whose time is several calls'
                    self._learn(batch, self._loop.time() - started)
            finally:
                self._metrics.batch_duration.observe(self._loop.time() - started)
                self._running -= 1
                self._wake()
            # Let the former send the next batch before this one's responses are written: the
            # model then idles for one event-loop pass instead of a batch's worth of responses.
            for _ in range(YIELDS_BEFORE_ANSWERING):
                await asyncio.sleep(0)
            self._answer(batch, outcomes, FAILED_INSIDE)
        except ModelError as exc:
            log.warning("Batch of %d failed: %s", len(batch), exc)
            self._answer(batch, outcomes, Outcome(exc.status, error=str(exc)))
        except asyncio.CancelledError:
            self._answer(batch, outcomes, Outcome(503, error="the sidecar shut down mid-batch"))
            raise
        except Exception:
            log.exception("Batch of %d failed unexpectedly", len(batch))
            self._answer(batch, outcomes, FAILED_INSIDE)
        finally:  # BaseException too (KeyboardInterrupt, SystemExit): nobody waits forever
            self._answer(batch, outcomes, FAILED_INSIDE)

    def _learn(self, batch: list[Pending], seconds: float) -> None:
        """Fit the cost surface to a batch the model answered whole, in ``seconds``."""
        longest = max(p.length for p in batch)
        predicted = self.cost.observe(forming.rows(batch), longest, seconds)
        if predicted:
            self._metrics.cost_observed_over_predicted.observe(seconds / predicted)

    def _answer(self, batch: list[Pending], outcomes: list[Outcome], otherwise: Outcome) -> None:
        """Answer each request of ``batch`` that has no answer yet: with its outcome when the
        model answered the whole batch (those answers stand, whatever failed after), else with
        ``otherwise``, as one failed call of every request it answers."""
        if len(outcomes) != len(batch):
            failed = sum(p.state is not State.DONE for p in batch)
            if not failed:
                return
            self._metrics.count_failed_batch(failed)
            outcomes = [otherwise._replace(call_size=failed)] * len(batch)
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.state is not State.DONE:
                self._resolve(pending, outcome)

    async def _run(self, batch: list[Pending]) -> list[Outcome]:
        """The batch's outcomes from the model; none when the model refused the batch and
        :meth:`_split` answered each request on the way."""
        try:
            return await self._call(batch)
        except ModelRejected as exc:
            if len(batch) == 1:
                return [Outcome(exc.status, error=str(exc))]
            log.warning("The model refused a batch of %d; splitting it", len(batch))
        await self._split(batch)
        return []

    async def _split(self, batch: list[Pending]) -> None:
        """Answer the requests of a batch the model refused as bad input (4xx): split it in
        halves, again and again, so that only a request the model refuses on its own gets 422
        and every other request still gets its answer (no client can fail a batch it shares
        with others). Each part's requests are answered as soon as the model answers the part,
        and before every call those whose deadline has passed get 504 and are not sent again,
        so however slowly the model refuses, no request waits past its deadline plus one call."""
        parts = self._halves(batch)  # a stack: the part on top goes next
        while parts:
            self._expire_split(parts)
            part = [p for p in parts.pop() if p.state is not State.DONE]
            if not part:
                continue
            try:
                outcomes = await self._call(part)
            except ModelRejected as exc:
                if len(part) == 1:
                    self._resolve(part[0], Outcome(exc.status, error=str(exc)))
                else:
                    parts += self._halves(part)
                continue
            for pending, outcome in zip(part, outcomes, strict=True):
                self._resolve(pending, outcome)

    @staticmethod
    def _halves(part: list[Pending]) -> list[list[Pending]]:
        """The two halves of ``part`` as a stack: the first half on top."""
        half = len(part) // 2
        return [part[half:], part[:half]]

    def _expire_split(self, parts: list[list[Pending]]) -> None:
        """Answer 504 to each request of a split whose deadline has passed."""
        assert self._loop is not None
        now = self._loop.time()
        expired = [
            pending
            for part in parts
            for pending in part
            if pending.state is State.RUNNING and pending.arrived + self._timeout <= now
        ]
        if not expired:
            return
        log.warning("%d requests of a refused batch passed their deadline", len(expired))
        waited_ms = self._timeout * 1000
        outcome = Outcome(
            504,
            error=f"the model refused the batch this request was in, and its deadline of "
            f"{waited_ms:g}ms passed while the sidecar isolated the request at fault",
        )
        for pending in expired:
            self._metrics.rejected["split_deadline"].inc()
            self._resolve(pending, outcome)

    async def _call(self, batch: list[Pending]) -> list[Outcome]:
        """One model call: an outcome for each request of ``batch``, in order."""
        result = await self._model.infer([p.payload for p in batch])
        if len(result.outputs) != len(batch) or len(result.errors) != len(batch):
            raise ModelFailed(
                f"the model returned {len(result.outputs)} outputs and {len(result.errors)} "
                f"errors for {len(batch)} inputs"
            )
        size = len(batch)
        return [
            Outcome(200, output, call_size=size)
            if error is None
            else Outcome(422, error=error, call_size=size)
            for output, error in zip(result.outputs, result.errors, strict=True)
        ]

"""The scheduler of ``modelroll-demo-llm``: a stand-in for an LLM engine's batching, with the cost
of a GPU that runs one iteration at a time.

An iteration costs ``step_ms + step_ms_per_seq x sequences in the batch`` plus
``prefill_ms_per_token x prompt tokens`` of the sequences it admits, and gives every unfinished
sequence in the batch one token. A batch holds at most ``max_seqs`` sequences, and the prompts and
outputs of the sequences in it at most ``kv_tokens`` tokens (each reserves its prompt and its whole
output when admitted, as a KV cache sized for it would).

Two schedulers, the two ways LLM servers batch:

- ``continuous`` (iteration-level, as vLLM, TGI and SGLang batch): waiting sequences join at every
  iteration while the limits allow, and a finished sequence leaves the batch, freeing its slot
  and its KV, at once.
- ``static`` (request-level): a batch is formed only when none is running, and runs until its
  longest sequence ends. A sequence that finished early still occupies its slot and is still
  charged in every iteration (the padding of autoregressive decoding); newcomers wait for the
  whole batch.

The counters say what the difference costs: ``slot_steps`` (sequence slots paid for, iteration by
iteration) against ``tokens`` (slots that produced a token).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

SCHEDULERS = ("continuous", "static")
LATE_WAKE_S = 0.002
"""An iteration that starts later than this after the last one ended started from idle."""


@dataclass(frozen=True, slots=True)
class EngineCost:
    step_ms: float = 8.0
    """An iteration's fixed cost (reading the weights once)."""
    step_ms_per_seq: float = 0.25
    """Each sequence's share of an iteration (its attention over its KV)."""
    prefill_ms_per_token: float = 0.02
    """Prompt processing, per prompt token, in the iteration that admits the sequence."""
    max_seqs: int = 64
    kv_tokens: int = 65536

    def step_s(self, sequences: int, prefill_tokens: int) -> float:
        ms = self.step_ms + self.step_ms_per_seq * sequences
        return (ms + self.prefill_ms_per_token * prefill_tokens) / 1000


class Token:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class Finished:
    """The sequence produced all its tokens."""


class Failed:
    """The engine failed the sequence after some tokens (``--error-rate``)."""


Event = Token | Finished | Failed


@dataclass(eq=False)
class Sequence:
    """One generation: its lengths, and the events its request handler reads."""

    prompt_tokens: int
    output_tokens: int
    fail_after: int | None = None
    """Fail once this many tokens have been produced (None: never)."""
    generated: int = 0
    done: bool = False
    cancelled: bool = False
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)

    @property
    def reserved(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def cancel(self) -> None:
        """The client went away: the engine stops generating for it at the next iteration."""
        self.cancelled = True


@dataclass
class EngineStats:
    iterations: int = 0
    slot_steps: int = 0
    """Sequence slots charged, summed over iterations (finished ones in a static batch too)."""
    tokens: int = 0
    """Tokens produced: slots that did useful work."""
    prompt_tokens: int = 0
    sequences: int = 0
    cancelled: int = 0
    failed: int = 0
    busy_s: float = 0.0


class Engine:
    """Runs admitted sequences iteration by iteration on one simulated GPU."""

    def __init__(self, cost: EngineCost, scheduler: str = "continuous") -> None:
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
        self.cost = cost
        self.scheduler = scheduler
        self.stats = EngineStats()
        self._waiting: deque[Sequence] = deque()
        self._batch: list[Sequence] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return sum(1 for s in self._batch if not s.done)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="demo-llm-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(self, sequence: Sequence) -> Sequence:
        if sequence.reserved > self.cost.kv_tokens:
            raise ValueError(
                f"prompt and output ({sequence.reserved} tokens) exceed the engine's KV budget "
                f"({self.cost.kv_tokens})"
            )
        self._waiting.append(sequence)
        self._wake.set()
        return sequence

    def cancel(self, sequence: Sequence) -> None:
        """The client went away: a waiting sequence leaves the queue now, never admitted (as an
        engine aborts a request); a running one stops at the next iteration."""
        if sequence.done or sequence.cancelled:
            return
        sequence.cancel()
        if sequence in self._waiting:
            self._waiting.remove(sequence)
            self.stats.cancelled += 1

    def _admit(self) -> list[Sequence]:
        """Move waiting sequences into the batch as the scheduler allows; returns those admitted
        (their prompts are processed in this iteration)."""
        if self.scheduler == "static" and self._batch:
            return []  # the running batch goes on until its longest sequence ends
        reserved = sum(s.reserved for s in self._batch)
        admitted: list[Sequence] = []
        while self._waiting and len(self._batch) < self.cost.max_seqs:
            head = self._waiting[0]
            if head.cancelled:
                self._waiting.popleft()
                self.stats.cancelled += 1
                continue
            if reserved + head.reserved > self.cost.kv_tokens:
                break
            self._waiting.popleft()
            self._batch.append(head)
            admitted.append(head)
            reserved += head.reserved
        return admitted

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        ended = loop.time()  # when the last iteration was due to end
        while True:
            admitted = self._admit()
            if not self._batch:
                self._wake.clear()
                await self._wake.wait()
                ended = loop.time()
                continue
            prefill = sum(s.prompt_tokens for s in admitted)
            seconds = self.cost.step_s(len(self._batch), prefill)
            # Back to back with the last iteration, not with when the loop woke after it: a
            # timer's late wake-up (up to a millisecond) then does not add up over iterations.
            now = loop.time()
            ended = (ended if now - ended < LATE_WAKE_S else now) + seconds
            await asyncio.sleep(ended - loop.time())
            self.stats.iterations += 1
            self.stats.slot_steps += len(self._batch)
            self.stats.prompt_tokens += prefill
            self.stats.busy_s += seconds
            for sequence in self._batch:
                self._step(sequence)
            if self.scheduler == "continuous" or all(s.done for s in self._batch):
                self._batch = [s for s in self._batch if not s.done]

    def _step(self, sequence: Sequence) -> None:
        if sequence.done:
            return  # a static batch's finished sequence: charged, producing nothing
        if sequence.cancelled:
            sequence.done = True
            self.stats.cancelled += 1
            return
        if sequence.fail_after is not None and sequence.generated >= sequence.fail_after:
            sequence.done = True
            self.stats.failed += 1
            sequence.events.put_nowait(Failed())
            return
        sequence.events.put_nowait(Token(sequence.generated))
        sequence.generated += 1
        self.stats.tokens += 1
        if sequence.generated >= sequence.output_tokens:
            sequence.done = True
            self.stats.sequences += 1
            sequence.events.put_nowait(Finished())

"""Which queued requests form the next batch when batches are formed by length (``--batch-by
length``, and ``auto``).

The oldest queued request always goes: its max-wait guarantee, and the starvation bound in
docs/design.md ("Batching"), rest on that. The rest of the batch is chosen by splitting the
candidates, sorted by length, into the batches that would send them all for the least model
time, ``call + size x row(longest)`` each (the cost surface
:class:`~modelroll_sidecar.cost_model.CostSurface` learns), within the size and token limits; the
batch that holds the oldest request goes now. A padded batch holds requests of neighbouring
lengths, so the cheapest split is a split of the sorted list into runs, found exactly by dynamic
programming over where each run ends. Serving each request alone is one such split, so no batch
chosen costs more, by the surface, than serving its members one by one.

The split weighs a call's fixed cost against the padding it saves: with a large fixed cost and a
short queue, everything goes in one call (at light load the batch is first in, first out); with a
backlog, or lengths far apart, a short request does not ride, padded, in a batch of long ones when
a batch of short ones carries it for less. Until the cost is known, calls count as dearer than any
padding: the queue goes in as few batches as the limits allow, each padded as little as it can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

LOOKAHEAD = 4
"""The candidates are the oldest ``LOOKAHEAD x max-batch-size`` queued requests: enough to find
requests of similar length, few enough that splitting them costs well under a millisecond, and
old enough that a request far back in a long queue is not chosen ahead of hundreds of older
ones."""

UNKNOWN_CALL = 1e12
"""A call's fixed cost while the model's cost is not known, rows costing their padded length:
more than any padding, so the split uses as few batches as it can."""


class Sized(Protocol):
    @property
    def length(self) -> int: ...

    @property
    def rows(self) -> int:
        """The rows it brings to a batch: what --max-batch-size counts (1 but for a request of
        the Open Inference Protocol, whose rows are its tensors' first dimension)."""
        ...


T = TypeVar("T", bound=Sized)


class Choice(NamedTuple, Generic[T]):
    members: list[T]
    """The batch, in queue (arrival) order."""
    budget_hit: bool
    """The token budget, not the size limit or the candidates running out, stopped it: not even
    one more row as long as its longest would fit."""
    longest: int


def rows(members: Sequence[Sized]) -> int:
    """The rows of ``members`` together."""
    return sum(member.rows for member in members)


def padded_cost(longest: int) -> float:
    """A row's cost while the model's cost is not known: its padded length."""
    return float(longest)


def by_length(
    candidates: Sequence[T],
    max_size: int,
    budget: int,
    call: float = UNKNOWN_CALL,
    row: Callable[[int], float] = padded_cost,
) -> Choice[T]:
    """The next batch from ``candidates`` (queued requests in arrival order; the first is the
    oldest and always goes), a batch of n rows costing ``call + n x row(longest)``, at most
    ``max_size`` rows and ``budget`` padded tokens (n x longest; 0: no token budget) unless it is
    one request alone."""
    order = sorted(range(len(candidates)), key=lambda i: candidates[i].length)  # stable
    sizes = [candidates[i].length for i in order]
    before = [0]  # before[j]: the rows of the j shortest candidates
    for i in order:
        before.append(before[-1] + candidates[i].rows)
    # cheapest[j]: the least cost of sending the j shortest candidates; start[j]: where the
    # last batch of that split begins (it ends at j, padded to sizes[j - 1]).
    cheapest = [0.0] * (len(sizes) + 1)
    start = [0] * (len(sizes) + 1)
    earliest = 0  # the first start whose batch ending at ``end`` keeps within the limits
    for end in range(1, len(sizes) + 1):
        longest = sizes[end - 1]
        per_row = row(longest)
        most = max_size if not budget else min(max_size, budget // longest)
        while before[end] - before[earliest] > most and earliest < end - 1:
            earliest += 1  # longest only grows with end, so the window only moves on
        first = min(
            range(earliest, end), key=lambda k: cheapest[k] - before[k] * per_row
        )  # the earliest of equals: fewer, larger batches
        cheapest[end] = cheapest[first] + call + (before[end] - before[first]) * per_row
        start[end] = first
    oldest = order.index(0)
    end = len(sizes)
    while start[end] > oldest:
        end = start[end]
    members = [candidates[i] for i in sorted(order[start[end] : end])]
    longest = sizes[end - 1]
    taken = rows(members)
    budget_hit = bool(budget) and (taken + 1) * longest > budget
    return Choice(members, budget_hit and taken < max_size, longest)

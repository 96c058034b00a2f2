"""Which queued requests form the next batch under ``--batch-by length``.

The oldest queued request always goes: its max-wait guarantee, and the starvation bound in
docs/design.md ("Batching"), rest on that. The rest of the batch grows from it through the
candidates sorted by length, one neighbour at a time (the next shorter or the next longer),
taking whichever keeps the batch's cost per useful token lowest, within the size and token
limits. Once the model's cost is known (``fixed + per_token x padded tokens``, learned by
:class:`~modelroll_sidecar.cost_model.CostModel`), the batch also stops growing when one more
request would raise that cost per useful token: a short request does not ride, padded, in a batch
of long ones when a batch of short ones would carry it for less. But when everything queued fits
in one batch, the requests left out would need a second call of their own, so the batch takes
them all whenever one call costs no more than the two (with a large fixed cost, at light load,
that makes it a FIFO batch). Until the cost is known, the batch grows to its limits, padding as
little as it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

LOOKAHEAD = 4
"""The candidates are the oldest ``LOOKAHEAD x max-batch-size`` queued requests: enough to find
requests of similar length, few enough that sorting them costs microseconds, and old enough
that a request far back in a long queue is not chosen ahead of hundreds of older ones."""


class Sized(Protocol):
    @property
    def length(self) -> int: ...


T = TypeVar("T", bound=Sized)


class Choice(NamedTuple, Generic[T]):
    members: list[T]
    """The batch, in queue (arrival) order."""
    budget_hit: bool
    """The token budget, not the size limit or the candidates running out, stopped it."""
    longest: int


def by_length(
    candidates: Sequence[T],
    max_size: int,
    budget: int,
    fixed: float = 0.0,
    per_token: float = 0.0,
) -> Choice[T]:
    """The next batch from ``candidates`` (queued requests in arrival order; the first is the
    oldest and always goes). ``budget`` 0 means no token budget; ``per_token`` 0 means the cost
    is not known yet, so nothing stops the batch short of its limits."""
    head = candidates[0]
    order = sorted(range(len(candidates)), key=lambda i: candidates[i].length)  # stable
    where = order.index(0)
    lo, hi = where, where + 1  # the batch is order[lo:hi]
    count, longest, useful = 1, head.length, head.length
    budget_hit = False
    cost_known = per_token > 0.0
    weight = fixed / per_token if cost_known else 0.0  # the fixed cost, in tokens
    while count < max_size:
        best: tuple[float, int, int] | None = None  # (cost per useful token, side, new longest)
        for side, index in ((-1, lo - 1), (1, hi)):
            if not 0 <= index < len(order):
                continue
            length = candidates[order[index]].length
            grown = max(longest, length)
            if budget and (count + 1) * grown > budget:
                budget_hit = True
                continue
            score = (weight + (count + 1) * grown) / (useful + length)
            if best is None or score < best[0]:
                best = (score, side, grown)
        if best is None:
            break
        score, side, grown = best
        if cost_known and score > (weight + count * longest) / useful:
            budget_hit = False  # the cost stopped it: later arrivals may still suit it better
            break
        if side < 0:
            lo -= 1
        else:
            hi += 1
        count, longest = count + 1, grown
        useful += candidates[order[lo if side < 0 else hi - 1]].length
        budget_hit = False
    members = [candidates[i] for i in sorted(order[lo:hi])]
    if cost_known and len(members) < len(candidates) <= max_size:
        # The whole queue fits in this batch: what is left out needs a batch of its own.
        everything = max(c.length for c in candidates)
        if not budget or len(candidates) * everything <= budget:
            rest = max(candidates[i].length for i in order[:lo] + order[hi:])
            apart = 2 * weight + count * longest + (len(candidates) - count) * rest
            if weight + len(candidates) * everything <= apart:
                return Choice(list(candidates), False, everything)
    return Choice(members, budget_hit, longest)

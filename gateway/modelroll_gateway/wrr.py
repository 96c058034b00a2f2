"""Smooth weighted round-robin (nginx's algorithm): exact shares, evenly interleaved.

With weights 9:1 every run of 10 picks holds exactly 9 of the first and 1 of the second, and the
second is not bunched (a a a a b a a a a a). Zero-weight items are never picked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class SmoothWeightedPicker(Generic[T]):
    """Picks items in proportion to integer weights; O(n) per pick (n: a handful of versions)."""

    __slots__ = ("_current", "_items", "_total", "_weights")

    def __init__(self, weighted: Iterable[tuple[T, int]]) -> None:
        pairs = [(item, weight) for item, weight in weighted if weight > 0]
        self._items: list[T] = [item for item, _ in pairs]
        self._weights: list[int] = [weight for _, weight in pairs]
        self._current: list[int] = [0] * len(pairs)
        self._total = sum(self._weights)

    def __bool__(self) -> bool:
        """False when nothing can be picked (no items, or every weight is 0)."""
        return self._total > 0

    def pick(self) -> T:
        """The next item. Raises LookupError when nothing is routable."""
        if self._total <= 0:
            raise LookupError("no item has a positive weight")
        current = self._current
        weights = self._weights
        best = 0
        best_value = current[0] + weights[0]
        current[0] = best_value
        for i in range(1, len(current)):
            value = current[i] + weights[i]
            current[i] = value
            if value > best_value:
                best, best_value = i, value
        current[best] = best_value - self._total
        return self._items[best]

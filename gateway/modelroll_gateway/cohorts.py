"""Sticky cohorts: a request key (a user id, an API-key hash) picks a version by weighted
rendezvous hashing, the same on every gateway replica.

Each version scores ``weight / -ln(u)``, ``u`` in (0, 1) a hash of the key and the version's name,
and the highest score wins. The scores are exponential races, so a version gets ``weight / total``
of the keys; and a key moves only to a version whose weight grew relative to the others: as a
canary's weight goes from 5 to 20 to 50 (its baseline's from 95 to 80 to 50), the keys on the
canary stay there and others join them, none goes back. A version's hash depends on its name
alone, so adding or removing one moves only the keys it takes or gives up.

A client may choose its key, and with it its version: :class:`KeyBudget` bounds how many of one
key's requests a canary analysis judges.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from array import array
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")

_SCALE = 2.0**64


def _salt(name: str) -> bytes:
    """blake2b's 16-byte salt from a version name (names are DNS labels, at most 63 bytes)."""
    return hashlib.blake2b(name.encode(), digest_size=16).digest()


class CohortPicker(Generic[T]):
    """Picks an item for a key in proportion to integer weights, the same item for the same key
    and weights; zero-weight items are never picked."""

    __slots__ = ("_items",)

    def __init__(self, weighted: Iterable[tuple[str, T, int]]) -> None:
        self._items = [(_salt(name), item, weight) for name, item, weight in weighted if weight > 0]

    def __bool__(self) -> bool:
        return bool(self._items)

    def pick(self, key: str) -> T:
        """The item ``key`` belongs to. Raises LookupError when nothing is routable."""
        if not self._items:
            raise LookupError("no item has a positive weight")
        data = key.encode("utf-8", "surrogatepass")
        best, best_score = self._items[0][1], -1.0
        for salt, item, weight in self._items:
            digest = hashlib.blake2b(data, digest_size=8, salt=salt).digest()
            u = (int.from_bytes(digest, "big") + 0.5) / _SCALE
            score = weight / -math.log(u)
            if score > best_score:
                best, best_score = item, score
        return best


KEY_BUDGET_WINDOW = 60.0
"""Seconds of a key's budget window: --cohort-key-budget judged requests a key a minute."""
KEY_BUDGET_SLOTS = 1 << 16
"""Slots of the budget table: 65536, 12 bytes each (768 KiB), whatever the clients send."""


class KeyBudget:
    """Which requests routed by a cohort key a canary analysis may judge: at most ``budget`` of
    one key's in a window of ``window`` seconds from its first; the rest are counted apart.

    Keys are not kept: each is hashed, with the model and a secret of the process, to one slot
    of a fixed table. Keys that share a slot share its budget, so a key never gets more than
    ``budget``; with many more keys in a window than slots, fewer of their requests are judged.
    """

    __slots__ = ("_clock", "_counts", "_secret", "_starts", "budget", "window")

    def __init__(
        self,
        budget: int,
        window: float = KEY_BUDGET_WINDOW,
        slots: int = KEY_BUDGET_SLOTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget
        self.window = window
        self._clock = clock
        self._secret = os.urandom(16)
        self._counts = array("I", [0]) * slots
        self._starts = array("d", [-math.inf]) * slots

    def take(self, model: str, key: str) -> bool:
        """Whether this request of ``key`` to ``model`` is within the key's budget (and
        counts against it)."""
        data = b"%s\0%s" % (model.encode(), key.encode("utf-8", "surrogatepass"))
        digest = hashlib.blake2b(data, digest_size=8, key=self._secret).digest()
        slot = int.from_bytes(digest, "big") % len(self._counts)
        now = self._clock()
        if now - self._starts[slot] >= self.window:
            self._starts[slot] = now
            self._counts[slot] = 0
        if self._counts[slot] >= self.budget:
            return False
        self._counts[slot] += 1
        return True

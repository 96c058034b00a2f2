"""What the adaptive wait (``--wait-policy adaptive``) knows about the model and the traffic,
learned online: a batch's duration as ``fixed + per_token x padded tokens``, and the arrival rate.

Both forget the past exponentially, so a model that warms up, or traffic that changes, is
followed within a few dozen batches (the cost) or a second (the rate).
"""

from __future__ import annotations

import math

COST_MEMORY = 0.97
"""Weight each older batch keeps per new one: the fit follows about the last 30 batches."""
MIN_BATCHES = 8
"""Batches the cost fit needs before anything trusts it."""
RATE_TIME_CONSTANT_S = 1.0
"""The arrival rate is an exponentially weighted count over about this much recent time."""


class CostModel:
    """An exponentially weighted least-squares fit of batch duration (seconds) against padded
    tokens. With batches of one size only, ``per_token`` is 0 and ``fixed`` their mean duration:
    the two cannot be told apart then, and counting it all as fixed errs towards waiting, as the
    fixed policy does."""

    __slots__ = ("_n", "_w", "_x", "_xx", "_xy", "_y", "fixed", "per_token")

    def __init__(self) -> None:
        self._n = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.fixed = 0.0
        self.per_token = 0.0

    @property
    def known(self) -> bool:
        return self._n >= MIN_BATCHES

    def observe(self, padded_tokens: int, seconds: float) -> None:
        m, x = COST_MEMORY, float(padded_tokens)
        self._n += 1
        self._w = self._w * m + 1.0
        self._x = self._x * m + x
        self._y = self._y * m + seconds
        self._xx = self._xx * m + x * x
        self._xy = self._xy * m + x * seconds
        mean_x, mean_y = self._x / self._w, self._y / self._w
        spread = self._xx / self._w - mean_x * mean_x
        slope = 0.0
        if spread > 1e-9 * (1.0 + mean_x * mean_x):
            slope = (self._xy / self._w - mean_x * mean_y) / spread
        if slope <= 0.0:
            self.fixed, self.per_token = mean_y, 0.0
            return
        fixed = mean_y - slope * mean_x
        if fixed < 0.0:  # a line through the origin, fitted again
            fixed, slope = 0.0, self._xy / self._xx
        self.fixed, self.per_token = fixed, slope

    def seconds(self, padded_tokens: int) -> float:
        return self.fixed + self.per_token * padded_tokens


class ArrivalRate:
    """Arrivals per second, an exponentially decaying count over ``RATE_TIME_CONSTANT_S``."""

    __slots__ = ("_at", "_count")

    def __init__(self) -> None:
        self._count = 0.0
        self._at = 0.0

    def arrived(self, now: float) -> None:
        self._count = self._count * math.exp((self._at - now) / RATE_TIME_CONSTANT_S) + 1.0
        self._at = now

    def per_second(self, now: float) -> float:
        decayed = self._count * math.exp((self._at - now) / RATE_TIME_CONSTANT_S)
        return decayed / RATE_TIME_CONSTANT_S


def worth_waiting(cost: CostModel, rate_per_s: float, size: int, longest: int) -> bool:
    """Whether a batch of ``size`` requests padded to ``longest``, about to take the model's last
    free slot, should wait for the next arrival instead of going now.

    Going now, the next request arrives (in 1/rate on average) to a busy model and pays a whole
    batch of its own, fixed cost included; waiting, the ``size`` requests each wait that gap and
    the batch grows by one row. Summed over the requests, waiting is cheaper exactly when
    ``(size + 1) x gap + size x per_token x longest < fixed``: when the fixed cost is large and
    arrivals are dense. Until the cost fit is trusted, this says yes: the batch waits up to
    max-wait, as under the fixed policy."""
    if not cost.known:
        return True
    if rate_per_s <= 0.0:
        return False
    gap = 1.0 / rate_per_s
    return (size + 1) * gap + size * cost.per_token * longest < cost.fixed

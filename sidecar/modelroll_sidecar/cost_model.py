"""What the batcher learns while serving: the model's cost surface and the traffic's arrivals.

The cost surface is a batch's duration as a function of its size ``n`` and its padded length
``L`` (its longest request's length):

    seconds = call + n x (row + token x L + token_squared x L^2)

``call`` is what a model call costs whatever it holds (an HTTP round trip and a framework's
dispatch on a CPU; kernel launches and transfers on a GPU, where it dominates); the rest is each
row's work, which grows faster than linearly in its padded length (attention). The terms are
fitted online by exponentially weighted least squares in relative error (each batch weighs
1 / its predicted duration squared, relative to the recent mean, so a lone short request's few
milliseconds count as much as a full batch's hundreds, and the call cost they reveal is not lost
in the big batches' residuals), kept non-negative, so a model that warms up or a second tenant on
its cores is followed within a few dozen batches. Each batch is predicted before it is learned
from, and the recent mean of the relative error says whether the fit can be trusted to decide
anything subtle (how long to wait); a batch far off its prediction (a GC pause) moves the fit only
as far as a batch ``OUTLIER`` times off would.

Both fits forget the past exponentially: the cost over about the last 30 batches, the arrival
rate over about the last second.
"""

from __future__ import annotations

import math
from typing import NamedTuple

COST_MEMORY = 0.97
"""Weight each older batch keeps per new one: the fit follows about the last 30 batches."""
MIN_BATCHES = 8
"""Batches the cost fit needs before anything uses it."""
TRUSTED_ERROR = 0.35
"""The fit is trusted while the recent mean of abs(observed - predicted) / observed is at most
this: a model whose durations scatter more than that (noisy, bimodal, shared cores) gets no
waits that rest on a prediction."""
OUTLIER = 3.0
"""A batch observed more than this many times off its prediction is learned from as if it
were exactly this many times off."""
LENGTH_SCALE = 100.0
"""Padded lengths are fitted in hundreds of tokens, so that the four columns of the fit are of
like size and its equations stay well conditioned."""
RIDGE = 1e-4
"""How strongly each term is held at its last value where recent batches say nothing of it
(all of one size, say), as a share of the fit's mean diagonal: small against what the batches
say, large against what they do not."""
RATE_TIME_CONSTANT_S = 1.0
"""The arrival rate is an exponentially weighted count over about this much recent time."""

TERMS = ("call", "row", "token", "token_squared")
"""The surface's terms, as the metric's ``term`` label names them."""


class Terms(NamedTuple):
    """The fitted surface, in seconds: per call, per row, per row and padded token, per row and
    padded token squared."""

    call: float
    row: float
    token: float
    token_squared: float


def _features(size: int, longest: int) -> tuple[float, float, float, float]:
    u = longest / LENGTH_SCALE
    return (1.0, float(size), size * u, size * u * u)


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """The solution of a small linear system by Gaussian elimination with partial pivoting, or
    None when it is singular."""
    n = len(rhs)
    a = [[*row, rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-15:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= factor * a[col][c]
    solution = [0.0] * n
    for r in range(n - 1, -1, -1):
        tail = sum(a[r][c] * solution[c] for c in range(r + 1, n))
        solution[r] = (a[r][n] - tail) / a[r][r]
    return solution


class CostSurface:
    """An online fit of batch duration (seconds) against batch size and padded length."""

    __slots__ = ("_gram", "_level", "_memory", "_moment", "_n", "_theta", "error")

    def __init__(self, memory: float = COST_MEMORY) -> None:
        """``memory``: the weight each older batch keeps per new one (1.0: a plain least-squares
        fit of everything observed, as an offline fit wants)."""
        self._memory = memory
        self._n = 0
        self._gram = [[0.0] * 4 for _ in range(4)]
        self._moment = [0.0] * 4
        self._theta = [0.0] * 4  # the terms, with token and token_squared per LENGTH_SCALE
        self._level = 0.0  # the recent mean duration
        self.error = 0.0
        """The recent mean of abs(observed - predicted) / observed."""

    @property
    def known(self) -> bool:
        return self._n >= MIN_BATCHES

    @property
    def trusted(self) -> bool:
        return self.known and self.error <= TRUSTED_ERROR

    @property
    def terms(self) -> Terms:
        call, row, token, squared = self._theta
        return Terms(call, row, token / LENGTH_SCALE, squared / LENGTH_SCALE**2)

    def row_seconds(self, longest: int) -> float:
        """What one more row padded to ``longest`` adds to a batch's duration."""
        _, row, token, squared = self._theta
        u = longest / LENGTH_SCALE
        return row + token * u + squared * u * u

    def seconds(self, size: int, longest: int) -> float:
        """The predicted duration of a batch of ``size`` requests padded to ``longest``."""
        return self._theta[0] + size * self.row_seconds(longest)

    def observe(self, size: int, longest: int, seconds: float) -> float | None:
        """Learn from one batch's duration; returns what was predicted for it (None while the
        fit is not known yet)."""
        predicted = self.seconds(size, longest) if self.known else None
        target = seconds
        m = self._memory
        if predicted is not None and predicted > 0.0 and seconds > 0.0:
            self.error = m * self.error + (1.0 - m) * abs(seconds - predicted) / seconds
            target = min(max(seconds, predicted / OUTLIER), predicted * OUTLIER)
        x = _features(size, longest)
        # Relative error: weighed by 1 / what the batch was expected to take (once there is an
        # expectation: weighed by what it took, a batch that ran slow would count for less the
        # slower it ran), squared, times the recent mean duration squared, so that a model that
        # turns slower as a whole is followed as fast as one that turns faster.
        self._level = m * self._level + (1.0 - m) * target if self._n else target
        weight = (self._level / max(predicted or seconds, 1e-9)) ** 2
        for i in range(4):
            self._moment[i] = m * self._moment[i] + weight * x[i] * target
            for j in range(4):
                self._gram[i][j] = m * self._gram[i][j] + weight * x[i] * x[j]
        self._n += 1
        self._refit()
        return predicted

    def _refit(self) -> None:
        """Least squares, each term held towards its last value by RIDGE, none below 0: a term
        that comes out negative is fixed at 0 and the others fitted again."""
        ridge = RIDGE * sum(self._gram[i][i] for i in range(4)) / 4
        free = [0, 1, 2, 3]
        while free:
            matrix = [[self._gram[i][j] for j in free] for i in free]
            rhs = [self._moment[i] + ridge * self._theta[i] for i in free]
            for k in range(len(free)):
                matrix[k][k] += ridge
            solution = _solve(matrix, rhs)
            if solution is None:
                return
            negative = [free[k] for k, value in enumerate(solution) if value < 0.0]
            if not negative:
                theta = [0.0] * 4
                for k, i in enumerate(free):
                    theta[i] = solution[k]
                self._theta = theta
                return
            free = [i for i in free if i not in negative]
        self._theta = [0.0] * 4


class Arrivals:
    """Arrivals per second (an exponentially decaying count over ``RATE_TIME_CONSTANT_S``) and
    the recent mean length of what arrives."""

    __slots__ = ("_at", "_count", "mean_length")

    def __init__(self) -> None:
        self._count = 0.0
        self._at = 0.0
        self.mean_length = 0.0

    def arrived(self, now: float, length: int = 1) -> None:
        kept = math.exp((self._at - now) / RATE_TIME_CONSTANT_S)
        self._count = self._count * kept + 1.0
        self._at = now
        self.mean_length += (length - self.mean_length) / self._count

    def per_second(self, now: float) -> float:
        decayed = self._count * math.exp((self._at - now) / RATE_TIME_CONSTANT_S)
        return decayed / RATE_TIME_CONSTANT_S


def worth_waiting(cost: CostSurface, rate_per_s: float, size: int, longest: int) -> bool:
    """``--wait-policy adaptive``: whether a batch of ``size`` requests padded to ``longest``,
    about to take the model's last free slot, should wait for the next arrival instead of going
    now.

    Going now, the next request arrives (in 1/rate on average) to a busy model and pays a whole
    call of its own; waiting, the ``size`` requests each wait that gap and the batch grows by one
    row. Summed over the requests, waiting is cheaper exactly when ``(size + 1) x gap + size x
    row < call``: when a call's fixed cost is large and arrivals are dense. Until the cost fit is
    known, this says yes: the batch waits up to max-wait, as under the fixed policy."""
    if not cost.known:
        return True
    if rate_per_s <= 0.0:
        return False
    gap = 1.0 / rate_per_s
    return (size + 1) * gap + size * cost.row_seconds(longest) < cost.terms.call


def hold_pays(
    cost: CostSurface, rate_per_s: float, mean_length: float, size: int, longest: int
) -> float:
    """``--wait-policy auto``: how long a batch of ``size`` requests padded to ``longest``,
    about to take a free model slot, should be held for company: the expected gap to the next
    arrival when the model time that arrival saves by joining (the call it would otherwise make,
    less the padding it adds to this batch) exceeds that gap, the time the slot stands idle;
    0 to send it now. 0 too while the fit is not trusted: a model whose cost cannot be predicted
    gets no waits that rest on a prediction."""
    if not cost.trusted or rate_per_s <= 0.0:
        return 0.0
    gap = 1.0 / rate_per_s
    newcomer = max(1, round(mean_length))
    padded = max(longest, newcomer)
    joined = cost.seconds(size + 1, padded) - cost.seconds(size, longest)
    saved = cost.seconds(1, newcomer) - joined
    return gap if saved > gap else 0.0

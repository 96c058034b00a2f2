"""Request lengths drawn from a chosen distribution, the payloads that carry them, and the demo
model's limit under them.

A length is what the sidecar and the demo model count: whitespace tokens of a string payload. The
spec strings are what ``--lengths`` takes:

``fixed:N``                   every request N tokens
``uniform:LO,HI``             integers LO..HI, both included
``lognormal:MU,SIGMA[,MAX]``  round(exp(N(MU, SIGMA))), at least 1, at most MAX when given
``bimodal:SHORT,LONG,P``      LONG with probability P, else SHORT
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

Kind = Literal["fixed", "uniform", "lognormal", "bimodal"]
ARITY: dict[str, tuple[int, int]] = {
    "fixed": (1, 1),
    "uniform": (2, 2),
    "lognormal": (2, 3),
    "bimodal": (3, 3),
}


@dataclass(frozen=True)
class Lengths:
    """A length distribution; ``spec`` round-trips through :func:`parse`."""

    kind: Kind
    params: tuple[float, ...]

    @property
    def spec(self) -> str:
        return f"{self.kind}:" + ",".join(f"{p:g}" for p in self.params)

    def draw(self, rng: random.Random) -> int:
        p = self.params
        match self.kind:
            case "fixed":
                return int(p[0])
            case "uniform":
                return rng.randint(int(p[0]), int(p[1]))
            case "lognormal":
                n = max(1, round(math.exp(rng.gauss(p[0], p[1]))))
                return min(n, int(p[2])) if len(p) == 3 else n
            case "bimodal":
                return int(p[1]) if rng.random() < p[2] else int(p[0])

    def sample(self, n: int, seed: int = 1) -> list[int]:
        """``n`` lengths from a generator seeded with ``seed``: the same seed, the same lengths."""
        rng = random.Random(seed)
        return [self.draw(rng) for _ in range(n)]


def parse(spec: str) -> Lengths:
    """``"lognormal:3,0.7"`` -> Lengths; ValueError with the reason for anything else."""
    kind, _, rest = spec.partition(":")
    if kind not in ARITY:
        raise ValueError(f"unknown length distribution {kind!r}: use one of {', '.join(ARITY)}")
    try:
        params = tuple(float(x) for x in rest.split(",")) if rest else ()
    except ValueError:
        raise ValueError(f"{spec!r}: parameters must be numbers") from None
    low, high = ARITY[kind]
    if not low <= len(params) <= high:
        raise ValueError(
            f"{spec!r}: {kind} takes {low if low == high else f'{low} or {high}'} parameters"
        )
    lengths = Lengths(cast(Kind, kind), params)
    _check(lengths)
    return lengths


def _check(lengths: Lengths) -> None:
    p, spec = lengths.params, lengths.spec
    integers = {"fixed": p, "uniform": p, "lognormal": p[2:], "bimodal": p[:2]}[lengths.kind]
    if any(x != int(x) or x < 1 for x in integers):
        raise ValueError(f"{spec!r}: lengths must be whole numbers of at least 1")
    if lengths.kind == "uniform" and p[0] > p[1]:
        raise ValueError(f"{spec!r}: LO must not exceed HI")
    if lengths.kind == "lognormal" and p[1] < 0:
        raise ValueError(f"{spec!r}: SIGMA must not be negative")
    if lengths.kind == "bimodal" and not 0 <= p[2] <= 1:
        raise ValueError(f"{spec!r}: P must be between 0 and 1")


def payload(length: int) -> str:
    """A string payload of ``length`` whitespace-separated tokens."""
    return " ".join(["x"] * length)


@dataclass(frozen=True)
class CostModel:
    """The demo model's cost: ``fixed_ms + per_token_ms x batch size x longest length`` per batch,
    with ``parallel`` batches at a time."""

    fixed_ms: float
    per_token_ms: float
    parallel: int = 1

    def batch_ms(self, lengths: list[int]) -> float:
        return self.fixed_ms + self.per_token_ms * len(lengths) * max(lengths, default=0)

    def expected_batch_ms(
        self, draw: Callable[[random.Random], int], size: int, trials: int, seed: int
    ) -> float:
        """Monte Carlo mean cost of a batch of ``size`` lengths, each from ``draw``."""
        rng = random.Random(seed)
        total = sum(self.batch_ms([draw(rng) for _ in range(size)]) for _ in range(trials))
        return total / trials

    def limit_rps(
        self,
        lengths: Lengths | Sequence[int],
        max_batch: int,
        *,
        trials: int = 20_000,
        seed: int = 1,
    ) -> float:
        """Requests per second the model serves when every batch holds ``max_batch`` requests:
        parallel x max_batch / E[cost of such a batch], its lengths drawn from the distribution
        ``lengths``, or from a finite sample of lengths (such as the bodies a benchmark sends)."""
        if isinstance(lengths, Lengths):
            draw = lengths.draw
        else:
            sample = list(lengths)

            def draw(rng: random.Random) -> int:
                return rng.choice(sample)

        mean_ms = self.expected_batch_ms(draw, max_batch, trials, seed)
        return self.parallel * max_batch / (mean_ms / 1000)

"""Request lengths drawn from a chosen distribution, the payloads that carry them, and the demo
model's limit under them.

A length is what the sidecar and the demo model count: whitespace tokens of a string payload. The
spec strings are what ``--lengths`` takes:

``fixed:N``                   every request N tokens
``uniform:LO,HI``             integers LO..HI, both included
``lognormal:MU,SIGMA[,MAX]``  round(exp(N(MU, SIGMA))), at least 1, at most MAX when given
``bimodal:SHORT,LONG,P``      LONG with probability P, else SHORT
``bimodal:SLO,SHI,LLO,LHI,P`` with probability P uniform in LLO..LHI, else uniform in SLO..SHI

Two named presets stand for the distributions ``make bench`` compares (:data:`PRESETS`):

``lognormal`` = ``lognormal:3,0.7``: median 20 tokens, mean 26, 1% above 100; one broad mode,
  the shape of most text workloads' request lengths.
``bimodal`` = ``bimodal:8,16,100,200,0.2``: 80% short requests of 8 to 16 tokens (queries, titles,
  single sentences) and 20% long ones of 100 to 200 tokens (paragraphs, whole documents): traffic
  that mixes two kinds of input on one model. Mean 40 tokens, median 13. It is the case padding
  punishes most: a first-in-first-out batch of 32 holds a long request with probability
  1 - 0.8^32 = 99.9%, so nearly every batch pads its short rows to 100-200 tokens, while batches of
  similar lengths would not. Each mode is a range, not one value, so that even a batch of one kind
  pads a little (a 10-token request beside a 16-token one), as real inputs do.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

Kind = Literal["fixed", "uniform", "lognormal", "bimodal"]
ARITY: dict[str, tuple[int, ...]] = {
    "fixed": (1,),
    "uniform": (2,),
    "lognormal": (2, 3),
    "bimodal": (3, 5),
}
"""How many parameters each kind takes."""
PRESETS: dict[str, str] = {
    "lognormal": "lognormal:3,0.7",
    "bimodal": "bimodal:8,16,100,200,0.2",
}
"""Named distributions (see the module's docstring): what ``make bench`` compares."""


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
            case "bimodal" if len(p) == 3:
                return int(p[1]) if rng.random() < p[2] else int(p[0])
            case "bimodal":
                long = rng.random() < p[4]
                return (
                    rng.randint(int(p[2]), int(p[3])) if long else rng.randint(int(p[0]), int(p[1]))
                )

    def sample(self, n: int, seed: int = 1) -> list[int]:
        """``n`` lengths from a generator seeded with ``seed``: the same seed, the same lengths."""
        rng = random.Random(seed)
        return [self.draw(rng) for _ in range(n)]


def parse(spec: str) -> Lengths:
    """``"lognormal:3,0.7"`` (or a preset's name, ``"lognormal"``) -> Lengths; ValueError with
    the reason for anything else."""
    spec = PRESETS.get(spec, spec)
    kind, _, rest = spec.partition(":")
    if kind not in ARITY:
        raise ValueError(f"unknown length distribution {kind!r}: use one of {', '.join(ARITY)}")
    try:
        params = tuple(float(x) for x in rest.split(",")) if rest else ()
    except ValueError:
        raise ValueError(f"{spec!r}: parameters must be numbers") from None
    if len(params) not in ARITY[kind]:
        counts = " or ".join(str(n) for n in ARITY[kind])
        raise ValueError(f"{spec!r}: {kind} takes {counts} parameters")
    lengths = Lengths(cast(Kind, kind), params)
    _check(lengths)
    return lengths


def _check(lengths: Lengths) -> None:
    p, spec = lengths.params, lengths.spec
    integers = {"fixed": p, "uniform": p, "lognormal": p[2:], "bimodal": p[:-1]}[lengths.kind]
    if any(x != int(x) or x < 1 for x in integers):
        raise ValueError(f"{spec!r}: lengths must be whole numbers of at least 1")
    if lengths.kind == "uniform" and p[0] > p[1]:
        raise ValueError(f"{spec!r}: LO must not exceed HI")
    if lengths.kind == "lognormal" and p[1] < 0:
        raise ValueError(f"{spec!r}: SIGMA must not be negative")
    if lengths.kind == "bimodal" and not 0 <= p[-1] <= 1:
        raise ValueError(f"{spec!r}: P must be between 0 and 1")
    if lengths.kind == "bimodal" and len(p) == 5 and (p[0] > p[1] or p[2] > p[3]):
        raise ValueError(f"{spec!r}: each mode's LO must not exceed its HI")


def parse_list(text: str) -> list[Lengths]:
    """Several distributions, comma-separated: ``"lognormal,bimodal"``, or full specs, whose own
    commas are told apart because a distribution starts with a letter and a parameter does not
    (``"lognormal:3,0.7,bimodal:8,128,0.1"`` is two). ValueError as :func:`parse`, or when empty."""
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part[:1].isalpha() or not specs:
            specs.append(part)
        else:
            specs[-1] += "," + part
    found = [parse(spec) for spec in specs if spec]
    if not found:
        raise ValueError("no length distribution given")
    return found


def name(lengths: Lengths) -> str:
    """The preset's name when ``lengths`` is one, else its spec: how reports label it."""
    return next((n for n, spec in PRESETS.items() if parse(spec) == lengths), lengths.spec)


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

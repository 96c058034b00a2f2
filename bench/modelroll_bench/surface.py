"""A model's cost as a surface: the seconds one call takes for a batch of ``size`` requests padded
to ``longest`` tokens, ``call + size x (row + token x longest + token_squared x longest^2)``: a
fixed part per call (large on a GPU, with the HTTP round trip), a part per row, a part per padded
token, and attention's part, which grows with the square of the length.

The surface of the real encoder is measured straight at its ``POST /v1/batch`` (HTTP included, as
the sidecar sees a call) over a grid of batch sizes and lengths, every input of a batch as long
as the others, lengths counted in the encoder's own tokens as the sidecar's ``--length-from
tokenizer`` counts them, and fitted by non-negative least squares in relative error, so that a
lone short sentence is fitted as well as a full batch of long ones.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import numpy as np

from modelroll_models.batch_cost import sentence_of
from modelroll_models.encoder import make_tokenizer
from modelroll_models.model_files import default_zip_path, read_folder
from modelroll_sidecar.lengths import TOKENIZER_PATH, TokenLengths

from .runs import Workload, machine, sequential_ms
from .systems import encoder_model

SIZES = (1, 2, 4, 8, 16, 32)
"""Batch sizes measured: up to the encoder's default batch limit."""
LENGTHS = (8, 16, 32, 64, 128, 256)
"""Lengths measured, in the encoder's tokens ([CLS] and [SEP] included); 256 is where it
truncates."""
REPEATS = 5
"""Calls per shape; the median counts."""


@dataclass(frozen=True)
class Surface:
    """The cost terms, in seconds: per call, per row, per padded token, per squared token."""

    call: float
    row: float = 0.0
    token: float = 0.0
    token_squared: float = 0.0

    def seconds(self, size: int, longest: int) -> float:
        """One call's duration for ``size`` requests padded to ``longest``."""
        per_row = self.row + self.token * longest + self.token_squared * longest * longest
        return self.call + size * per_row

    def describe(self) -> str:
        return (
            f"{self.call * 1000:.3f} ms per call + size x ({self.row * 1000:.3f} ms + "
            f"{self.token * 1e6:.2f} us x longest + {self.token_squared * 1e9:.2f} ns x longest^2)"
        )

    @classmethod
    def load(cls, path: Path) -> Surface:
        """The surface a measurement saved (:func:`save`), or a file of just its terms. Raises
        ValueError with the reason when the file holds no surface."""
        try:
            found = json.loads(path.read_text())
            terms = found.get("terms", found)
            return cls(**{name: float(terms[name]) for name in TERMS})
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(
                f"{path} holds no cost surface ({type(exc).__name__}: {exc})"
            ) from None


TERMS = ("call", "row", "token", "token_squared")


class Point(NamedTuple):
    """One measured shape: its batch size, its length and a call's median seconds."""

    size: int
    longest: int
    seconds: float


def features(size: int, longest: int) -> tuple[float, float, float, float]:
    """What each term is multiplied by in :meth:`Surface.seconds`."""
    return (1.0, float(size), float(size * longest), float(size * longest * longest))


def fit(points: Sequence[Point]) -> Surface:
    """The surface with non-negative terms that fits ``points`` with the least squared relative
    error: the exact non-negative least squares of four terms, found by solving on every subset
    of them and keeping the best solution whose terms are all at least 0."""
    if not points:
        raise ValueError("no measured points to fit")
    x = np.array([features(p.size, p.longest) for p in points]) / np.array(
        [[p.seconds] for p in points]
    )
    y = np.ones(len(points))
    best: tuple[float, np.ndarray] | None = None
    for count in range(1, len(TERMS) + 1):
        for kept in itertools.combinations(range(len(TERMS)), count):
            solution, *_ = np.linalg.lstsq(x[:, kept], y, rcond=None)
            if (solution < 0).any():
                continue
            terms = np.zeros(len(TERMS))
            terms[list(kept)] = solution
            error = float(((x @ terms - y) ** 2).sum())
            if best is None or error < best[0]:
                best = (error, terms)
    assert best is not None  # the call term alone fits a non-negative mean
    return Surface(*(float(t) for t in best[1]))


def relative_errors(surface: Surface, points: Sequence[Point]) -> list[float]:
    """(fitted - measured) / measured for each point."""
    return [surface.seconds(p.size, p.longest) / p.seconds - 1 for p in points]


async def tokenizer_of(model_url: str) -> TokenLengths:
    """The sidecar's ``--length-from tokenizer`` counter, from the model's own tokenizer."""
    async with aiohttp.ClientSession() as http, http.get(model_url + TOKENIZER_PATH) as resp:
        resp.raise_for_status()
        return TokenLengths(await resp.text())


def text_of(tokens: TokenLengths, length: int) -> str:
    """A sentence of ``length`` tokens under ``tokens`` (the longest such one, when no sentence
    of common words has exactly that many)."""
    words = max(1, length)
    while words > 1 and tokens(sentence_of(words)) > length:
        words -= 1
    return sentence_of(words)


async def measure(
    model_url: str,
    sizes: Sequence[int] = SIZES,
    lengths: Sequence[int] = LENGTHS,
    repeats: int = REPEATS,
) -> list[Point]:
    """The median duration, HTTP included, of ``repeats`` calls of each shape (after one that is
    not counted), straight to the model's ``POST /v1/batch``."""
    tokens = await tokenizer_of(model_url)
    points = []
    for length in lengths:
        text = text_of(tokens, length)
        counted = tokens(text)
        for size in sizes:
            body = {"inputs": [text] * size}
            ms = await sequential_ms(model_url + "/v1/batch", body, calls=repeats, warmup=1)
            points.append(Point(size, counted, ms / 1000))
            print(f"  batch {size:3} x {counted:3} tokens: {ms:8.2f} ms", flush=True)
    return points


def report(surface: Surface, points: Sequence[Point], model: str) -> dict[str, Any]:
    """What ``--measure`` saves: the terms (what :meth:`Surface.load` reads), the model, the
    machine, every point and how far the fit is from it."""
    errors = relative_errors(surface, points)
    return {
        "terms": asdict(surface),
        "unit": "seconds per call; lengths in the model's tokens",
        "model": model,
        "machine": machine(),
        "points": [list(p) for p in points],
        "relative_error": {
            "median_abs": round(float(np.median(np.abs(errors))), 4),
            "max_abs": round(float(np.max(np.abs(errors))), 4),
        },
    }


def sentence_tokens(workload: Workload, tokens: TokenLengths) -> list[int]:
    """The length in tokens of each body ``workload`` sends (English sentences of its lengths
    in words), as the sidecar counts them with ``--length-from tokenizer``."""
    return [tokens(payload) for payload in workload.payloads()]


def local_tokenizer() -> TokenLengths:
    """The encoder's tokenizer as it serves it at ``GET /v1/tokenizer``, read from the
    installed model files without loading the model."""
    return TokenLengths(make_tokenizer(read_folder(default_zip_path())).to_str())


async def measure_encoder(variant: str, intra_op_threads: int, repeats: int) -> dict[str, Any]:
    """Start ``modelroll-encoder``, measure its surface and fit it: :func:`report`'s dict."""
    async with encoder_model(variant, intra_op_threads) as url:
        await sequential_ms(url + "/v1/batch", {"inputs": [sentence_of(20)] * 8}, calls=1)
        points = await measure(url, repeats=repeats)
    found = fit(points)
    name = f"all-MiniLM-L6-v2 {variant} (modelroll-encoder), {intra_op_threads} intra-op thread(s)"
    return report(found, points, name)

"""``python -m modelroll_models.batch_cost``: each variant's time per batch, encoding included
and HTTP excluded, for batches of typical sentences (about 15 words, 20 tokens with [CLS] and
[SEP]). Prints one row per variant, thread count and batch size: the medians over the repeats
of the wall-clock time and of the process's CPU time (all its threads).

``--fit`` measures a grid of batch sizes and sentence lengths instead (every sentence of a batch
as long as the others, so nothing is padding) and fits ``fixed + per_token x padded tokens`` to
the medians by least squares, in WordPiece tokens and in whitespace words: the cost model of
``modelroll-demo-model`` (``--fixed-ms``, ``--per-token-ms``, which counts words), so a
stand-in can be given the real model's cost.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .encoder import VARIANTS, EncoderFiles, load_encoder
from .model_files import default_onnx_path, default_zip_path

SENTENCES = (
    "The new release cut the median response time of the search page by a third.",
    "A man is riding a horse along the beach while the sun sets behind him.",
    "Please remind me to call the plumber about the leaking kitchen tap tomorrow morning.",
    "The committee postponed its decision on the budget until the next quarterly meeting.",
    "Heavy rain flooded several streets in the old town and closed two bridges.",
    "She finally finished the novel she had been writing for almost ten years.",
    "Our team moved the nightly batch jobs to a cheaper cluster without any downtime.",
    "The recipe calls for two cups of flour, a pinch of salt and fresh butter.",
)


def batch(size: int) -> list[str]:
    return [SENTENCES[i % len(SENTENCES)] for i in range(size)]


def measure(variant: str, threads: int, sizes: Sequence[int], repeats: int) -> None:
    files = EncoderFiles(default_zip_path(), default_onnx_path())
    encoder = load_encoder(variant, files, threads)
    for size in sizes:
        texts = batch(size)
        tokens = encoder.tokenize(texts)
        encoder.encode(texts)  # warm-up
        wall, cpu = [], []
        for _ in range(repeats):
            started, started_cpu = time.perf_counter(), time.process_time()
            encoder.encode(texts)
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        median_ms = statistics.median(wall) * 1000
        print(
            f"{variant:5} threads={threads} batch={size:3} tokens={tokens.padded:5}"
            f"  {median_ms:8.2f} ms/batch  {median_ms / size:7.2f} ms/item"
            f"  {statistics.median(cpu) * 1000:8.2f} ms CPU/batch"
        )


FIT_SIZES = (1, 2, 4, 8, 16, 32)
FIT_WORDS = (4, 8, 16, 32)
FILLER = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "near",
    "our",
    "quiet",
    "river",
    "bank",
    "at",
    "dawn",
    "today",
    "while",
    "seven",
    "tired",
    "people",
    "count",
    "their",
    "steps",
    "along",
    "an",
    "old",
    "stone",
    "path",
)


def sentence_of(words: int) -> str:
    """A sentence of exactly ``words`` common English words (each one WordPiece token)."""
    return " ".join(FILLER[i % len(FILLER)] for i in range(words)).capitalize() + "."


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """``(intercept, slope, r2)`` of the least-squares line through the points."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    total = sum((y - mean_y) ** 2 for y in ys)
    return intercept, slope, 1 - residual / total if total else 1.0


@dataclass(frozen=True)
class Line:
    """``fixed_ms + per_ms x padded units`` and how well it fits (R^2)."""

    fixed_ms: float
    per_ms: float
    r2: float


@dataclass(frozen=True)
class Fit:
    """The cost line of one variant, per WordPiece token and per whitespace word."""

    per_token: Line
    per_word: Line

    def stand_in_flags(self) -> list[str]:
        """``modelroll-demo-model``'s flags for this cost (it counts whitespace words)."""
        line = self.per_word
        return ["--fixed-ms", f"{line.fixed_ms:.2f}", "--per-token-ms", f"{line.per_ms:.4f}"]


def fit(variant: str, threads: int, repeats: int) -> Fit:
    """Measure the grid of batch shapes and fit the cost lines to the medians."""
    files = EncoderFiles(default_zip_path(), default_onnx_path())
    encoder = load_encoder(variant, files, threads)
    tokens, words, ms = [], [], []
    for length in FIT_WORDS:
        for size in FIT_SIZES:
            texts = [sentence_of(length)] * size
            encoder.encode(texts)  # warm-up
            wall = []
            for _ in range(repeats):
                started = time.perf_counter()
                encoder.encode(texts)
                wall.append(time.perf_counter() - started)
            tokens.append(encoder.tokenize(texts).padded)
            words.append(size * length)
            ms.append(statistics.median(wall) * 1000)
    return Fit(Line(*least_squares(tokens, ms)), Line(*least_squares(words, ms)))


def print_fit(variant: str, threads: int, found: Fit) -> None:
    shapes = f"{len(FIT_SIZES) * len(FIT_WORDS)} batch shapes"
    for unit, line in (("token", found.per_token), ("word", found.per_word)):
        print(
            f"{variant:5} threads={threads} per {unit:5}: {line.fixed_ms:6.2f} ms + "
            f"{line.per_ms:.4f} ms x padded {unit}s (R^2 {line.r2:.3f}, {shapes}, sizes "
            f"{FIT_SIZES[0]}-{FIT_SIZES[-1]}, {FIT_WORDS[0]}-{FIT_WORDS[-1]} words)"
        )
    print(f"  as a stand-in: modelroll-demo-model {' '.join(found.stand_in_flags())}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m modelroll_models.batch_cost")
    parser.add_argument("--variant", choices=VARIANTS, action="append")
    parser.add_argument("--threads", type=int, action="append", help="intra-op threads (int8)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--fit", action="store_true", help="fit fixed + per-token cost over a grid of shapes"
    )
    args = parser.parse_args(argv)
    for variant in args.variant or VARIANTS:
        for threads in args.threads or [1]:
            if args.fit:
                print_fit(variant, threads, fit(variant, threads, args.repeats))
            else:
                measure(variant, threads, args.sizes, args.repeats)


if __name__ == "__main__":
    main()
